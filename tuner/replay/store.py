"""Save and load a `LoadRun` as a directory: `records.jsonl` (one request per line) + `summary.json`.

Every run is kept so a report can be rebuilt, re-scored against another SLO, or audited without
re-running hardware. Records are JSON lines so a run of 100k requests can be streamed, grepped and
appended; everything else (rates, window, warnings, server metrics) is in `summary.json`, which also
carries headline numbers for a human skimming the directory. Loading ignores those derived numbers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tuner.replay.record import LoadRun, RequestRecord
from tuner.replay.schedule import percentile

RECORDS = "records.jsonl"
SUMMARY = "summary.json"


def _headline(run: LoadRun) -> dict:
    win = [r for r in run.records if r.in_window]
    ok = [r for r in win if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [r.tpot for r in ok if r.tpot is not None]
    late = [r.sent_s - r.scheduled_s for r in run.records if r.sent_s is not None]

    def q(v, p):
        x = percentile(v, p)
        return None if math.isnan(x) else x

    return {"requests": len(run.records), "in_window": len(win), "ok_in_window": len(ok),
            "errors": sum(1 for r in run.records if r.error), "ttft_p50_s": q(ttft, 50),
            "ttft_p99_s": q(ttft, 99), "tpot_p50_s": q(tpot, 50), "tpot_p99_s": q(tpot, 99),
            "send_lateness_p99_s": q(late, 99)}


def save_load_run(run: LoadRun, directory: str | Path) -> Path:
    """Write `run` under `directory` (created if needed); returns the directory."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / (RECORDS + ".tmp")
    with tmp.open("w") as f:
        for rec in run.records:
            f.write(rec.model_dump_json())
            f.write("\n")
    tmp.replace(d / RECORDS)
    summary = json.loads(run.model_dump_json(exclude={"records"}))
    summary["headline"] = _headline(run)
    (d / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return d


def load_load_run(directory: str | Path) -> LoadRun:
    d = Path(directory)
    summary = json.loads((d / SUMMARY).read_text())
    summary.pop("headline", None)
    with (d / RECORDS).open() as f:
        records = [RequestRecord.model_validate_json(line) for line in f if line.strip()]
    return LoadRun.model_validate({**summary, "records": records})
