"""The recommendation policy: which measured configuration the tool tells the user to deploy.

The rule (a study whose search found something better than vLLM's defaults measures it, its leave-one-
knob-out configurations and the defaults on common request windows, `tuner.search.earn`):

- **A change is recommended** only when the lower end of its paired gain's 95% interval over vLLM's
  defaults (`tuner.capacity.paired`) clears the practical floor (`--noise-floor`, default 5%):
  `gain_counts`. A gain whose interval straddles the floor is not shown to be worth a change; the answer
  is then the defaults, whichever side of the floor one sample's estimate fell, which is what keeps the
  answer from flipping between seeds when the true gain sits near the floor.
- **Every knob earns its place**: the configuration without it, measured on the same windows, serves
  significantly less (`knob_earns`: the share's interval excludes zero); an output-changing knob
  (quantization, FP8 KV, speculative decoding) must clear the floor with its share's lower end, as a
  whole change must. Knobs are tried for removal in a fixed order (output-changing
  first, then the knob table's order), never by a prediction, so the same question gets the same knob
  set; a knob that does not earn its place is dropped and the smaller configuration goes on.
- **Near-ties are an answer**: configurations whose paired difference is not significant are tied, and
  the simpler one is recommended (the tie is listed).

Without that paired evidence (a study stored before it, or one stopped before it), the older rule below
applies to the knee searches' capacities.

Written down once, here; `recommend` decides, and the CLI summary, the report's headline,
`tuned-config.yaml` and `gate.yaml` all read its answer (through the report, which stores it in
`report.json`, and the gate, which calls it on the same storage), so the four can never disagree.

The policy:

- A gain counts only above the noise floor (`effective_floor`: the configured floor, never below a
  launch-to-launch spread the study measured). The best measured configuration whose gain over vLLM's
  defaults is inside the floor is shown as "best measured, not significant", and the recommendation is
  to keep vLLM's defaults (the gate then holds the defaults).
- Of the configurations measured within the noise of the best, the simplest is recommended: fewest knobs
  changed from vLLM's defaults. A gain the noise can hide is not worth a flag a future vLLM may
  change, and each extra knob is one more thing an operator must carry.
- An output-changing knob (quantization, KV-cache dtype, speculative decoding) is recommended only when
  it earns a significant gain: the configuration carrying it must beat every measured configuration
  without such a knob by more than the floor. Its divergence from the defaults' answers is measured on
  the workload's prompts (`tuner.quality`), but a small divergence is not proof of no harm on the user's
  task, so a quality risk is taken only for a gain the measurements can tell apart from noise; one over the
  SLO's `quality` bound was rejected in its trial and has no capacity to recommend.
- A recommendation is always a configuration that was launched and measured (its capacity is the lower
  of its launches); never a prediction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Literal

from pydantic import BaseModel, Field

from tuner.capacity.paired import TEST, Estimate, capacity as window_capacity, paired_ratio
from tuner.knobs import KNOB_SPECS
from tuner.storage.earned import ATTR, EarnedLog
from tuner.storage.records import TrialRecord
from tuner.storage.select import pick_configs
from tuner.storage.status import study_status

OUTPUT_KNOBS = tuple(k for k, spec in KNOB_SPECS.items() if spec.changes_outputs)
#: A knob that changes no output earns its place with a significant share of at least this fraction of the
#: practical floor. A share that is real but small is not worth a flag an operator must carry, and it is
#: where the answer flipped: on the RAG scenario `max_num_batched_tokens=2048` adds 1.1% (the careful
#: truth, 40 windows), significant in two seeded studies of five and not in three.
SHARE_OF_FLOOR = 0.5


def gain_counts(gain: Estimate | None, floor: float) -> bool:
    """A configuration is worth recommending over vLLM's defaults: the lower end of its paired gain's
    interval clears the practical floor."""
    return gain is not None and gain.low > 0 and gain.low >= floor


def share_needed(knob: str, floor: float) -> float:
    """The share a knob must bring to stay in a configuration: the floor for one that changes outputs,
    `SHARE_OF_FLOOR` of it otherwise."""
    return floor if knob in OUTPUT_KNOBS else SHARE_OF_FLOOR * floor


def knob_earns(knob: str, share: Estimate | None, floor: float) -> bool:
    """A knob stays: the configuration without it serves significantly less (paired), by at least
    `SHARE_OF_FLOOR` of the floor; a knob that changes outputs must clear the floor with its share's lower
    end, as a whole change must."""
    if share is None:
        return False
    if knob in OUTPUT_KNOBS:
        return share.low > 0 and share.low >= share_needed(knob, floor)
    return share.low > 0 and share.value >= share_needed(knob, floor)


#: A comparison is settled early only on at least this many windows.
MIN_WINDOWS = 4


def gain_settled(gain: Estimate | None, floor: float) -> bool:
    """More windows cannot change `gain_counts`' answer at the usual level: the whole interval is above the
    floor, or below it."""
    return gain is not None and gain.n >= MIN_WINDOWS and (gain.low >= floor or gain.high < floor)


def share_settled(knob: str, share: Estimate | None, floor: float) -> bool:
    """The same for `knob_earns`: the whole interval of the knob's share is above what it needs, or below."""
    need = share_needed(knob, floor)
    return share is not None and share.n >= MIN_WINDOWS and (share.low >= need and share.low > 0
                                                              or share.high < need)


