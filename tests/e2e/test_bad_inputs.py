"""Every bad input a new user can give ends in exactly one line, `error: ...`, naming the option or the file
(and its line), with exit code 2, no traceback, and nothing created: options of `tune` and its
sub-commands, workload, SLO, search-space, GPU-profile and model files.

The table runs the command line in-process (`tuner.cli.main` with its `sys.argv`: the same code a shell
runs, without a Python start-up per case); a few cases run as real processes to show the installed `tune`
behaves the same.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import GPU, MODEL, SLO, SPACE2, WORKLOAD, tune

pytestmark = pytest.mark.e2e

GOOD_GPU = ("mygpu:\n  name: My GPU\n  aliases: [mg]\n  memory_gib: 40\n  bandwidth_gbs: 1000\n"
            "  bf16_tflops: 200\n  fp8_tflops: 400\n  fp8_native: true\n")
CONFIG = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 256, "vocab_size": 1000, "max_position_embeddings": 2048}

#: A nine-level YAML "billion laughs": 1 KB of text, 387 million strings once its aliases are expanded.
LOL = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))
#: A space of 10^7 configurations (100 x 100 x 100 x 10 values).
BIG_SPACE = ("knobs:\n"
             f"  max_num_seqs: {{values: {list(range(1, 101))}}}\n"
             f"  max_num_batched_tokens: {{values: {list(range(1024, 7424, 64))}}}\n"
             f"  gpu_memory_utilization: {{values: {[round(0.5 + i * 0.004, 3) for i in range(100)]}}}\n"
             f"  max_model_len: {{values: {list(range(4096, 9216, 512))}}}\n")
GATE = ("engine: sim\ngpu: rtx4090\nmodel: qwen2.5-7b\nknobs: {}\nworkload: {path: w.jsonl, sha256: x}\n"
        "slo: {path: s.yaml, sha256: y}\ncapacity_rps: 5\n")

#: Input files every case finds in its working directory (bytes: some are not UTF-8 on purpose).
FILES: dict[str, bytes] = {
    "afile": b"not a directory\n",
    "bad_utf8.jsonl": b'{"prompt_tokens": 9, "output_tokens": 3}\n{"prompt": "caf\xe9", "output_tokens": 3}\n',
    "bad_record.jsonl": b'{"prompt_tokens": 9, "output_tokens": 3}\n{"prompt_tokens": 9, "output_tokens": 0}\n',
    # one request past Qwen2.5-7B's 32,768-token context in two: plain `tune` refuses it before a launch
    "overlong.jsonl": b'{"prompt_tokens": 9, "output_tokens": 3}\n{"prompt_tokens": 40000, "output_tokens": 3}\n',
    "slo_bool.yaml": b"ttft:\n  max_ms: true\n",
    "slo_str.yaml": b'ttft_ms: "300"\n',
    "slo_neg.yaml": b"name: negative\nttft: {max_ms: 300}\ntpot: {max_ms: -50}\n",
    "slo_utf8.yaml": b"ttft_ms: 300\nname: caf\xe9\n",
    "slo_syntax.yaml": b"ttft_ms: 300\ntpot: {max_ms: 50\n",
    "space_kv.yaml": b"knobs:\n  kv_cache_dtype:\n    values: [auto, int3]\n",
    "space_quant.yaml": b"knobs:\n  quantization: {values: [null, gguf]}\n",
    "space_typo.yaml": b"name: typo\nknobs:\n  max_num_seqs: {values: [8, 64]}\n  max_num_sequences: {values: [8]}\n",
    "space_bool.yaml": b"knobs:\n  max_num_seqs: {values: [true, 64]}\n",
    "space_nvfp4.yaml": b"knobs:\n  kv_cache_dtype: {values: [auto, nvfp4]}\n",
    "gpu_syntax.yaml": b"mygpu:\n  name: [My GPU\n",
    "gpu_typo.yaml": GOOD_GPU.replace("memory_gib", "memory_gb").encode(),
    "gpu_two.yaml": (GOOD_GPU + GOOD_GPU.replace("mygpu", "other").replace("[mg]", "[og]")).encode(),
    "gpu_str.yaml": b"just a GPU name\n",
    "bnb/config.json": json.dumps({**CONFIG, "quantization_config": {"quant_method": "bitsandbytes",
                                                                     "load_in_4bit": True}}, indent=1).encode(),
    "badjson/config.json": b'{"num_hidden_layers": 2,\n "hidden_size": 128,,\n}\n',
    "g.yaml": b"engine: sim\n",
    # -- the parsers' own limits (issue 60): a number of 5,001 digits, nesting 100,000 deep, a control byte
    "digits.jsonl": b'{"prompt_tokens": 9, "output_tokens": ' + b"9" * 5001 + b"}\n",
    "deep.jsonl": b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "deep_list.json": b"[" + b"[" * 100_000 + b"]" * 100_000 + b"]\n",
    "digits/config.json": json.dumps(CONFIG).replace('"hidden_size": 128', '"hidden_size": ' + "1" * 5001).encode(),
    "slo_nan_target.yaml": b"ttft: {max_ms: 300}\ntarget: .nan\n",
    "gzipped.jsonl": b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03not really\n",
    "slo_ctrl.yaml": b"name: x\nttft: {max_ms: 300}\x01\n",
    "space_ctrl.yaml": b"knobs:\n  max_num_seqs: {values: [8, 64]}\x07\n",
    # -- YAML structure (one strict reader for every YAML file: tuner.yaml_strict)
    "slo_dup.yaml": b"ttft: {max_ms: 300}\ntpot: {max_ms: 50}\nttft: {max_ms: 900}\n",
    "space_dup.yaml": b"knobs:\n  max_num_seqs: {values: [8, 64]}\n  max_num_seqs: {values: [16]}\n",
    "space_lol.yaml": (LOL + "knobs: {max_num_seqs: {values: *i}}\n").encode(),
    "space_deep.yaml": b"knobs: " + b"[" * 500 + b"]" * 500 + b"\n",
    "space_self.yaml": b"knobs: &k {max_num_seqs: {values: [*k]}}\n",
    "gpu_dup.yaml": (GOOD_GPU + "  memory_gib: 80\n").encode(),
    # -- numbers in files
    "slo_inf.yaml": b"ttft: {max_ms: .inf}\n",
    "slo_huge.yaml": b"ttft: {max_ms: 1.0e+300}\n",
    "slo_pct_nan.yaml": b"ttft: {max_ms: 300, percentile: .nan}\n",
    "gpu_inf.yaml": GOOD_GPU.replace("bandwidth_gbs: 1000", "bandwidth_gbs: .inf").encode(),
    "gpu_zero.yaml": GOOD_GPU.replace("memory_gib: 40", "memory_gib: 0").encode(),
    "w_arrival_inf.jsonl": b'{"prompt_tokens": 9, "output_tokens": 3, "arrival_s": 0}\n'
                           b'{"prompt_tokens": 9, "output_tokens": 3, "arrival_s": Infinity}\n',
    "w_arrival_nan.jsonl": b'{"prompt_tokens": 9, "output_tokens": 3, "arrival_s": NaN}\n',
    "w_arrival_neg.jsonl": b'{"prompt_tokens": 9, "output_tokens": 3, "arrival_s": -1}\n',
    "w_huge.jsonl": b'{"prompt_tokens": 9, "output_tokens": 1000000000000}\n',
    "w_arrival.jsonl": b"".join(b'{"prompt_tokens": 90, "output_tokens": 8, "arrival_s": %d}\n' % i
                                for i in range(40)),
    # -- model profiles (a Hugging Face config.json)
    **{f"{name}/config.json": json.dumps({**CONFIG, **change}, indent=1).encode() for name, change in [
        ("m_heads0", {"num_attention_heads": 0}), ("m_layers_neg", {"num_hidden_layers": -2}),
        ("m_vocab_huge", {"vocab_size": 10 ** 15}), ("m_hidden_div", {"hidden_size": 130}),
        ("m_kv_div", {"num_key_value_heads": 3}), ("m_hidden_float", {"hidden_size": 128.5}),
        ("m_rope_inf", {"rope_scaling": {"rope_type": "linear", "factor": 1e999}})]},
    "m_nan/config.json": json.dumps(CONFIG, indent=1).replace("128", "NaN").encode(),
    # -- search spaces: constraints, sizes
    "space_rhs.yaml": b"knobs:\n  max_num_seqs: {values: [8, 64]}\nconstraints:\n  - max_num_seqs <= max_num_tokens\n",
    "space_lhs.yaml": b"knobs:\n  max_num_seqs: {values: [8, 64]}\nconstraints:\n  - max_seqs <= 64\n",
    "space_ctype.yaml": b"knobs:\n  max_num_seqs: {values: [8, 64]}\nconstraints:\n  - kv_cache_dtype >= 8\n",
    "space_cnan.yaml": b"knobs:\n  max_num_seqs: {values: [8, 64]}\nconstraints:\n  - max_num_seqs <= nan\n",
    "space_cint.yaml": b"knobs:\n  max_num_seqs: {values: [8, 64]}\nconstraints: [3]\n",
    "space_big.yaml": BIG_SPACE.encode(),
    # -- gate files
    "gate_req0.yaml": (GATE + "load: {requests: 0}\n").encode(),
    "gate_cap_nan.yaml": GATE.replace("capacity_rps: 5", "capacity_rps: .nan").encode(),
    "gate_load_key.yaml": (GATE + "load: {rps: 5}\n").encode(),
    "gate_timeout_inf.yaml": (GATE + "load: {request_timeout_s: .inf}\n").encode(),
    "gate_dup.yaml": (GATE + "capacity_rps: 6\n").encode(),
    "gate_tol.yaml": (GATE + "tolerance: 1.5\n").encode(),
    "gate_ok.yaml": (GATE + "load: {requests: 50}\n").encode(),
    "gate_kl.yaml": (GATE + "quality:\n  reference: {path: r.json, sha256: x}\n  bound: {max_kl: -1}\n").encode(),
    "gate_bound_key.yaml": (GATE + "quality:\n  reference: {path: r.json, sha256: x}\n  bound: {max_k: 1}\n"
                            ).encode(),
    "gate_schema.yaml": (GATE + "schema_version: 99\n").encode(),
    "gatedir/README": b"a folder, not a gate\n",
    # -- stored studies
    "corrupt/study.db": bytes(range(256)) * 16,
    "truncated/study.db": b"SQLite format 3\x00" + b"\x00" * 84,
    "emptydir/.keep": b"",
    "w_dup.jsonl": b'{"prompt_tokens": 9, "output_tokens": 3}\n'
                   b'{"prompt_tokens": 9, "output_tokens": 3, "output_tokens": 900}\n',
    "m_dup/config.json": json.dumps(CONFIG, indent=1).replace('"vocab_size": 1000',
                                                             '"vocab_size": 1000, "vocab_size": 9').encode(),
    "gate_engine.yaml": GATE.replace("engine: sim", "engine: tgi").encode(),
    "space_knob_huge.yaml": b"knobs:\n  max_num_seqs: {values: [8, 100000000000000]}\n",
    "space_host_gpus.yaml": b"host_gpus: 100000000\nknobs:\n  tensor_parallel_size: {values: [1, 2]}\n",
    # -- a real engine's model (issue 58): a GGUF that is not one, a folder whose weights are not safetensors
    "broken.gguf": b"GGUX" + b"\0" * 60,
    "badweights/config.json": json.dumps(CONFIG).encode(),
    "badweights/model.safetensors": b"\xff" * 8 + b"{}",
}

EXAMPLE_RUN = ROOT / "reports" / "chat-rtx4090-qwen2.5-7b"  # the shipped example study (read, never written)
TUNE = ["--workload", str(WORKLOAD), "--slo", str(SLO), "--engine", "sim", "--gpu", GPU, "--model", MODEL,
        "--search-space", str(SPACE2), "--max-trials", "1", "--out", "run"]


def tune_with(**over: str | None) -> list[str]:
    """`tune` with the valid arguments above, each `--option` in `over` replaced (None: dropped) or added."""
    args = dict(zip(TUNE[::2], TUNE[1::2]))
    for k, v in over.items():
        key = "--" + k.replace("_", "-")
        if v is None:
            args.pop(key, None)
        else:
            args[key] = v
    return [x for kv in args.items() for x in kv]


# (id, argv after `tune`, what the line must contain)
CASES: list[tuple[str, list[str], list[str]]] = [
    # -- tune options
    ("out-is-a-file", tune_with(out="afile"), ["afile", "--out", "is a file, not a directory"]),
    ("out-under-a-file", tune_with(out="afile/run"), ["--out", "afile is a file"]),
    ("precision-negative", tune_with(precision="-1"), ["--precision: must be > 0"]),
    ("precision-above-1", tune_with(precision="1.5"), ["--precision: must be <= 1"]),
    ("precision-nan", tune_with(precision="nan"), ["--precision: must be a finite number"]),
    ("requests-per-run-negative", tune_with(requests_per_run="-5"), ["--requests-per-run: must be >= 1"]),
    ("max-trials-zero", tune_with(max_trials="0"), ["--max-trials: must be >= 1"]),
    ("max-trials-not-a-number", tune_with(max_trials="many"), ["--max-trials"]),
    ("noise-negative", tune_with(noise="-1"), ["--noise: must be >= 0"]),
    ("arrival-unknown", tune_with(arrival="weird"), ["--arrival: unknown arrival 'weird'", "gamma"]),
    ("arrival-trace-without-times", tune_with(arrival="trace"), ["--arrival", "arrival times"]),
    ("start-rate-zero", tune_with(start_rate="0"), ["--start-rate: must be > 0"]),
    ("max-run-s-negative", tune_with(max_run_s="-1"), ["--max-run-s: must be > 0"]),
    ("time-budget-zero", tune_with(time_budget="0"), ["--time-budget: must be > 0"]),
    ("time-scale-zero", tune_with(engine="sim-http", time_scale="0"), ["--time-scale: must be > 0"]),
    ("seed-negative", tune_with(seed="-1"), ["--seed: must be >= 0"]),
    ("strategy-unknown", tune_with(strategy="anneal"), ["--strategy: unknown strategy 'anneal'", "guided"]),
    ("engine-unknown", tune_with(engine="tgi"), ["--engine: unknown engine 'tgi'", "sim-http"]),
    ("search-space-unknown", tune_with(search_space="nope"), ["--search-space: unknown search space 'nope'",
                                                              "default"]),
    ("sim-without-gpu", tune_with(gpu=None), ["--engine sim needs --gpu"]),
    ("vllm-arg-two-in-one", [*tune_with(), "--vllm-arg", "--dtype float16"],
     ["--vllm-arg", "two arguments", "--vllm-arg=--dtype=float16"]),
    ("vllm-arg-unknown-flag", [*tune_with(), "--vllm-arg=--no-such-flag"], ["--vllm-arg", "--no-such-flag"]),
    ("vllm-arg-is-a-knob", [*tune_with(), "--vllm-arg=--max-num-seqs=4"], ["--vllm-arg", "is a knob"]),
    # -- workload files
    ("workload-missing", tune_with(workload="nope.jsonl"), ["nope.jsonl", "no such file"]),
    ("workload-not-utf8", tune_with(workload="bad_utf8.jsonl"), ["bad_utf8.jsonl:2: not UTF-8"]),
    ("workload-bad-record", tune_with(workload="bad_record.jsonl"), ["bad_record.jsonl:2:", "output_tokens"]),
    # -- SLO files
    ("slo-bool-is-not-a-number", tune_with(slo="slo_bool.yaml"), ["slo_bool.yaml:2:", "ttft.max_ms",
                                                                  "must be a number"]),
    ("slo-string-is-not-a-number", tune_with(slo="slo_str.yaml"), ["slo_str.yaml:1:", "ttft_ms",
                                                                   "must be a number"]),
    ("slo-negative", tune_with(slo="slo_neg.yaml"), ["slo_neg.yaml:3:", "tpot.max_ms", "must be > 0"]),
    ("slo-not-utf8", tune_with(slo="slo_utf8.yaml"), ["slo_utf8.yaml:2: not UTF-8"]),
    ("slo-yaml-syntax", tune_with(slo="slo_syntax.yaml"), ["slo_syntax.yaml:", "invalid YAML"]),
    # -- search-space files
    ("space-kv-dtype-not-vllm", tune_with(search_space="space_kv.yaml"),
     ["space_kv.yaml:3:", "knobs.kv_cache_dtype", "'int3'", "not a vLLM 0.32 choice"]),
    ("space-quantization-not-vllm", tune_with(search_space="space_quant.yaml"),
     ["space_quant.yaml:2:", "knobs.quantization", "'gguf'"]),
    ("space-unknown-knob", tune_with(search_space="space_typo.yaml"),
     ["space_typo.yaml:4:", "unknown knob 'max_num_sequences'"]),
    ("space-bool-is-not-a-number", tune_with(search_space="space_bool.yaml"),
     ["space_bool.yaml:2:", "knobs.max_num_seqs", "must be an integer"]),
    ("space-not-simulated", tune_with(search_space="space_nvfp4.yaml"),
     ["space_nvfp4.yaml", "knobs.kv_cache_dtype", "not modelled by the simulated engines"]),
    # -- GPU profiles
    ("gpu-yaml-syntax", tune_with(gpu="gpu_syntax.yaml"), ["gpu_syntax.yaml:", "invalid YAML"]),
    ("gpu-unknown-field-first", tune_with(gpu="gpu_typo.yaml"),
     ["gpu_typo.yaml:4:", "memory_gb", "unknown field"]),
    ("gpu-two-profiles", tune_with(gpu="gpu_two.yaml"), ["gpu_two.yaml:1:", "2 profiles"]),
    ("gpu-not-a-mapping", tune_with(gpu="gpu_str.yaml"), ["gpu_str.yaml:1:", "expected a mapping"]),
    ("gpu-missing-file", tune_with(gpu="./nope.yaml"), ["nope.yaml", "--gpu", "no such file"]),
    ("gpu-unknown-name", tune_with(gpu="gtx480"), ["--gpu", "unknown GPU 'gtx480'"]),
    # -- model profiles
    ("model-missing-path", tune_with(model="./no-model"), ["no-model", "--model", "no such file or folder"]),
    ("model-unknown-name", tune_with(model="gpt-5"), ["--model", "unknown model 'gpt-5'"]),
    ("model-bitsandbytes", tune_with(model="bnb"), ["bnb/config.json", "quantization_config.quant_method",
                                                    "bitsandbytes", "not supported"]),
    ("model-bad-json", tune_with(model="badjson"), ["badjson/config.json:2:", "not valid JSON"]),
    ("model-gguf-not-gguf", tune_with(engine="vllm", gpu=None, model="broken.gguf"),
     ["broken.gguf", "--model", "not a GGUF file"]),
    ("model-weights-not-safetensors", tune_with(engine="vllm", gpu=None, model="badweights"),
     ["badweights/model.safetensors", "not a safetensors file", "header length"]),
    ("model-config-huge-integer", tune_with(model="digits"), ["digits/config.json", "more than 4,300 digits"]),
    ("workload-huge-integer", tune_with(workload="digits.jsonl"), ["digits.jsonl:1:", "more than 4,300 digits"]),
    ("workload-nested-deep", tune_with(workload="deep.jsonl"), ["deep.jsonl:1:", "nested too deep"]),
    ("workload-list-nested-deep", tune_with(workload="deep_list.json"), ["deep_list.json:1:", "nested too deep"]),
    ("slo-target-nan", tune_with(slo="slo_nan_target.yaml"), ["slo_nan_target.yaml:2:", "target: must be a finite number"]),
    ("workload-gzip-without-gz-name", tune_with(workload="gzipped.jsonl"), ["gzipped.jsonl", "gzip-compressed data"]),
    ("slo-control-byte", tune_with(slo="slo_ctrl.yaml"), ["slo_ctrl.yaml:2:", "control character (#x0001)"]),
    ("space-control-byte", tune_with(search_space="space_ctrl.yaml"), ["space_ctrl.yaml:2:", "#x0007"]),
    # -- tune plan / report / gate / workload
    ("plan-tokens-per-s-negative", ["plan", "--tokens-per-s", "-5", "--mean-output-tokens", "10",
                                    "--peak-rate", "10"], ["--tokens-per-s: must be a number > 0"]),
    ("plan-quantization-not-vllm", ["plan", "--rate-per-instance", "5", "--peak-rate", "10", "--gpu", GPU,
                                    "--model", MODEL, "--quantization", "gguf"], ["--quantization"]),
    ("plan-headroom-above-1", ["plan", "--rate-per-instance", "5", "--peak-rate", "10", "--headroom", "2"],
     ["--headroom"]),
    ("plan-gpu-typo", ["plan", "--rate-per-instance", "5", "--peak-rate", "10", "--gpu", "gpu_typo.yaml",
                       "--model", MODEL], ["gpu_typo.yaml:4:", "memory_gb"]),
    ("report-no-run-dir", ["report", "no-run"], ["no-run", "no such run directory"]),
    ("report-not-a-run-dir", ["report", ".", "--out", "report"], ["not a run directory"]),
    ("gate-missing-file", ["gate", "nogate.yaml"], ["nogate.yaml", "no such file"]),
    ("gate-engine-unknown", ["gate", "g.yaml", "--engine", "tgi"], ["--engine: unknown engine 'tgi'"]),
    ("gate-junit-under-a-file", ["gate", "g.yaml", "--junit", "afile/junit.xml"], ["--junit", "is a file"]),
    ("synth-requests-negative", ["workload", "synth", "--kind", "chat", "--requests", "-5", "--out", "w.jsonl"],
     ["--requests: must be >= 1"]),
    ("synth-kind-unknown", ["workload", "synth", "--kind", "poem", "--out", "w.jsonl"], ["--kind", "'poem'"]),
    ("synth-seed-negative", ["workload", "synth", "--kind", "chat", "--seed", "-1", "--out", "w.jsonl"],
     ["--seed: must be >= 0"]),
    ("synth-out-under-a-file", ["workload", "synth", "--kind", "chat", "--out", "afile/w.jsonl"],
     ["--out", "is a file"]),
    ("inspect-not-utf8", ["workload", "inspect", "bad_utf8.jsonl"], ["bad_utf8.jsonl:2: not UTF-8"]),
    ("inspect-model-missing", ["workload", "inspect", str(WORKLOAD), "--model", "/nonexistent/model"],
     ["--model", "/nonexistent/model: no such file or folder"]),
    ("inspect-model-without-tokenizer", ["workload", "inspect", str(WORKLOAD), "--model", "emptydir"],
     ["--model", "emptydir: no tokenizer.json"]),
    ("check-slo-bool", ["workload", "check-slo", "slo_bool.yaml"], ["slo_bool.yaml:2:", "must be a number"]),
    # -- output folders and files (created and removed once to prove they can be written)
    ("out-in-proc", tune_with(out="/proc/x"), ["/proc/x", "--out", "cannot create"]),
    ("out-in-proc-deeper", tune_with(out="/proc/x/y/run"), ["--out", "cannot create"]),
    # -- an option given without the option it acts with (tuner.cli.needs)
    ("vllm-python-with-sim", [*tune_with(), "--vllm-python", "/usr/bin/python3"],
     ["--vllm-python: acts only with --engine vllm"]),
    ("time-scale-with-sim", tune_with(time_scale="2"), ["--time-scale: acts only with --engine sim-http"]),
    ("slo-missing", tune_with(slo=None), ["--slo: give --workload and --slo"]),
    ("plan-verify-overlong-workload", ["plan", str(EXAMPLE_RUN), "--verify", "--workload", "overlong.jsonl"],
     ["overlong.jsonl", "exceed the 32,768-token context", "--drop-overlong"]),
    ("plan-policy-without-verify", ["plan", str(EXAMPLE_RUN), "--policy", "random"], ["--policy: acts only with --verify"]),
    ("plan-stop-replica-without-real-router", ["plan", str(EXAMPLE_RUN), "--verify", "--stop-replica-at", "3"],
     ["--stop-replica-at: acts only with --real-router"]),
    ("bench-lora-assignment-without-modules", ["bench", "--url", "http://127.0.0.1:9", "--workload", str(WORKLOAD),
                                               "--lora-assignment", "round-robin"],
     ["--lora-assignment: acts only with --lora-modules"]),
    ("bench-json-is-a-dir", ["bench", "--url", "http://127.0.0.1:9", "--workload", str(WORKLOAD), "--json", "emptydir"],
     ["emptydir", "--json", "is a directory"]),
    ("bench-json-under-a-file", ["bench", "--url", "http://127.0.0.1:9", "--workload", str(WORKLOAD), "--json",
                                 "afile/r.json"], ["--json"]),
    ("bench-save-run-under-a-file", ["bench", "--url", "http://127.0.0.1:9", "--workload", str(WORKLOAD),
                                     "--save-run", "afile/run"], ["--save-run", "afile is a file"]),
    # -- storage URLs
    ("storage-unknown-scheme", tune_with(storage="bogus://x"), ["--storage", "unknown database kind 'bogus'"]),
    ("storage-not-a-url", tune_with(storage="nothing"), ["--storage", "not a database URL"]),
    ("storage-unreachable", tune_with(storage="postgresql://127.0.0.1:1/x"), ["--storage", "postgresql"]),
    ("storage-in-memory", tune_with(storage="sqlite://"), ["--storage", "in-memory"]),
    ("storage-under-a-file", tune_with(storage="sqlite:///afile/study.db"), ["afile", "--storage", "is a file"]),
    # -- stored studies
    ("resume-empty-folder", [*tune_with(out="emptydir"), "--resume"], ["--resume", "no study to resume"]),
    ("resume-no-folder", [*tune_with(out="nothere"), "--resume"], ["--resume", "no study to resume"]),
    ("resume-corrupt-db", [*tune_with(out="corrupt"), "--resume"], ["corrupt/study.db", "not a study database"]),
    ("new-study-over-corrupt-db", tune_with(out="corrupt"), ["corrupt/study.db", "--out", "not a study database"]),
    ("resume-truncated-db", [*tune_with(out="truncated"), "--resume"], ["truncated/study.db", "study database"]),
    ("worker-corrupt-db", ["worker", "--out", "corrupt"], ["corrupt/study.db", "not a study database"]),
    ("worker-empty-folder", ["worker", "--out", "emptydir"], ["--out", "no study in emptydir"]),
    ("worker-bogus-storage", ["worker", "--out", "emptydir", "--storage", "bogus://x"], ["--storage", "'bogus'"]),
    # -- model profile fields: positive, finite, bounded, divisible as vLLM requires
    ("model-heads-zero", tune_with(model="m_heads0"), ["m_heads0/config.json:", "num_attention_heads: must be >= 1"]),
    ("model-layers-negative", tune_with(model="m_layers_neg"), ["num_hidden_layers: must be >= 1"]),
    ("model-vocab-huge", tune_with(model="m_vocab_huge"), ["vocab_size: must be <="]),
    ("model-hidden-not-divisible", tune_with(model="m_hidden_div"), ["hidden_size", "not divisible", "heads"]),
    ("model-heads-not-divisible-by-kv", tune_with(model="m_kv_div"), ["num_key_value_heads", "not divisible"]),
    ("model-hidden-not-whole", tune_with(model="m_hidden_float"), ["hidden_size", "integer"]),
    ("model-nan", tune_with(model="m_nan"), ["m_nan/config.json:", "hidden_size"]),
    ("model-rope-factor-inf", tune_with(model="m_rope_inf"), ["rope_scaling.factor", "finite"]),
    # -- GPU profile fields
    ("gpu-bandwidth-inf", tune_with(gpu="gpu_inf.yaml"), ["gpu_inf.yaml:5:", "bandwidth_gbs", "finite"]),
    ("gpu-memory-zero", tune_with(gpu="gpu_zero.yaml"), ["gpu_zero.yaml:4:", "memory_gib: must be > 0"]),
    # -- space constraints (both sides, types) and sizes
    ("space-constraint-unknown-rhs", tune_with(search_space="space_rhs.yaml"),
     ["space_rhs.yaml:4:", "constraints.0", "unknown knob 'max_num_tokens'"]),
    ("space-constraint-unknown-lhs", tune_with(search_space="space_lhs.yaml"),
     ["space_lhs.yaml:4:", "unknown knob 'max_seqs'"]),
    ("space-constraint-not-numeric", tune_with(search_space="space_ctype.yaml"),
     ["space_ctype.yaml:4:", "kv_cache_dtype is not a number"]),
    ("space-constraint-nan", tune_with(search_space="space_cnan.yaml"), ["space_cnan.yaml:4:", "'nan'"]),
    ("space-constraint-not-a-string", tune_with(search_space="space_cint.yaml"), ["space_cint.yaml", "constraints"]),
    ("space-grid-too-large", tune_with(search_space="space_big.yaml", strategy="grid"),
     ["--strategy", "10,000,000 configurations", "at most 10,000"]),
    # -- YAML structure: duplicate keys, alias bombs, depth
    ("slo-duplicate-key", tune_with(slo="slo_dup.yaml"), ["slo_dup.yaml:3:", "duplicate key 'ttft'", "line 1"]),
    ("space-duplicate-knob", tune_with(search_space="space_dup.yaml"), ["space_dup.yaml:3:", "duplicate key"]),
    ("gpu-duplicate-field", tune_with(gpu="gpu_dup.yaml"), ["gpu_dup.yaml:9:", "duplicate key 'memory_gib'"]),
    ("space-billion-laughs", tune_with(search_space="space_lol.yaml"), ["space_lol.yaml:", "aliases expand"]),
    ("space-nested-too-deep", tune_with(search_space="space_deep.yaml"), ["space_deep.yaml", "nested"]),
    ("space-alias-to-itself", tune_with(search_space="space_self.yaml"), ["space_self.yaml", "refers to itself"]),
    ("check-slo-duplicate-key", ["workload", "check-slo", "slo_dup.yaml"], ["slo_dup.yaml:3:", "duplicate key"]),
    # -- gate files: as strict as the study's own options
    ("gate-requests-zero", ["gate", "gate_req0.yaml"], ["gate_req0.yaml:8:", "load.requests: must be >= 1"]),
    ("gate-capacity-nan", ["gate", "gate_cap_nan.yaml"], ["gate_cap_nan.yaml:7:", "capacity_rps"]),
    ("gate-load-unknown-key", ["gate", "gate_load_key.yaml"], ["load.rps", "unknown key"]),
    ("gate-timeout-inf", ["gate", "gate_timeout_inf.yaml"], ["load.request_timeout_s", "finite"]),
    ("gate-duplicate-key", ["gate", "gate_dup.yaml"], ["gate_dup.yaml:8:", "duplicate key 'capacity_rps'"]),
    ("gate-tolerance-above-1", ["gate", "gate_tol.yaml"], ["gate_tol.yaml:8:", "tolerance: must be < 1"]),
    ("gate-is-a-directory", ["gate", "gatedir"], ["gatedir", "is a directory"]),
    ("gate-quality-bound-negative", ["gate", "gate_kl.yaml"], ["gate_kl.yaml:10:", "quality.bound.max_kl"]),
    ("gate-quality-bound-unknown-key", ["gate", "gate_bound_key.yaml"], ["quality.bound.max_k"]),
    ("gate-schema-unknown", ["gate", "gate_schema.yaml"], ["gate_schema.yaml:8:", "schema_version"]),
    # -- numbers: 0, negative, NaN, infinity, huge
    ("max-trials-huge", tune_with(max_trials="100000000000"), ["--max-trials: must be <= 100000"]),
    ("requests-per-run-huge", tune_with(requests_per_run="1000000000000"), ["--requests-per-run: must be <="]),
    ("start-rate-inf", tune_with(start_rate="inf"), ["--start-rate: must be a finite number"]),
    ("start-rate-huge", tune_with(start_rate="1e300"), ["--start-rate: must be <="]),
    ("time-budget-nan", tune_with(time_budget="nan"), ["--time-budget: must be a finite number"]),
    ("seed-huge", tune_with(seed="99999999999999"), ["--seed: must be <="]),
    ("noise-inf", tune_with(noise="inf"), ["--noise: must be a finite number"]),
    ("slo-threshold-inf", tune_with(slo="slo_inf.yaml"), ["slo_inf.yaml:1:", "ttft.max_ms", "finite"]),
    ("slo-threshold-huge", tune_with(slo="slo_huge.yaml"), ["slo_huge.yaml:1:", "ttft.max_ms: must be <="]),
    ("slo-percentile-nan", tune_with(slo="slo_pct_nan.yaml"), ["slo_pct_nan.yaml:1:", "percentile"]),
    ("workload-arrival-inf-trace", tune_with(workload="w_arrival_inf.jsonl", arrival="trace"),
     ["w_arrival_inf.jsonl:2:", "arrival_s: must be a finite number"]),
    ("workload-arrival-nan", tune_with(workload="w_arrival_nan.jsonl"), ["w_arrival_nan.jsonl:1:", "arrival_s"]),
    ("workload-arrival-negative", tune_with(workload="w_arrival_neg.jsonl"), ["arrival_s: must be >= 0"]),
    ("workload-output-huge", tune_with(workload="w_huge.jsonl"), ["w_huge.jsonl:1:", "output_tokens: must be <="]),
    ("bench-num-prompts-zero", ["bench", "--url", "http://127.0.0.1:9", "--workload", str(WORKLOAD),
                                "--num-prompts", "0"], ["--num-prompts"]),
    ("bench-timeout-nan", ["bench", "--url", "http://127.0.0.1:9", "--workload", str(WORKLOAD),
                           "--request-timeout", "nan"], ["--request-timeout", "finite"]),
    ("bench-rate-nan", ["bench", "--url", "http://127.0.0.1:9", "--workload", str(WORKLOAD),
                        "--request-rate", "nan"], ["--request-rate"]),
    ("synth-requests-huge", ["workload", "synth", "--kind", "chat", "--requests", "100000000000", "--out",
                             "w.jsonl"], ["--requests: must be <="]),
    ("synth-out-in-proc", ["workload", "synth", "--kind", "chat", "--out", "/proc/w.jsonl"],
     ["/proc/w.jsonl", "--out", "cannot create"]),
    ("plan-rate-tiny-peak-huge", ["plan", "--rate-per-instance", "1e-300", "--peak-rate", "1e300"],
     ["--rate-per-instance: must be between"]),
    ("report-out-in-proc", ["report", str(EXAMPLE_RUN), "--out", "/proc/x"], ["--out", "cannot create"]),
    ("report-corrupt-db", ["report", "corrupt"], ["corrupt/study.db", "not an SQLite database"]),
    ("workload-duplicate-key", tune_with(workload="w_dup.jsonl"), ["w_dup.jsonl:2:", "output_tokens", "twice"]),
    ("model-duplicate-key", tune_with(model="m_dup"), ["m_dup/config.json:", "vocab_size", "twice"]),
    ("space-knob-value-huge", tune_with(search_space="space_knob_huge.yaml"),
     ["space_knob_huge.yaml:2:", "knobs.max_num_seqs", "must be <="]),
    ("space-host-gpus-huge", tune_with(search_space="space_host_gpus.yaml"), ["host_gpus", "must be <="]),
    ("worker-max-trials-zero", ["worker", "--out", "emptydir", "--max-trials", "0"], ["--max-trials"]),
    ("worker-idle-exit-nan", ["worker", "--out", "emptydir", "--idle-exit", "nan"], ["--idle-exit"]),
    ("workload-is-a-device", tune_with(workload="/dev/zero"), ["/dev/zero", "is a device"]),
    ("slo-endless-file", tune_with(slo="/dev/zero"), ["/dev/zero", "larger than 8 MiB"]),
    ("gate-engine-unknown-in-file", ["gate", "gate_engine.yaml"], ["gate_engine.yaml:1:", "unknown engine 'tgi'"]),
    ("vllm-python-missing", [*tune_with(engine="vllm", gpu=None, model="x", strategy="guided"),
                             "--vllm-python", "/no/such/python"], ["--vllm-python", "no such interpreter"]),
    ("vllm-command-missing", [*tune_with(engine="vllm", gpu=None, model="x", strategy="guided"),
                              "--vllm-command", "no-such-wrapper {port} {args}"], ["--vllm-command", "not a program"]),
    ("bench-seed-negative", ["bench", "--url", "http://127.0.0.1:9", "--workload", str(WORKLOAD),
                             "--seed", "-1"], ["--seed"]),
    # -- empty values: Path("") is the working directory
    ("out-empty", tune_with(out=""), ["--out: an empty value"]),
    ("slo-empty-equals", [*tune_with(slo=None), "--slo="], ["--slo: an empty value"]),
    ("report-empty-argument", ["report", ""], ["argument 2 is empty"]),
]


def _write_inputs(root: Path) -> None:
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def check_line(rc: int, out: str, err: str, expected: list[str]) -> None:
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), lines[0]
    for e in expected:
        assert e in lines[0], (e, lines[0])


@pytest.mark.parametrize("argv,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                              argv: list[str], expected: list[str]) -> None:
    from tuner.cli import main

    _write_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["tune", *argv])
    monkeypatch.setenv("COLUMNS", "200")  # usage errors on one line
    before = _tree(tmp_path)
    with pytest.raises(SystemExit) as e:
        main()
    cap = capsys.readouterr()
    check_line(e.value.code, cap.out, cap.err, expected)
    assert _tree(tmp_path) == before, "a rejected command must create nothing"


def test_table_is_wide() -> None:
    assert len(CASES) >= 80 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", ["precision-negative", "out-under-a-file", "gpu-unknown-field-first"])
def test_bad_input_as_a_real_process(tmp_path: Path, case: str) -> None:
    """The installed `tune`, run by a shell, says the same in the same one line."""
    argv, expected = next(c[1:] for c in CASES if c[0] == case)
    _write_inputs(tmp_path)
    before = _tree(tmp_path)
    p = tune(*argv, cwd=tmp_path, timeout=120)
    check_line(p.returncode, p.stdout, p.stderr, expected)
    assert _tree(tmp_path) == before


class PastValidation(Exception):
    """Raised by the first step after every check (opening the study, running the gate, asking the
    server for its model): the corrected command got there, so nothing in its input was refused."""


#: For one case of each family, the command with its mistake corrected: it must get past every check.
CORRECTED: dict[str, list[str]] = {
    "out-in-proc": tune_with(out="fresh"),
    "storage-unknown-scheme": tune_with(storage="sqlite:///fresh.db"),
    "new-study-over-corrupt-db": tune_with(out="fresh"),
    "resume-empty-folder": tune_with(out="emptydir"),
    "model-heads-zero": tune_with(model=MODEL),
    "gpu-bandwidth-inf": tune_with(gpu="mygpu.yaml"),
    "space-constraint-unknown-rhs": tune_with(search_space="space_rhs_fixed.yaml"),
    "space-grid-too-large": tune_with(strategy="grid"),
    "slo-duplicate-key": tune_with(slo="slo_fixed.yaml"),
    "gate-requests-zero": ["gate", "gate_ok.yaml"],
    "gate-is-a-directory": ["gate", "gate_ok.yaml"],
    "max-trials-huge": tune_with(max_trials="100000"),
    "workload-arrival-inf-trace": tune_with(workload="w_arrival.jsonl", arrival="trace"),
    "bench-json-is-a-dir": ["bench", "--url", "http://127.0.0.1:9", "--workload", str(WORKLOAD), "--json",
                            "emptydir/result.json"],
}
FIXED_FILES = {"mygpu.yaml": GOOD_GPU.encode(), "slo_fixed.yaml": b"ttft: {max_ms: 900}\ntpot: {max_ms: 50}\n",
               "space_rhs_fixed.yaml": FILES["space_rhs.yaml"].replace(b"max_num_tokens", b"max_num_batched_tokens")}


def test_every_family_has_a_corrected_command() -> None:
    ids = {c[0] for c in CASES}
    assert set(CORRECTED) <= ids
    families = ("out-", "storage-", "corrupt-db", "resume-", "model-", "gpu-", "space-constraint", "grid",
                "duplicate-key", "gate-", "max-trials", "arrival", "bench-")
    assert all(any(f in k for k in CORRECTED) for f in families)


@pytest.mark.parametrize("case", list(CORRECTED))
def test_the_corrected_command_gets_past_validation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture, case: str) -> None:
    """The bad command is refused; the same command with its mistake corrected is not (it reaches the
    study, the gate or the server): the table's refusals are of the mistake, not of the command."""
    import tuner.cli.bench
    import tuner.gate
    import tuner.study
    from tuner.cli import main

    def past(*_a, **_k):
        raise PastValidation()

    _write_inputs(tmp_path)
    for name, data in FIXED_FILES.items():
        (tmp_path / name).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    argv, expected = next(c[1:] for c in CASES if c[0] == case)
    monkeypatch.setattr(sys, "argv", ["tune", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    check_line(e.value.code, *capsys.readouterr(), expected)
    monkeypatch.setattr(tuner.study, "open_study", past)
    monkeypatch.setattr(tuner.gate, "run_gate", past)
    monkeypatch.setattr(tuner.cli.bench, "_served", past)  # the first call that reaches the server
    monkeypatch.setattr(sys, "argv", ["tune", *CORRECTED[case]])
    with pytest.raises(PastValidation):
        main()
    assert "error" not in capsys.readouterr().err


def test_a_corrected_command_runs_to_the_end(tmp_path: Path) -> None:
    """One corrected command run for real (the simulated engine, one launch): exit 0 and its outputs, in
    the folder a refused command left empty."""
    _write_inputs(tmp_path)
    (tmp_path / "slo_fixed.yaml").write_bytes(FIXED_FILES["slo_fixed.yaml"])
    p = tune(*tune_with(slo="slo_dup.yaml", out="emptydir"), cwd=tmp_path, timeout=300)
    check_line(p.returncode, p.stdout, p.stderr, ["duplicate key"])
    assert sorted(x.name for x in (tmp_path / "emptydir").iterdir()) == [".keep"]
    p = tune(*tune_with(slo="slo_fixed.yaml", out="emptydir", strategy="guided"), "--no-confirm", cwd=tmp_path,
             timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (tmp_path / "emptydir" / "study.db").exists() and (tmp_path / "emptydir" / "report.md").exists()


def _run_main(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> int:
    from tuner.cli import main

    monkeypatch.setattr(sys, "argv", ["tune", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    return e.value.code


def test_a_mistake_found_after_the_folder_was_made_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """A check that can only run once the study is open (here: the first launch refuses) still leaves no
    study behind: the corrected command is not told "a study already exists here"."""
    import tuner.study
    from tuner.errors import UserError

    def refuse(*_a, **_k):
        raise UserError("a mistake only the run can find", field="--model")

    _write_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tuner.study, "TrialRunner", refuse)
    assert _run_main(monkeypatch, tune_with(out="late")) == 2
    assert "a mistake only the run can find" in capsys.readouterr().err
    assert not (tmp_path / "late").exists()
    assert _run_main(monkeypatch, tune_with(out="emptydir")) == 2
    assert sorted(p.name for p in (tmp_path / "emptydir").iterdir()) == [".keep"]


def test_an_interrupt_before_the_study_exists_does_not_claim_it_was_saved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import tuner.study

    def interrupt(*_a, **_k):
        raise KeyboardInterrupt

    _write_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tuner.study, "open_study", interrupt)
    assert _run_main(monkeypatch, tune_with(out="cut")) == 130
    err = capsys.readouterr().err
    assert "nothing was saved" in err and "--resume" not in err and "is saved" not in err
    assert not (tmp_path / "cut").exists()


@pytest.mark.parametrize("db", ["empty", "other-tool", "not-sqlite"])
def test_a_read_only_command_never_writes_into_a_study_it_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture, db: str) -> None:
    """Issue 60: Optuna creates its tables in any SQLite file it opens, so `tune report` and `tune plan` on a
    run whose study.db is empty or another tool's wrote 114,688 bytes into it before refusing it."""
    import hashlib
    import sqlite3

    run = tmp_path / "run"
    run.mkdir()
    f = run / "study.db"
    if db == "empty":
        f.write_bytes(b"")
    elif db == "other-tool":
        con = sqlite3.connect(f)
        con.execute("CREATE TABLE notes (x TEXT)")
        con.commit()
        con.close()
    else:
        f.write_bytes(b"just some text, not a database\n" * 10)
    digest = hashlib.sha256(f.read_bytes()).hexdigest()
    monkeypatch.chdir(tmp_path)
    for argv in (["report", "run", "--out", "rep"], ["plan", "run"], ["plan", "run", "--verify"]):
        before = _tree(tmp_path)
        assert _run_main(monkeypatch, argv) == 2, argv
        err = capsys.readouterr().err
        check_line(2, "", err, ["study.db", "not a"])
        assert _tree(tmp_path) == before, argv
        assert hashlib.sha256(f.read_bytes()).hexdigest() == digest, f"{argv} wrote into {f}"
