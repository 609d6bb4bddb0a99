"""`tune plan --verify RUN`: the plan's replica count proved on a simulated fleet (`tuner.fleet.verify`),
and the verified fleet exported for the vLLM production stack (`tuner.fleet.export`).

Only option checking and printing live here; `tune plan` (in `tuner.cli.report`) hands over to `run_verify`.
Every input is checked before anything is created; the outputs are written once the runs are done.
"""

from __future__ import annotations

import math
from pathlib import Path

from tuner.errors import UserError


def run_verify(run_dir: Path | None, *, policies: list[str], replicas: int | None, cold_start_s: float | None,
               surge_s: float, price: float | None, out: Path | None, session_key: str, arrivals: str,
               seed: int, workload: str | None, export: bool,
               peak_rate: float | None = None) -> None:
    from tuner.fleet import policies as registry
    from tuner.fleet.export import write_export
    from tuner.fleet.render import lines, write
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
    storage_url(run_dir)  # a run directory of `tune`, checked before anything is created
    dest = check_out_dir(out if out is not None else run_dir / "fleet", "--fleet-out")
    v = verify(str(run_dir), policy_names=policies or ["round_robin", "cache_aware"], workload=workload,
               seed=seed, session=session_key, arrivals=arrivals, cold_start_s=cold_start_s, price=price,
               surge_s=surge_s, start_n=replicas, peak_rate=peak_rate)
    for line in lines(v):
        print(line)
    files = write(v, dest)
    if export:
        files += write_export(v, dest)
    print("wrote " + ", ".join(str(f) for f in files))


__all__ = ["run_verify"]