def removal_order(knobs: list[str]) -> list[str]:
    """The order in which knobs are tried for removal: output-changing first (a tie without one is the
    simpler answer), then the knob table's order. Fixed, so it never depends on a noisy prediction."""
    table = list(KNOB_SPECS)
    return sorted(knobs, key=lambda k: (k not in OUTPUT_KNOBS, table.index(k) if k in table else len(table), k))


@dataclass
class Spread:
    """One configuration launched more than once (the baseline's confirmation, a winner confirmed)."""

    label: str
    capacities: list[float]

    @property
    def spread(self) -> float:
        return max(self.capacities) / min(self.capacities) - 1.0


def _key(knobs: dict) -> str:
    return json.dumps(knobs, sort_keys=True)


def launch_spreads(records: Iterable[TrialRecord]) -> list[Spread]:
    """Every configuration the study launched more than once with a capacity each: the measured
    launch-to-launch spread, which no single launch's bracket shows."""
    groups: dict[str, list[TrialRecord]] = {}
    for r in sorted(records, key=lambda r: r.number):
        if r.launched and r.capacity_rps and r.role != "paired":  # a paired capacity is another measure
            groups.setdefault(_key(r.knobs), []).append(r)
    out = []
    for rs in groups.values():
        if len(rs) > 1:
            knobs = rs[0].knobs
            label = ("vLLM's defaults" if not knobs else " ".join(f"{k}={v}" for k, v in knobs.items())) \
                + f" (trials {', '.join(str(r.number) for r in rs)})"
            out.append(Spread(label, [float(r.capacity_rps) for r in rs]))
    return out


def effective_floor(configured: float, spreads: list[Spread]) -> float:
    """The noise floor a gain must clear: the configured one, never below a spread the study measured."""
    return max([configured] + [sp.spread for sp in spreads])


def changed_knobs(knobs: dict, defaults: dict | None) -> list[str]:
    """Knobs set to something other than what vLLM resolves them to (a knob set to its default, or to its
    neutral value, changes nothing and costs the operator nothing)."""
    out = []
    for k, v in knobs.items():
        if v is None or (defaults and k in defaults and defaults[k] == v):
            continue
        if k in KNOB_SPECS and KNOB_SPECS[k].neutral is not None and v == KNOB_SPECS[k].neutral:
            continue
        out.append(k)
    return out


def output_changing(knobs: dict, defaults: dict | None) -> list[str]:
    return [k for k in changed_knobs(knobs, defaults) if k in OUTPUT_KNOBS]


