"""The fleet in virtual time: the router's policies (their rules from the vLLM Router's source), the fleet's
event loop (routing, failures, cold starts, the autoscaler) and the export a platform team deploys."""

from __future__ import annotations

import math

import pytest
import yaml

from tuner.errors import UserError
from tuner.fleet import policies
from tuner.fleet.load import arrivals, fleet_requests
from tuner.fleet.measure import FleetSetup, broken_seconds, broken_windows, check, run_fleet
from tuner.fleet.policies import RouteKey
from tuner.fleet.sim import DOWN, Autoscaler
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.slo import SLO
from tuner.workload.synth import synthesize


def key(hashes=(), n=100, session=None, index=0):
    return RouteKey(hashes=tuple(hashes), prompt_tokens=n, block_tokens=16, session=session, index=index)


def test_registry_names_and_bad_name():
    assert set(policies.names()) == {"round_robin", "random", "power_of_two", "consistent_hash", "cache_aware"}
    with pytest.raises(UserError, match="unknown routing policy 'least_busy'"):
        policies.create("least_busy")


def test_a_policy_without_select_cannot_be_created():
    """`select` is the registry's abstract method: a policy class lacking it fails when it is made."""
    class NoSelect(policies.RoutingPolicy):
        pass

    with pytest.raises(TypeError, match="select"):
        NoSelect()
    with pytest.raises(TypeError, match="select"):
        policies.RoutingPolicy()
    assert all(not getattr(type(policies.create(n)), "__abstractmethods__") for n in policies.names())


