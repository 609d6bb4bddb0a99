"""Live progress of a study on the terminal: the trial, its knobs, each load run, the incumbent."""

from __future__ import annotations

from rich.console import Console

from tuner.knobs import Knobs
from tuner.storage.records import LoadRunSummary, TrialRecord


def _knobs(k: dict) -> str:
    return " ".join(f"{n}={v}" for n, v in k.items()) or "vLLM defaults"


class RichReporter:
    """One line per load run and per trial, with a status spinner while a trial runs (stderr)."""

    def __init__(self, console: Console | None = None):
        # soft_wrap: a line longer than the terminal (or than 80 columns in a log file) stays one line
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.incumbent: TrialRecord | None = None
        self._status = None

    def trial_started(self, number: int, knobs: Knobs, role: str) -> None:
        self.console.print(f"[bold]trial {number}[/] [dim]({role})[/] {_knobs(knobs.set_only())}")
        self._status = self.console.status(f"trial {number}: launching", spinner="dots")
        self._status.start()

    def point(self, number: int, p: LoadRunSummary) -> None:
        mark = "[green]pass[/]" if p.passed else "[yellow]unproven[/]" if p.verdict == "too_short" else \
            "[yellow]not the server's[/]" if p.verdict == "client_bound" else "[red]fail[/]"
        p99 = ", ".join(f"{m} {v:.0f}" for m, v in p.p99_ms.items() if v is not None and m != "itl")
        rate = "burst (all at once)" if p.rate >= 1e5 else f"{p.rate:8.2f} req/s"
        why = {"overloaded": "overloaded", "too_short": "too short to tell", "errors": "errors"}.get(p.verdict)
        served = f" served {p.served_rps:.3g}/s" if p.served_rps is not None and p.rate < 1e5 else ""
        if p.rate >= 1e5:  # the burst: a bound for the search, not a point of the knee curve
            thr = f"{p.throughput_rps:.3g} req/s" if p.throughput_rps else "not measured"
            mark, served = "[dim]maximum throughput[/]", f" {thr}"
        self.console.print(f"   {rate}  {mark}{f' ({why})' if why else ''}  n={p.n}{served}  attainment "
                           f"{p.attainment:.3f} [{p.ci_low:.3f}, {p.ci_high:.3f}]  p99 ms: {p99}")
        causes = ", ".join(f"{k} {v}" for k, v in p.errors_by_cause.items())
        if causes:
            self.console.print(f"      [yellow]errors:[/] {causes}")
        for w in p.warnings:
            self.console.print(f"      [yellow]warning:[/] {w[:200]}")
        for c in p.client_bound_runs:
            self.console.print(f"      [yellow]run again, client-bound:[/] {'; '.join(c.reasons)[:240]}")
        if p.client_check is not None and p.client_check.server_ttft_mean_ms is not None:
            self.console.print(f"      [dim]server's own view: {p.client_check.line()[:240]}[/]")
        if self._status:
            inc = self.incumbent.capacity_rps if self.incumbent and self.incumbent.capacity_rps else None
            self._status.update(f"trial {number}: last load run {rate.strip()}, "
                                f"attainment {p.attainment:.3f}; incumbent "
                                f"{f'{inc:.2f} req/s' if inc else '-'}")

    def trial_done(self, rec: TrialRecord) -> None:
        if self._status:
            self._status.stop()
            self._status = None
        what = {"requests_failed": "its requests failed", "ruled_out": "not launched",
                "client_bound": "not measured (the client's timings, not the server's)"}
        if rec.launch_failure_kind:
            self.console.print(f"   [yellow]{what.get(rec.launch_failure_kind, 'launch failed')}[/] "
                               f"({rec.launch_failure_kind}): {(rec.launch_failure_message or '')[:200]}")
            for c in rec.learned:
                self.console.print(f"   [cyan]learned[/]: {c.text()}")
        elif rec.interrupted:
            self.console.print("   [yellow]interrupted[/]")
        elif rec.raced_out:
            self.console.print("   [dim]raced out: fails at the incumbent's capacity[/]")
        else:
            cap = f"{rec.capacity_rps:.2f} req/s" if rec.capacity_rps else "none"
            if rec.capacity_rps:
                lo, hi = rec.capacity_low_rps, rec.capacity_high_rps
                cap += (f" (passed clearly at {lo:.3g}" if lo else " (no clear pass") + (
                    f", failed clearly at {hi:.3g})" if hi else ")")
            elif rec.no_capacity_reason:
                cap += f": {rec.no_capacity_reason}"
            diag = f"; binds: {rec.diagnosis.kind} ({rec.diagnosis.summary})" if rec.diagnosis else ""
            beat = " [green]beats the incumbent[/]" if rec.accepted and rec.role == "candidate" else ""
            self.console.print(f"   capacity {cap}{beat}{diag}")

    def note(self, text: str) -> None:
        """A line about the search itself (the twin's fits and rankings), between trials."""
        self.console.print(f"   [cyan]{text}[/]")

    def incumbent_changed(self, rec: TrialRecord) -> None:
        cap = f"{rec.capacity_rps:.2f} req/s" if rec.capacity_rps else "none"
        self.console.print(f"   [green]incumbent[/]: trial {rec.number}, {_knobs(rec.knobs)}, {cap}")
        self.incumbent = rec