class Recommendation(BaseModel):
    """What to deploy, and the best measured configuration beside it when the two differ."""

    kind: Literal["tuned", "defaults", "none"]   # none: no configuration met the SLO (no result)
    trial: int | None = None
    knobs: dict = Field(default_factory=dict)
    capacity_rps: float | None = None
    gain_pct: float | None = None                # over vLLM's defaults, measured
    floor: float = 0.05                          # the noise floor the gains were judged against
    best_trial: int | None = None
    best_knobs: dict = Field(default_factory=dict)
    best_capacity_rps: float | None = None
    best_gain_pct: float | None = None
    best_significant: bool = False               # the best's gain over the defaults clears the floor
    why: str = ""                                # one sentence: why this and not the best measured
    #: measured on the common windows (`tuner.search.earn`): the gain's 95% interval, the test, each knob's
    #: paired share, and the configurations tied with the recommendation
    paired: bool = False
    gain_low_pct: float | None = None
    gain_high_pct: float | None = None
    capacity_low_rps: float | None = None
    capacity_high_rps: float | None = None
    test: str = ""
    defaults_trial: int | None = None            # vLLM's defaults on the common windows
    defaults_capacity_rps: float | None = None
    defaults_low_rps: float | None = None
    defaults_high_rps: float | None = None
    shares: list["PairedShare"] = Field(default_factory=list)
    ties: list[str] = Field(default_factory=list)

    def line(self) -> str:
        """The one line the CLI prints and the report's headline opens with."""
        if self.kind == "none":
            return "no recommendation: no configuration met the SLO"
        cap = f"{self.capacity_rps:.2f} req/s" if self.capacity_rps else "no capacity"
        if self.paired and self.capacity_low_rps and self.capacity_high_rps:
            cap += f" [{self.capacity_low_rps:.2f}, {self.capacity_high_rps:.2f}]"
        if self.kind == "defaults":
            forced = " ".join(f"{k}={v}" for k, v in self.knobs.items())  # what the host forced, if anything
            head = f"keep vLLM's defaults{f' (with {forced}, as this host needs)' if forced else ''} " \
                   f"(trial {self.trial}): {cap}"
        else:
            kn = " ".join(f"{k}={v}" for k, v in self.knobs.items())
            gain = f" ({self.gain_pct:+.1f}%)" if self.gain_pct is not None else ""
            if self.paired and self.gain_low_pct is not None and self.gain_high_pct is not None:
                gain = f" ({self.gain_pct:+.1f}%, 95% interval [{self.gain_low_pct:+.1f}%, {self.gain_high_pct:+.1f}%], paired)"
            head = f"recommended (trial {self.trial}): {cap}{gain} with {kn}"
        return head + (f"; {self.why}" if self.why else "")

    def baseline_line(self) -> str | None:
        """vLLM's defaults as the paired check measured them (the capacity every gain is relative to)."""
        if not self.paired or self.defaults_trial is None:
            return None
        cap = (f"{self.defaults_capacity_rps:.2f} req/s [{self.defaults_low_rps:.2f}, {self.defaults_high_rps:.2f}]"
               if self.defaults_capacity_rps and self.defaults_low_rps is not None
               and self.defaults_high_rps is not None else "no capacity on every window")
        return f"vLLM's defaults on the common windows (trial {self.defaults_trial}): {cap}"

    def best_line(self) -> str | None:
        """The best measured configuration, when it is not the recommended one."""
        if self.kind == "none" or self.best_trial is None or self.best_trial == self.trial:
            return None
        kn = " ".join(f"{k}={v}" for k, v in self.best_knobs.items()) or "vLLM's defaults"
        gain = f" ({self.best_gain_pct:+.1f}%)" if self.best_gain_pct is not None else ""
        if self.paired:
            cap = f"{self.best_capacity_rps:.2f} req/s" if self.best_capacity_rps else "no capacity"
            tail = ("; the recommendation is it less the knobs that earned no significant share"
                    if self.kind == "tuned" else "; its gain does not count (above)")
            return f"the search's best (trial {self.best_trial}, paired): {cap}{gain} with {kn}{tail}"
        tag = "best measured" + ("" if self.best_significant else ", not significant")
        return f"{tag} (trial {self.best_trial}): {self.best_capacity_rps:.2f} req/s{gain} with {kn}"


class PairedShare(BaseModel):
    """One knob's measured, paired share: what the configuration loses without it (`a / b - 1`)."""

    knob: str
    share_pct: float | None = None
    low_pct: float | None = None
    high_pct: float | None = None
    kept: bool = False
    with_trial: int = 0
    without_trial: int | None = None
    windows: int = 0

    def text(self) -> str:
        if self.share_pct is None:
            return f"{self.knob}: n/a"
        return (f"{self.knob} {self.share_pct:+.1f}% [{self.low_pct:+.1f}%, {self.high_pct:+.1f}%] "
                f"(measured, paired, {self.windows} windows): {'kept' if self.kept else 'dropped'}")


Recommendation.model_rebuild()


@dataclass
class _Config:
    """One measured configuration: its lowest-capacity launch stands for it."""

    rec: TrialRecord
    capacity: float


def measured_configs(records: Iterable[TrialRecord]) -> dict[str, _Config]:
    out: dict[str, _Config] = {}
    for r in records:
        if not (r.launched and r.capacity_rps) or getattr(r, "interrupted", False):
            continue
        k = _key(r.knobs)
        if k not in out or r.capacity_rps < out[k].capacity:
            out[k] = _Config(r, float(r.capacity_rps))
    return out


def _pct(cap: float | None, base: float | None) -> float | None:
    return 100.0 * (cap / base - 1.0) if cap and base else None


