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

from tests.e2e.conftest import GPU, MODEL, SLO, SPACE2, WORKLOAD, tune

pytestmark = pytest.mark.e2e

GOOD_GPU = ("mygpu:\n  name: My GPU\n  aliases: [mg]\n  memory_gib: 40\n  bandwidth_gbs: 1000\n"
            "  bf16_tflops: 200\n  fp8_tflops: 400\n  fp8_native: true\n")
CONFIG = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 256, "vocab_size": 1000, "max_position_embeddings": 2048}

#: Input files every case finds in its working directory (bytes: some are not UTF-8 on purpose).
FILES: dict[str, bytes] = {
    "afile": b"not a directory\n",
    "bad_utf8.jsonl": b'{"prompt_tokens": 9, "output_tokens": 3}\n{"prompt": "caf\xe9", "output_tokens": 3}\n',
    "bad_record.jsonl": b'{"prompt_tokens": 9, "output_tokens": 3}\n{"prompt_tokens": 9, "output_tokens": 0}\n',
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
}

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
    ("check-slo-bool", ["workload", "check-slo", "slo_bool.yaml"], ["slo_bool.yaml:2:", "must be a number"]),
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
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", ["precision-negative", "out-under-a-file", "gpu-unknown-field-first"])
def test_bad_input_as_a_real_process(tmp_path: Path, case: str) -> None:
    """The installed `tune`, run by a shell, says the same in the same one line."""
    argv, expected = next(c[1:] for c in CASES if c[0] == case)
    _write_inputs(tmp_path)
    before = _tree(tmp_path)
    p = tune(*argv, cwd=tmp_path, timeout=120)
    check_line(p.returncode, p.stdout, p.stderr, expected)
    assert _tree(tmp_path) == before