def test_round_robin_cycles_over_healthy():
    p = policies.create("round_robin")
    assert [p.select(key(), [0, 1, 2], {}) for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_power_of_two_takes_the_less_loaded_of_two():
    p = policies.create("power_of_two", seed=3)
    picks = [p.select(key(), [0, 1], {0: 10, 1: 2}) for _ in range(50)]
    assert set(picks) == {1}  # with two workers the pair is always both: the lighter wins
    picks = [p.select(key(), [0, 1, 2], {0: 0, 1: 5, 2: 9}) for _ in range(300)]
    assert picks.count(2) == 0 and picks.count(0) > picks.count(1)


def test_consistent_hash_is_sticky_and_moves_only_a_removed_workers_keys():
    p = policies.create("consistent_hash")
    before = {s: p.select(key(session=f"user-{s}"), [0, 1, 2, 3], {}) for s in range(400)}
    assert all(p.select(key(session=f"user-{s}"), [0, 1, 2, 3], {}) == w for s, w in before.items())
    assert len(set(before.values())) == 4
    after = {s: p.select(key(session=f"user-{s}"), [0, 1, 3], {}) for s in range(400)}
    moved = [s for s in before if before[s] != after[s]]
    assert moved and all(before[s] == 2 for s in moved)


def test_consistent_hash_sends_a_dead_workers_sessions_to_the_first_healthy_one():
    """consistent_hash.rs: the ring keeps an unhealthy worker (still listed); its keys go to the first
    healthy worker, not to the next on the ring."""
    p = policies.create("consistent_hash")
    listed = {0: 0, 1: 0, 2: 0, 3: 0}
    before = {s: p.select(key(session=f"user-{s}"), [0, 1, 2, 3], listed) for s in range(400)}
    after = {s: p.select(key(session=f"user-{s}"), [1, 2, 3], listed) for s in range(400)}
    assert all(after[s] == (1 if before[s] == 0 else before[s]) for s in before)


def test_cache_aware_affinity_threshold_and_imbalance():
    p = policies.create("cache_aware")
    shared = list(range(10))
    assert p.select(key(shared + [100], n=176), [0, 1], {0: 0, 1: 0}) == 0  # empty tree: least loaded (first)
    # 10 of 11 blocks match > 0.3: the worker that holds them, even when it is busier (within the thresholds)
    assert p.select(key(shared + [200], n=176), [0, 1], {0: 30, 1: 0}) == 0
    # a match of 1 block in 11 (< 0.3): the least loaded
    assert p.select(key([0, 300, 301, 302, 303, 304], n=96), [0, 1], {0: 5, 1: 1}) == 1
    # imbalanced (max - min > 64 and max > 1.5 min): the least loaded whatever the cache says
    assert p.select(key(shared + [400], n=176), [0, 1], {0: 100, 1: 10}) == 1
    assert p.decisions == {"load_imbalance": 1, "prefix_hit": 1, "prefix_miss": 2}


def test_cache_aware_threshold_is_strict_and_the_least_loaded_deepest_holder_wins():
    """The rules measured on vllm-router 0.1.17 with stub workers (tuner.fleet.policies): 3 of 10 matched
    misses, 4 of 10 hits; of the workers holding the deepest match, the least loaded (equal loads: the
    one sent it last); a shallower holder does not count."""
    p = policies.create("cache_aware")
    assert p.select(key(list(range(10)), n=160), [0, 1], {0: 0, 1: 0}) == 0
    assert p.select(key([0, 1, 2, 30, 40, 50, 60, 70, 80, 90], n=160), [0, 1], {0: 1, 1: 0}) == 1  # 0.3: miss
    assert p.select(key([0, 1, 2, 3, 41, 51, 61, 71, 81, 91], n=160), [0, 1], {0: 1, 1: 0}) == 0  # 0.4: hit
    # blocks 0-1 and a long tail (2 of 12 < 0.3): a miss, to the least loaded, which now holds 0-1 too
    assert p.select(key([0, 1] + list(range(500, 510)), n=192), [0, 1], {0: 1, 1: 0}) == 1
    assert p.select(key([0, 1, 700], n=48), [0, 1], {0: 0, 1: 0}) == 1  # both hold 0-1, equally loaded: the last sent
    assert p.select(key([0, 1, 701], n=48), [0, 1], {0: 0, 1: 3}) == 0  # ... the less loaded, though sent it earlier
    # worker 1 alone holds 0-1-60-61-62 (deepest), worker 0 holds 0-1 (2 of 6, above the threshold) and is
    # idle: still 1
    assert p.select(key([0, 1, 60, 61, 62] + list(range(800, 830)), n=560), [0, 1], {0: 1, 1: 0}) == 1  # a miss
    assert p.select(key([0, 1, 60, 61, 62, 900], n=96), [0, 1], {0: 0, 1: 5}) == 1


@pytest.fixture(scope="module")
def setup():
    cfg = resolve(get_gpu("rtx4090"), get_model("qwen2.5-7b"), Knobs())
    slo = SLO.model_validate({"ttft": {"max_ms": 300, "percentile": 99}, "tpot": {"max_ms": 50, "percentile": 99},
                              "target": 0.99, "peak_rate": 6})
    return FleetSetup(cfg=cfg, slo=slo, workload=synthesize("chat", 300, seed=1), peak=6.0, seed=1)


def test_arrivals_follow_the_profile():
    t = arrivals([(0.0, 10.0), (50.0, 40.0)], 100.0, seed=2)
    first, second = sum(x < 50 for x in t), sum(x >= 50 for x in t)
    assert 380 < first < 620 and 1700 < second < 2300 and t == sorted(t)
    with pytest.raises(UserError):
        arrivals([(0.0, 0.0)], 10.0)


def test_reused_requests_get_new_unique_blocks_but_keep_shared_ones():
    wl = synthesize("chat", 5, seed=1)
    reqs = fleet_requests(wl, [float(i) for i in range(10)], seed=0)
    a, b = reqs[0].key.hashes, reqs[5].key.hashes  # two uses, maybe of different requests
    uses = {}
    for r in reqs:
        uses.setdefault(r.output_len, []).append(r.key.hashes)
    again = next(v for v in uses.values() if len(v) > 1)
    assert again[0] != again[1]  # the same request used twice: its own blocks differ
    assert a[0] == b[0] or not (a and b)  # the system prompt's first block is shared


def test_round_robin_fleet_serves_the_peak_and_spreads_evenly(setup):
    run = run_fleet(setup, 2, "round_robin", [(0.0, 6.0)], 60.0)
    c = check(setup, run, 2, "round_robin", 6.0)
    assert c.meets and c.errors == 0
    assert abs(c.per_replica[0].share - 0.5) < 0.02
    assert all(r.prefix_hit_rate and r.prefix_hit_rate > 0.2 for r in c.per_replica)  # the system prompt hits


def test_too_few_replicas_break_the_slo(setup):
    run = run_fleet(setup, 1, "round_robin", [(0.0, 12.0)], 60.0)
    assert not check(setup, run, 1, "round_robin", 12.0).meets


def test_a_failed_replica_fails_its_requests_and_the_rest_are_served_elsewhere(setup):
    run = run_fleet(setup, 3, "round_robin", [(0.0, 6.0)], 60.0, fail_at=30.0)
    down = [r for r in run.records if r.error == DOWN]
    assert down and all(r.scheduled_s <= 30.0 for r in down)
    dead = next(r.id for r in run.replicas if r.state == "dead")
    later = [i for i, r in enumerate(run.records) if r.scheduled_s > 30.5]
    assert later and all(run.replica_of[i] != dead and run.records[i].error is None for i in later)


def test_cold_start_replacement_serves_after_its_launch(setup):
    run = run_fleet(setup, 2, "round_robin", [(0.0, 6.0)], 80.0, fail_at=20.0, relaunch=True, cold_start_s=30.0)
    new = run.replicas[-1]
    assert len(run.replicas) == 3 and math.isclose(new.ready_at, 50.0)
    firsts = [r.scheduled_s for i, r in enumerate(run.records) if run.replica_of[i] == new.id]
    assert firsts and min(firsts) >= 50.0


def test_autoscaler_scales_up_on_the_waiting_queue_and_drains_down(setup):
    scaler = Autoscaler(threshold=2.0, min_replicas=1, max_replicas=4, tick_s=10.0, cooldown_s=40.0)
    profile = [(0.0, 3.0), (30.0, 14.0), (90.0, 3.0)]
    run = run_fleet(setup, 1, "round_robin", profile, 240.0, cold_start_s=10.0, autoscaler=scaler)
    ups = [e for e in run.scale_events if e[1] == "up"]
    downs = [e for e in run.scale_events if e[1] == "down"]
    assert ups and ups[0][0] >= 30.0 and downs and downs[0][0] > ups[-1][0]
    drained = [r for r in run.replicas if r.stopped_at is not None and r.state == "stopped"]
    assert drained  # scaled-down replicas stopped only when their requests ended: none failed
    assert not any(r.error == DOWN for r in run.records)
    windows = broken_windows(setup, run)
    assert broken_seconds(windows, 0.99) > 0  # the surge outran the cold start for a while


def test_export_carries_n_args_policy_and_threshold(tmp_path):
    from tuner.fleet.export import STACK_ROUTING, write_export
    from tuner.fleet.verify import FleetVerification, PolicyResult

    v = FleetVerification(run_dir="r", peak=50, target=0.99, plan_n=17, plan_spare=1,
                          policies=[PolicyResult(policy="round_robin", verified_n=7)], cold_start_s=60,
                          cold_start_source="given", threshold=5.0, model="Qwen/Qwen2.5-7B-Instruct",
                          knobs={"max_num_seqs": 512, "enable_prefix_caching": True}, tp=1)
    files = write_export(v, tmp_path)
    values = yaml.safe_load((tmp_path / "values.yaml").read_text())
    spec = values["servingEngineSpec"]["modelSpec"][0]
    assert spec["replicaCount"] == 8 and "--max-num-seqs" in " ".join(spec["vllmConfig"]["extraArgs"])
    assert values["routerSpec"]["routingLogic"] in {"roundrobin", "session", "prefixaware", "kvaware"}
    trig = spec["keda"]["triggers"][0]["metadata"]
    assert trig["threshold"] == "5" and trig["query"].startswith("sum(vllm:num_requests_waiting")
    so = yaml.safe_load((tmp_path / "scaledobject.yaml").read_text())
    assert so["kind"] == "ScaledObject" and so["spec"]["minReplicaCount"] == 8
    assert "--policy round_robin" in (tmp_path / "router.txt").read_text() and len(files) == 3
    assert "--enable-scale-out" not in spec["vllmConfig"]["extraArgs"]
    assert STACK_ROUTING["cache_aware"] == "prefixaware"
    # cache_aware: the engines open the render endpoints the vLLM Router reads token ids from
    v.policies = [PolicyResult(policy="cache_aware", verified_n=7)]
    write_export(v, tmp_path / "ca")
    spec = yaml.safe_load((tmp_path / "ca" / "values.yaml").read_text())["servingEngineSpec"]["modelSpec"][0]
    assert "--enable-scale-out" in spec["vllmConfig"]["extraArgs"]
    assert "--enable-scale-out" in (tmp_path / "ca" / "router.txt").read_text()


def test_the_verified_n_is_compared_with_the_plan_at_the_peak_not_with_its_headroom():
    from tuner.fleet.render import lines
    from tuner.fleet.verify import FleetVerification, PolicyResult

    v = FleetVerification(run_dir="r", peak=50, target=0.99, plan_n=11, plan_spare=1, plan_at_peak=8,
                          plan_headroom=0.7, cold_start_s=0, cold_start_source="given",
                          policies=[PolicyResult(policy="round_robin", verified_n=7),
                                    PolicyResult(policy="random", verified_n=10)])
    text = "\n".join(lines(v))
    assert "round_robin: plan N at the peak = 8 (arithmetic, no headroom; the plan's 11 adds its 0.7 headroom), " \
           "verified N = 7: agrees with the plan within one replica" in text
    assert "random: plan N at the peak = 8" in text and "verified N = 10: 2 more than the plan's arithmetic" in text


def test_an_autoscaling_threshold_is_called_validated_only_when_its_scenario_kept_the_slo() -> None:
    """The threshold is the best of those tried; where even it left the SLO broken for 250 s, the
    verification says so instead of "validated"."""
    from tuner.fleet.render import threshold_line
    from tuner.fleet.verify import FleetVerification, Scenario

    def ver(broken: float) -> FleetVerification:
        sc = Scenario(name="autoscale", what="from 2 replicas", policy="round_robin", replicas_start=2,
                      attainment=0.8, p99_ttft_ms=900.0, broken_s=broken, replica_seconds=3600.0, max_replicas=6,
                      threshold=5.0)
        return FleetVerification(run_dir="r", peak=10.0, target=0.99, plan_n=4, plan_spare=1, policies=[],
                                 scenarios=[sc], cold_start_s=30.0, cold_start_source="measured", threshold=5.0)
    assert threshold_line(ver(0.0)).startswith("autoscaling threshold validated: 5 ")
    bad = threshold_line(ver(250.0))
    assert "NOT validated" in bad and "250 s" in bad and "threshold validated" not in bad


def test_a_real_router_run_the_model_does_not_reproduce_is_warned_about() -> None:
    from tuner.fleet.compare import Side, disagreements

    def side(att: float, errors: int = 0) -> Side:
        return Side(attainment=att, p99_ttft_ms=100.0, p99_tpot_ms=20.0, errors=errors, served_per_replica=[],
                    hit_rate_per_replica=[])
    assert disagreements(side(0.995), side(1.0), 0.99) == []
    (w,) = disagreements(side(0.81), side(1.0), 0.99)
    assert "verdicts differ" in w and "0.810" in w
    assert "attainment 0.900" in disagreements(side(0.90), side(0.97), 0.5)[0]
    assert "failed 7 requests" in disagreements(side(1.0, errors=7), side(1.0), 0.99)[0]


def test_the_fleet_pages_put_each_policys_lines_and_tables_under_its_heading(tmp_path):
    """fleet.md and fleet.html carry the same sections: per policy its verdict, one replica down and the
    verified N's shares (on the terminal indented under it), the per-N table and the per-replica table;
    the lines that hold whatever the policy come after every policy."""
    from tuner.fleet.measure import FleetCheck, ReplicaStats
    from tuner.fleet.render import lines
    from tuner.fleet.verify import FleetVerification, PolicyResult
    from tuner.report.fleet import write_fleet

    def check(n: int, policy: str) -> FleetCheck:
        reps = [ReplicaStats(replica=i, routed=10, share=1 / n, prefix_hit_rate=None, attainment=1.0,
                             p99_ttft_ms=100.0, p99_tpot_ms=20.0, state="ready") for i in range(n)]
        return FleetCheck(replicas=n, policy=policy, rate=5.0, n=100, attainment=0.995, meets=True,
                          p99_ttft_ms=120.0, p99_tpot_ms=21.0, errors=0, prefix_hit_rate=None,
                          output_tokens_per_s=100.0, per_replica=reps)

    pol = [PolicyResult(policy=p, verified_n=n, checks=[check(n, p)], n_minus_1=check(n - 1, p))
           for p, n in (("round_robin", 3), ("session", 4))]
    v = FleetVerification(run_dir="r", peak=5, target=0.99, plan_n=3, plan_spare=1, cold_start_s=20,
                          cold_start_source="given", policies=pol)
    write_fleet(v, tmp_path)
    md = (tmp_path / "fleet.md").read_text()
    rr, se, tail = (md.index("## Routing policy round_robin"), md.index("## Routing policy session"),
                    md.index("## Spare, scenarios, autoscaling and cost"))
    assert rr < md.index("- round_robin: plan N") < md.index("- one replica down at the peak (N-1 = 2)") \
        < md.index("- at N = 3: ") < md.index("| replica | share |") < se
    assert se < md.index("- one replica down at the peak (N-1 = 3)") < md.index("- at N = 4: ") < tail
    assert md.index("- cold start: 20.0 s (given)") > tail
    page = (tmp_path / "fleet.html").read_text()
    assert "<style>" in page and page.count("<table>") == 4 and page.count("<h2>Routing policy ") == 2
    text = "\n".join(lines(v))
    assert "\n  one replica down at the peak (N-1 = 2)" in text and "\n  at N = 4: " in text


def test_the_timeline_is_readable(monkeypatch):
    """The timeline drawn as the report's charts are: no text over another, no legend over a curve (the
    legend was inside each panel, over the queue and the rate)."""
    from tuner.report.fleet import timeline_svg
    from tuner.fleet.verify import FleetVerification, Scenario
    from tuner.report import plots

    tl = [(float(t), 3 + (t > 60), int(40 < t < 60), max(0, 50 - abs(t - 50)), 3) for t in range(0, 120, 2)]
    scs = [Scenario(name=name, what="the peak doubled for 20 s", policy="round_robin", replicas_start=3,
                    attainment=0.97, p99_ttft_ms=400.0, broken_s=20.0, replica_seconds=400.0, max_replicas=4,
                    windows=[(40.0, 0.5, 30), (50.0, 1.0, 30)], timeline=tl, profile=[(0.0, 5.0), (40.0, 10.0)])
           for name in ("surge", "cold start")]
    v = FleetVerification(run_dir="r", peak=5, target=0.99, plan_n=3, plan_spare=1, cold_start_s=20,
                          cold_start_source="given", policies=[], scenarios=scs)
    monkeypatch.setattr(plots, "PROBLEMS", [])
    assert timeline_svg(v) and plots.PROBLEMS == []