def recommend(records: list[TrialRecord], baseline: TrialRecord | None, best: TrialRecord | None, *,
              floor: float, defaults: dict | None = None) -> Recommendation:
    """The policy of this module's docstring over the measured `records`. `best` is the configuration
    the search ended on (its confirmed incumbent), `baseline` vLLM's defaults (as the host allowed them)."""
    configs = measured_configs(records)
    if best is None or _key(best.knobs) not in configs:
        return Recommendation(kind="none", floor=floor)
    b = configs[_key(best.knobs)]
    base = configs.get(_key(baseline.knobs)) if baseline is not None else None
    base_cap = base.capacity if base else None

    def significant(c: _Config, over: float | None) -> bool:
        return over is None or c.capacity > over * (1 + floor)

    neutral = [c.capacity for c in configs.values() if not output_changing(c.rec.knobs, defaults)]
    best_neutral = max(neutral, default=None)

    def admissible(c: _Config) -> bool:
        if base is not None and c is base:
            return True
        if not significant(c, base_cap):
            return False
        return not output_changing(c.rec.knobs, defaults) or significant(c, best_neutral)

    pool = [c for c in configs.values() if c.capacity * (1 + floor) >= b.capacity and admissible(c)]
    pool.sort(key=lambda c: (len(changed_knobs(c.rec.knobs, defaults)), bool(output_changing(c.rec.knobs, defaults)),
                             -c.capacity, c.rec.number))
    pick = pool[0] if pool else base
    out = Recommendation(kind="defaults", floor=floor, best_trial=b.rec.number, best_knobs=dict(b.rec.knobs),
                         best_capacity_rps=b.capacity, best_gain_pct=_pct(b.capacity, base_cap),
                         best_significant=significant(b, base_cap) and b is not base)
    if pick is None:  # no baseline capacity and nothing admissible: the best is all there is
        pick = b
    kind = "defaults" if base is not None and pick is base else "tuned"
    out = out.model_copy(update={"kind": kind, "trial": pick.rec.number, "knobs": dict(pick.rec.knobs),
                                 "capacity_rps": pick.capacity, "gain_pct": _pct(pick.capacity, base_cap)})
    return out.model_copy(update={"why": _why(out, b, pick, best_neutral, defaults)})


def _why(r: Recommendation, best: _Config, pick: _Config, best_neutral: float | None,
         defaults: dict | None) -> str:
    """Why the recommendation is not simply the best measured configuration, in one clause."""
    if r.gain_pct is None and r.kind == "tuned" and pick is best:
        return "vLLM's defaults met the SLO at no rate (or did not launch)"
    if pick is best:
        if r.kind == "defaults":
            return "no configuration measured better than vLLM's defaults"
        return f"above the {r.floor:.0%} noise floor"
    quality = output_changing(best.rec.knobs, defaults)
    if quality and r.best_significant and best_neutral and best.capacity <= best_neutral * (1 + r.floor):
        what = f"the best measured needs {', '.join(quality)} (changes outputs) for a gain within the " \
               f"{r.floor:.0%} noise floor of one without it"
    elif not r.best_significant:
        what = f"the best measured gain ({r.best_gain_pct:+.1f}%) is within the {r.floor:.0%} noise floor"
    else:
        what = f"the simplest configuration within the {r.floor:.0%} noise floor of the best measured"
    return what


def _est_pct(e: Estimate | None) -> tuple[float | None, float | None, float | None]:
    return (None, None, None) if e is None else (100 * e.value, 100 * e.low, 100 * e.high)


def _windows(trials: dict[int, TrialRecord], numbers: list[int]) -> list:
    """A configuration's windows: those of all its paired trials."""
    return [w for n in numbers if n in trials for w in trials[n].windows]


