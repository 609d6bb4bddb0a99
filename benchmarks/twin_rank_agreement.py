"""The twin's ranking (a screen of every configuration, the best few predicted carefully) against the full
ranking (every configuration predicted carefully): does the cheap first pass keep the top?

`tuner.twin.predict.rank_space` screens the whole space (`SCREEN`: 300 requests a run, a 10% bracket, no
re-measurement) and predicts only the best `REFINE` again carefully (`FULL`). The full ranking predicts
every other configuration carefully too, each from its own screened capacity, as the refine does, so the
configurations both predicted carefully carry the same number. For each scenario (benchmarks/_scenarios.py,
the twin at its nominal parameters, as before its first fit) this prints the top-1 and the top-3 of both,
their agreement, and what the twin's top-1 is worth in the full ranking (its careful capacity over the
full ranking's best).

A careful prediction is the highest rate its own knee search happened to visit and pass, and p99 over the
few hundred to a thousand requests of a run moves a few percent from one rate to the next (each rate is its
own arrival schedule): configurations the twin serves identically near the knee end on different capacities
when their searches walk different rates (the rate-inf burst that opens them is `max_num_seqs` deep, so
their starts differ). So, measured with common requests: the full ranking's best rate is run once more on
a fresh twin server of each of the full ranking's top 10 and the twin's top 3 (the careful rules, the same
request sample and seed for each), and the line "at the full best's rate" says which pass there and with
what badness: a twin's top-1 that passes there with the best's very badness is as good as the best, by
every run the twin can make, and the two rankings differ by the searches' paths alone.

How far the full ranking's own top is reproducible (on by default; `--no-resample` skips it): the full ranking again,
every configuration predicted carefully by the same twin with another request sample and arrival times
(the load seed 1, not 0), and its top-3 against the first one's. A top-3 the reference itself does not
reproduce under another sample is the bar the cheap ranking is held to: agreement with the full ranking
beyond the full ranking's agreement with itself would be agreement with one sample's noise.

Run (178 s on two cores, 2026-12-05 18:30, nothing else running):
    python benchmarks/twin_rank_agreement.py [--scenarios ...] [--no-resample]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import load_settings  # noqa: E402
from _scenarios import SCENARIOS  # noqa: E402

from tuner.capacity.knee import KneeSearch  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.twin.engine import TwinEngine  # noqa: E402
from tuner.twin.predict import FULL, twin_load  # noqa: E402
from tuner.twin.twin import Twin  # noqa: E402


SCREENED: dict[str, float] = {}


def _record_screens() -> None:
    """Every screen's capacity, by configuration: the screened ranking `rank_space` hands to its rerank (the
    ranking it returns keeps only the careful number of the configurations it predicted again)."""
    import tuner.twin.predict as pm
    real = pm.rerank

    def spy(params, gpu, model, previous, *a, **kw):
        SCREENED.update({p.key: p.capacity_rps or 0.0 for p in previous.predictions})
        return real(params, gpu, model, previous, *a, **kw)
    pm.rerank = spy


def at_rate(twin: Twin, knobs: Knobs, rate: float) -> str:
    """One careful load run of `knobs` at `rate` (launches' scale) on a fresh twin server, after the knee
    search's own warm-up: every configuration gets the same requests and seed (common random numbers), so
    two that the twin serves alike read the same. "P0.973/1370": passed, badness, requests scored."""
    cs = twin.params.capacity_scale
    engine = TwinEngine.for_slo(twin.gpu, twin.model, twin.params, twin.slo, shapes=twin.shapes, lora=twin.lora)
    with engine.launch(knobs) as server:
        s = KneeSearch(server, twin.workload, twin.judged_slo, twin_load(twin.load, FULL), FULL.knee,
                       max_num_seqs=server.cfg.max_num_seqs).measure_at(rate / cs)
    return f"{'P' if s.passed else 'f'}{s.badness:.3f}/{s.n}" if s.badness is not None else f"{s.verdict}/{s.n}"


def resampled(sc, workload, slo, configs: list[Knobs], seed: int) -> dict[str, float]:
    """Every configuration of `configs` predicted carefully by the nominal twin under the load seed `seed`:
    the full ranking on another request sample (the rate-inf burst opens each careful search where the SLO
    can be missed at all, so the start rate does not matter)."""
    load = dataclasses.replace(load_settings(sc), seed=seed)
    twin = Twin.build(sc.gpu, sc.model, workload, slo, load, seed=0)
    return {k.key(): p.capacity_rps or 0.0 for k, p in zip(configs, twin.predict_many([(k, 1.0) for k in configs]))}


def one(sc, resample: bool = True) -> dict:
    SCREENED.clear()
    workload, slo = sc.workload(), sc.slo()
    twin = Twin.build(sc.gpu, sc.model, workload, slo, load_settings(sc), seed=0)
    choices = {k: list(dict.fromkeys(sc.space.knobs[k].values)) for k in sc.space.knobs}
    t0 = time.perf_counter()
    ranking = twin.rank(choices, lambda k: sc.space.allows(k, {}) is None, extra=[Knobs()])
    rank_s = time.perf_counter() - t0
    screens = dict(SCREENED)
    careful = {p.key: p.capacity_rps or 0.0 for p in ranking.predictions if not p.screened}
    todo = [p for p in ranking.predictions if p.screened]
    t0 = time.perf_counter()
    for p, full in zip(todo, twin.predict_many([(p.config, p.capacity_rps or 1.0) for p in todo])):
        careful[p.key] = full.capacity_rps or 0.0
    full_s = time.perf_counter() - t0
    approx = [p.key for p in ranking.predictions if p.capacity_rps]
    exact = sorted(careful, key=lambda k: -careful[k])
    screen_order = sorted((p for p in ranking.predictions if p.screened or p.key in careful),
                          key=lambda p: -(screens.get(p.key) or 0.0))
    screen_keys = [p.key for p in screen_order]
    best = careful[exact[0]] if exact else 0.0
    by_key = {p.key: p.config for p in ranking.predictions}
    checked = {k: at_rate(twin, by_key[k], best) for k in dict.fromkeys(exact[:10] + approx[:3])} if best else {}
    self_check = {}
    if resample:
        other = resampled(sc, workload, slo, [by_key[k] for k in exact], seed=1)
        again = sorted(other, key=lambda k: -other[k])
        best1 = other[again[0]] if again else 0.0
        self_check = {"top1": bool(again and again[0] == exact[0]), "top3": len(set(again[:3]) & set(exact[:3])),
                      "ranks": [again.index(k) + 1 for k in exact[:3]],
                      "worth": [other[k] / best1 if best1 else 0.0 for k in exact[:3]],
                      "twin_top3": len(set(again[:3]) & set(approx[:3]))}
    return {"self": self_check, "at_best": [checked.get(k) for k in approx[:3]], "full_at_best": [checked.get(k) for k in exact[:3]],
            "top10_pass": sum(1 for k in exact[:10] if (checked.get(k) or "").startswith("P")), "best": best,
            "same_as_best": bool(approx and exact and checked.get(approx[0]) == checked.get(exact[0])),"configs": len(ranking.predictions), "rank_s": rank_s, "full_s": full_s,
            "top1": bool(approx and exact and approx[0] == exact[0]),
            "top3": len(set(approx[:3]) & set(exact[:3])),
            "worth": careful.get(approx[0], 0.0) / best if approx and best else 0.0,
            "approx1": approx[0] if approx else None, "exact1": exact[0] if exact else None,
            "exact_of_approx_top3": [exact.index(k) + 1 for k in approx[:3]],
            "worth3": [careful.get(k, 0.0) / best if best else 0.0 for k in approx[:3]],
            "full3_worth": [careful[k] / best if best else 0.0 for k in exact[:3]],
            "screen_ranks_of_full3": [screen_keys.index(k) + 1 if k in screen_keys else None for k in exact[:3]],
            "within_precision": sum(1 for k in exact if best and careful[k] >= best / 1.03)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", nargs="+", default=[s.name for s in SCENARIOS])
    ap.add_argument("--no-resample", dest="resample", action="store_false",
                    help="skip the full ranking on another request sample (its agreement with itself)")
    a = ap.parse_args(argv)
    _record_screens()
    print(f"{'scenario':18} {'configs':>7} {'rank s':>7} {'full s':>7}  top-1  top-3  "
          f"top-1 worth  full ranks of the twin's top-3")
    for sc in [s for s in SCENARIOS if s.name in a.scenarios]:
        r = one(sc, a.resample)
        print(f"{sc.name:18} {r['configs']:7d} {r['rank_s']:7.1f} {r['full_s']:7.1f}  "
              f"{'same' if r['top1'] else 'DIFF':5}  {r['top3']}/3    {r['worth']:9.1%}  {r['exact_of_approx_top3']}",
              flush=True)
        print(f"    twin's top-3 worth {[f'{w:.1%}' for w in r['worth3']]}; full top-3 worth "
              f"{[f'{w:.1%}' for w in r['full3_worth']]}; their screen ranks {r['screen_ranks_of_full3']}; "
              f"configurations within 3% of the best: {r['within_precision']}", flush=True)
        print(f"    at the full best's rate {r['best']:.3f} req/s (careful rules, common requests): twin's top-3 "
              f"{r['at_best']}; full top-3 {r['full_at_best']}; of the full top-10, {r['top10_pass']} pass there"
              + ("; the twin's top-1 reads the same as the full best" if r["same_as_best"] else ""), flush=True)
        if not r["top1"]:
            print(f"    twin's top-1 {r['approx1']}; full ranking's {r['exact1']}", flush=True)
        if r["self"]:
            s = r["self"]
            print(f"    the full ranking on another request sample (load seed 1): top-1 {'same' if s['top1'] else 'DIFF'}, "
                  f"top-3 {s['top3']}/3 with the first (its ranks there {s['ranks']}, worth "
                  f"{[f'{w:.1%}' for w in s['worth']]}); the twin's top-3 shares {s['twin_top3']}/3 with it", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
