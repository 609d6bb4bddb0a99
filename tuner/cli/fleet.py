"""`tune plan --verify RUN`: the plan's replica count proved on a simulated fleet (`tuner.fleet.verify`),
and the verified fleet exported for the vLLM production stack (`tuner.fleet.export`).

Only option checking and printing live here; `tune plan` (in `tuner.cli.report`) hands over to `run_verify`.
Every input is checked before anything is created; the outputs are written once the runs are done.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import UserError

MAX_REAL_S = 600.0      # schedule seconds of a real-router run: a short stated window, not a soak test
MAX_TIME_SCALE = 100.0


@dataclass
class RealRouterOptions:
    """`--real-router`: the verified fleet once more, in real time through the vLLM Router."""

    duration_s: float
    replicas: int | None
    time_scale: float
    stop_replica_at: float | None

    def check(self, policies: list[str]) -> str:
        """Every option, then the router binary itself (installed, answering, with each policy): the
        binary's path."""
        from tuner.fleet.compare import check_router

        if not (math.isfinite(self.duration_s) and 0 < self.duration_s <= MAX_REAL_S):
            raise UserError(f"must be in (0, {MAX_REAL_S:g}] seconds, got {self.duration_s}", field="--real-duration")
        if self.replicas is not None and not 1 <= self.replicas <= 64:
            raise UserError(f"must be in [1, 64] (real processes on this host), got {self.replicas}",
                            field="--real-replicas")
        if not (math.isfinite(self.time_scale) and 0 < self.time_scale <= MAX_TIME_SCALE):
            raise UserError(f"must be in (0, {MAX_TIME_SCALE:g}], got {self.time_scale}", field="--time-scale")
        t = self.stop_replica_at
        if t is not None and not (math.isfinite(t) and 0 < t < self.duration_s):
            raise UserError(f"must be inside the run, (0, {self.duration_s:g}) seconds, got {t}",
                            field="--stop-replica-at")
        return check_router(policies)


def run_verify(run_dir: Path | None, *, policies: list[str], replicas: int | None, cold_start_s: float | None,
               surge_s: float, price: float | None, out: Path | None, session_key: str, arrivals: str,
               seed: int, workload: str | None, export: bool,
               peak_rate: float | None = None, real: RealRouterOptions | None = None) -> None:
    from tuner.fleet import policies as registry
    from tuner.fleet.export import write_export
    from tuner.fleet.render import lines
    from tuner.report.fleet import write_fleet as write
    from tuner.fleet.verify import MAX_REPLICAS, check_price, verify
    from tuner.inputs import check_out_dir
    from tuner.storage.reader import storage_url

    if run_dir is None:
        raise UserError("--verify needs a run directory (tune plan --verify RUN)", field="--verify")
    for p in policies:
        registry.check_policy(p)
    if replicas is not None and replicas < 1:
        raise UserError(f"must be >= 1, got {replicas}", field="--replicas")
    if replicas is not None and replicas > MAX_REPLICAS:  # the N search's own cap: a start beyond it never ended
        raise UserError(f"must be <= {MAX_REPLICAS} (the largest fleet the search simulates), got {replicas}",
                        field="--replicas")
    if arrivals not in ("poisson", "trace"):
        raise UserError(f"must be poisson or trace, got {arrivals!r}", field="--arrivals")
    if cold_start_s is not None and not (math.isfinite(cold_start_s) and 0 <= cold_start_s <= 3600):
        raise UserError(f"must be a number of seconds in [0, 3600], got {cold_start_s}", field="--cold-start-s")
    check_price(price)
    if peak_rate is not None and not (math.isfinite(peak_rate) and peak_rate > 0):
        raise UserError(f"must be a number > 0, got {peak_rate}", field="--peak-rate")
    if not (math.isfinite(surge_s) and 0 < surge_s <= 3600):
        raise UserError(f"must be in (0, 3600] seconds, got {surge_s}", field="--surge-s")
    policies = policies or ["round_robin", "cache_aware"]
    storage_url(run_dir)  # a run directory of `tune`, checked before anything is created
    dest = check_out_dir(out if out is not None else run_dir / "fleet", "--fleet-out")
    router = real.check(policies) if real is not None else None
    v = verify(str(run_dir), policy_names=policies, workload=workload,
               seed=seed, session=session_key, arrivals=arrivals, cold_start_s=cold_start_s, price=price,
               surge_s=surge_s, start_n=replicas, peak_rate=peak_rate)
    for line in lines(v):
        print(line)
    compared = (_real_runs(run_dir, v, real, router, workload=workload, seed=seed, session=session_key,
                           arrivals=arrivals, peak_rate=peak_rate) if real is not None and router else [])
    files = write(v, dest)
    if compared:
        (dest / "fleet-real.json").write_text("[" + ",\n".join(c.model_dump_json(indent=2) for c in compared) + "]\n")
        files.append(dest / "fleet-real.json")
    if export:
        files += write_export(v, dest)
    print("wrote " + ", ".join(str(f) for f in files))


def _real_runs(run_dir: Path, v, real: RealRouterOptions, router: str, **setup_args) -> list:
    """Each policy's verified fleet through the real router (printed as it ends); its processes are all
    stopped, and their logs dropped, before the next starts. A policy with no verified N and no
    --real-replicas is skipped, said so."""
    from tuner.fleet.compare import compare, line
    from tuner.fleet.verify import setup_from_run
    from tuner.storage.reader import load_study_data

    setup, _, rec = setup_from_run(str(run_dir), **setup_args)
    info = load_study_data(str(run_dir)).info
    gpu, model = info.settings.engine.gpu, info.settings.engine.model
    if not info.simulated:
        print(f"real router: the study ran on {info.settings.engine.name}; the real-router run's replicas are "
              "the HTTP simulator of its GPU and model profiles, not vLLM: it checks the router model, not "
              "the engine")
    knobs = rec.config  # type: ignore[attr-defined]  # the tuned trial's record (setup_from_run types it loosely)
    out = []
    for p in v.policies:
        n = real.replicas or p.verified_n
        if n is None:
            print(f"real router {p.policy}: skipped (no verified N; give --real-replicas)")
            continue
        with tempfile.TemporaryDirectory(prefix="fleet-real-") as tmp:
            c = compare(setup, gpu, model, knobs, n, p.policy, duration_s=real.duration_s,
                        time_scale=real.time_scale, stop_replica_at=real.stop_replica_at, run_dir=tmp, router=router)
        print(line(c))
        out.append(c)
    return out


__all__ = ["RealRouterOptions", "run_verify"]
