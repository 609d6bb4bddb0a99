"""The report's twin section, from the study storage alone (`tuner.twin.log` and the trial records).

A prediction error is the twin's prediction stored *before* the launch against what that launch
measured; a configuration raced out has no measured capacity, only its one failed load run.
"""

from __future__ import annotations

import statistics

from tuner.report.model import TwinFitRow, TwinRankRow, TwinSection, TwinVerified
from tuner.storage.reader import StudyData
from tuner.storage.twin import TwinLog

RANK_ROWS = 10


def twin_section(data: StudyData) -> TwinSection | None:
    log = TwinLog.read({"twin": data.twin}) if data.twin else None
    if log is None:
        return None
    by_key: dict[str, list] = {}
    for t in data.trials:
        if t.record.launched:
            by_key.setdefault(t.record.config.key(), []).append(t.record)
    verified = []
    for key, pred in log.predicted_before_launch.items():
        for rec in by_key.get(key, [])[:1]:
            cap = None if rec.raced_out else rec.capacity_rps
            err = pred.capacity_rps / cap - 1 if cap and pred.capacity_rps else None
            anchored = pred.anchored_rps / cap - 1 if cap and pred.anchored_rps else None
            verified.append(TwinVerified(
                trial=rec.number, knobs=rec.knobs, predicted_rps=pred.capacity_rps, measured_rps=cap,
                raced_out=rec.raced_out, error=err, anchored_rps=pred.anchored_rps, anchored_error=anchored,
                predicted_curve=pred.curve,
                measured_curve=[(p.rate, p.badness) for p in rec.load_runs if p.rate < 1e5]))
    verified.sort(key=lambda v: v.trial)
    ranking = []
    for p in (log.ranking.predictions[:RANK_ROWS] if log.ranking else []):
        recs = by_key.get(p.key, [])
        ranking.append(TwinRankRow(knobs=p.knobs, predicted_rps=p.capacity_rps, binding=p.binding,
                                   launched_trial=recs[0].number if recs else None,
                                   measured_rps=recs[0].capacity_rps if recs and not recs[0].raced_out else None))
    errs = [abs(v.error) for v in verified if v.error is not None]
    anchored = [abs(v.anchored_error) for v in verified if v.anchored_error is not None]
    return TwinSection(
        configurations=log.configurations, raced_out=log.raced_out,
        fits=[TwinFitRow(after_trial=f.after_trial, trials=f.trials, loss=f.loss, nominal_loss=f.nominal_loss,
                         params=f.params.model_dump(), residuals=f.residuals, wall_s=f.wall_s) for f in log.fits],
        verified=verified, ranking=ranking, median_abs_error=statistics.median(errs) if errs else None,
        median_abs_anchored_error=statistics.median(anchored) if anchored else None,
        stop_reason=log.stop_reason)