def recommend_earned(log, trials: dict[int, TrialRecord], floor: float,
                     defaults: dict | None) -> Recommendation | None:
    """The rule of this module's docstring over the paired trials the study's `earned` log names
    (`tuner.storage.earned.EarnedLog`); None where the log holds no paired measurement of the defaults."""
    d_w = _windows(trials, log.defaults_trials)
    if not d_w:
        return None
    d, best = trials[log.defaults_trials[0]], trials.get(log.best_trials[0]) if log.best_trials else None
    best_w = _windows(trials, log.best_trials)
    pick, pick_w = (trials.get(log.final_trials[-1]), _windows(trials, log.final_trials)) if log.final_trials \
        else (d, d_w)
    if pick is None:
        return None
    shares = []
    for st in log.steps:
        with_w, without_w = _windows(trials, st.with_trials), _windows(trials, st.without_trials)
        est = paired_ratio(with_w, without_w) if with_w and without_w else None
        v, lo, hi = _est_pct(est)
        shares.append(PairedShare(knob=st.knob, share_pct=v, low_pct=lo, high_pct=hi, kept=st.kept,
                                  with_trial=st.with_trials[-1],
                                  without_trial=st.without_trials[-1] if st.without_trials else None,
                                  windows=est.n if est else 0))
    gain = paired_ratio(pick_w, d_w) if log.final_trials else None
    g, glo, ghi = _est_pct(gain)
    best_gain = paired_ratio(best_w, d_w) if best_w else None
    cap = window_capacity(pick_w)
    ties = [f"trial {st.with_trials[-1]} ({' '.join(f'{k}={v}' for k, v in trials[st.with_trials[-1]].knobs.items())})"
            for st in log.steps if not st.kept and st.with_trials[-1] in trials]
    rec = Recommendation(
        kind="tuned" if log.final_trials else "defaults", trial=pick.number, knobs=dict(pick.knobs),
        capacity_rps=cap.rps if cap else pick.capacity_rps, gain_pct=g, floor=floor,
        best_trial=best.number if best else d.number, best_knobs=dict(best.knobs) if best else {},
        best_capacity_rps=(c.rps if (c := window_capacity(best_w)) else best.capacity_rps) if best else None,
        best_gain_pct=_est_pct(best_gain)[0], best_significant=gain_counts(best_gain, floor),
        paired=True, gain_low_pct=glo, gain_high_pct=ghi, capacity_low_rps=cap.low if cap else None,
        capacity_high_rps=cap.high if cap else None, test=TEST, shares=shares, ties=ties,
        defaults_trial=d.number, defaults_capacity_rps=dc.rps if (dc := window_capacity(d_w)) else None,
        defaults_low_rps=dc.low if dc else None, defaults_high_rps=dc.high if dc else None)
    return rec.model_copy(update={"why": _why_paired(rec, best_gain, log)})


def _why_paired(r: Recommendation, best_gain: Estimate | None, log) -> str:
    if r.kind == "tuned":
        kept = [s.knob for s in r.shares if s.kept]
        dropped = [s.knob for s in r.shares if not s.kept]
        out = f"the paired gain's 95% interval clears the {r.floor:.0%} floor"
        if dropped:
            out += f"; {', '.join(dropped)} dropped (no significant share)"
        return out + ("; every knob kept earned a significant share" if kept else "")
    if not log.best_trials:
        return "the search found nothing better than vLLM's defaults" + (f" ({log.note})" if log.note else "")
    if best_gain is None:
        return "the search's best could not be compared with the defaults on the same windows"
    if best_gain.low <= 0:
        return (f"the best measured gain, {best_gain.text()} (paired), is not significant")
    return (f"the best measured gain, {best_gain.text()} (paired), is significant but its interval does "
            f"not clear the {r.floor:.0%} floor")


def recommend_study(data) -> Recommendation:
    """The recommendation for a stored study (`tuner.storage.reader.StudyData`): what the report and the
    gate both call, so the configuration the report recommends is the one the gate holds."""
    info = data.info
    done = [t.record for t in data.trials if t.state not in ("RUNNING", "WAITING")]
    status, _ = study_status(done)
    spreads = launch_spreads(done)
    floor = effective_floor(info.settings.noise_floor, spreads)
    if status != "tuned":
        return Recommendation(kind="none", floor=floor)
    log = EarnedLog.read({ATTR: getattr(data, "earned", None)})
    if log is not None:
        by_number = {t.record.number: t.record for t in data.trials if t.state == "COMPLETE"}
        earned = recommend_earned(log, by_number, info.settings.noise_floor, info.vllm_defaults)
        if earned is not None:
            return earned
    base_t, best_t = pick_configs(data.trials, data.outcome)
    measured = [t.record for t in data.trials if t.state == "COMPLETE" and t.record.role != "paired"]
    return recommend(measured, base_t.record if base_t else None, best_t.record if best_t else None,
                     floor=floor, defaults=info.vllm_defaults)


def recommended_record(data, rec: Recommendation | None = None) -> TrialRecord | None:
    """The recommended trial's record, carrying the recommendation's capacity: where the paired check
    decided, the geometric mean over every window of the configuration (which may span two paired
    launches), so the plan, `--verify` and the gate size what the headline states. None: no trial."""
    rec = rec or recommend_study(data)
    t = next((t for t in data.trials if t.number == rec.trial), None) if rec.trial is not None else None
    if t is None:
        return None
    if not rec.paired:
        return t.record
    return t.record.model_copy(update={"capacity_rps": rec.capacity_rps, "capacity_low_rps": None,
                                       "capacity_high_rps": rec.capacity_high_rps})
