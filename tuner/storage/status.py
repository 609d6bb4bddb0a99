"""Whether a finished study has a result at all, and if not, why, in one line.

A study whose every launch failed, or whose every configuration missed the SLO at every offered rate,
has no tuned configuration: nothing is "best", there is no capacity to gate, and `tune` exits non-zero
with its own code so a script or CI job cannot mistake it for a result:

- `EXIT_NO_LAUNCH` (3): no configuration launched (every launch failed, or none was tried);
- `EXIT_NO_PASS` (4): configurations launched, but none met the SLO at any offered rate.

The report (`tuner.report.build`) and the command line (`tuner.cli.study`) both read this.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Literal

from tuner.storage.records import TrialRecord

EXIT_NO_LAUNCH = 3
EXIT_NO_PASS = 4

Status = Literal["tuned", "no_launch", "no_pass"]
EXIT_CODES: dict[str, int] = {"tuned": 0, "no_launch": EXIT_NO_LAUNCH, "no_pass": EXIT_NO_PASS}


def study_status(records: Iterable[TrialRecord]) -> tuple[Status, str | None]:
    """("tuned", None) when some configuration has a capacity; else the status and a one-line reason.
    Interrupted trials are left out: they measured nothing."""
    recs = [r for r in records if not r.interrupted]
    if any(r.capacity_rps for r in recs):
        return "tuned", None
    launched = [r for r in recs if r.launched]
    if not launched:
        failed = [r for r in recs if r.launch_failure_kind]
        if not failed:
            return "no_launch", "no configuration launched: the study ran no trial"
        kinds = Counter(r.launch_failure_kind for r in failed)
        first = next((r.launch_failure_message for r in failed if r.launch_failure_message), "")
        first = " ".join(first.split())
        what = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in kinds.most_common())
        return "no_launch", (f"no configuration launched: {len(failed)} launch"
                             f"{'es' if len(failed) != 1 else ''} failed ({what})"
                             + (f"; first: {first[:200]}" if first else ""))
    bound = [r for r in launched if r.launch_failure_kind == "client_bound"]
    if bound and len(bound) == len(launched):
        said = " ".join((bound[0].launch_failure_message or "").split())
        return "no_pass", (f"the load client measured itself, not the server, in every launch "
                           f"({len(launched)}); first: {said[:300]}; see docs/measurement.md, 'Who gets the CPU'")
    failing = [r for r in launched if r.launch_failure_kind == "requests_failed"]
    if len(failing) == len(launched):
        said = " ".join((failing[0].launch_failure_message or "").split())
        return "no_pass", (f"every request failed: {len(launched)} configuration"
                           f"{'s' if len(launched) != 1 else ''} launched and none served requests; "
                           f"first: {said[:240]}")
    rates = [p.rate for r in launched for p in r.load_runs]
    low = f" (lowest offered: {min(rates):.3g} req/s)" if rates else ""
    return "no_pass", (f"no configuration met the SLO at any offered rate: {len(launched)} launched"
                       f"{low}; nothing to tune or gate")
