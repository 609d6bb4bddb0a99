"""Read a server's start-up log: why a launch failed, and what a healthy one said about its KV cache.

The search must tell a *bad configuration* (utilisation too high, KV too small for max_model_len, a flag
value the build rejects) from a *broken* run, and learn from it: an OOM at 0.95 rules out 0.97. vLLM's
messages are stable enough to match (REFERENCE.md section 3), but a failing launch prints the root cause
once or twice deep in a worker's traceback and then generic wrappers ("Engine core initialization
failed"), so rules are tried in order of specificity against the whole log, never just the last line.
The GPU and CPU builds word some errors differently (`GPU KV cache size` vs `CPU KV cache size: 2,048
tokens`, "Free memory on device" vs "Available memory on node 0"); both spellings are matched.
"""

from __future__ import annotations

import re
import signal

from tuner.failures import LaunchFacts, LaunchFailure, LaunchFailureKind

# vLLM's log prefix: "(EngineCore pid=1) ERROR 11-29 10:14:25 [core.py:1510] " (process tag optional).
_PREFIX = re.compile(
    r"^(?:\(\w[\w-]*(?: pid=\d+)?\)\s+)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d"
    r"(?:\.\d+)?\s+\[[^\]]*\]\s+)?"
)

# (kind, pattern). Order matters: the first rule that matches anywhere in the log wins.
_RULES: list[tuple[LaunchFailureKind, re.Pattern]] = [
    ("oom", re.compile(r"OutOfMemoryError|CUDA out of memory|HIP out of memory|CUDA error: out of memory"
                       r"|Cannot allocate memory|std::bad_alloc", re.I)),
    ("memory_utilization", re.compile(
        r"Free memory on device .* less than desired GPU memory utilization"
        r"|Available memory on node \d+ .* less than desired CPU memory utilization"
        r"|less than desired (?:GPU|CPU) memory utilization", re.I)),
    ("no_cache_blocks", re.compile(r"No available memory for the cache blocks"
                                   r"|not enough (?:memory|space) for (?:the )?(?:KV )?cache blocks", re.I)),
    ("max_model_len", re.compile(r"To serve at least one request with the models?'s max seq len"
                                 r"|KV cache is needed, which is larger than the available KV cache memory",
                                 re.I)),
    ("bad_flag", re.compile(
        r"error: argument [^:]+: invalid"            # argparse: invalid choice / invalid int value
        r"|error: unrecognized arguments"
        r"|error: the following arguments are required"
        r"|No common block size for"                 # --block-size the attention backend cannot use
        r"|User-specified max_model_len .* is greater than"
        r"|must be divisible by tensor parallel size"  # attention heads the layout cannot split
        r"|World size \(\d+\) is larger than the number of available GPUs"
        r"|validation errors? for \w*Config"         # pydantic config validation of a flag value
        r"|ValueError: Invalid value .* for"
        r"|Unknown quantization method", re.I)),
    ("unsupported", re.compile(
        r"_C::\w+\(\) expected at most 0 argument"   # op registered without a kernel in this build
        r"|no kernel image is available for execution"
        r"|Could not run '[^']+' with arguments from the '\w+' backend"
        r"|is not supported (?:on|for|by) (?:the )?(?:current )?(?:CPU|GPU|platform|device|hardware)"
        r"|not supported on (?:CPU|this (?:GPU|device|platform))"
        r"|requires (?:a )?(?:GPU|CUDA|compute capability)"
        r"|on CPU requires|requires x86 with AVX"     # "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"
        r"|NotImplementedError: "                     # vLLM's word for a feature this build lacks
        r"|undefined symbol:"
        r"|Illegal instruction|died unexpectedly \(exit code: -4\)", re.I)),  # SIGILL: ISA the CPU/VM lacks
]

_EXC_LINE = re.compile(r"\b((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)|error): (.+)")
_GENERIC = re.compile(r"Engine core initialization failed|See root cause above|please check the stack trace"
                      r"|Worker failed with error|EngineCore failed to start|subprocess.CalledProcessError", re.I)
# Lines that mention an exception without raising one ("can cause errors like `OSError: ...`").
_NOT_ERROR = re.compile(r"^(?:\([^)]*\)\s+)?(?:DEBUG|INFO|WARNING)\s|Warning: |warnings\.warn")
_MAX_MESSAGE = 600


def strip_prefix(line: str) -> str:
    """A log line without vLLM's process tag, level, date and source location."""
    return _PREFIX.sub("", line.rstrip()).strip()


def _message_at(lines: list[str], i: int) -> str:
    msg = strip_prefix(lines[i])
    return msg if len(msg) <= _MAX_MESSAGE else msg[:_MAX_MESSAGE - 3] + "..."


def root_cause(text: str) -> str | None:
    """The first specific exception line of the log (wrappers like "Engine core initialization failed"
    come after the root cause, so the first non-generic one is it), else the last generic one."""
    lines = text.splitlines()
    generic = None
    for i, line in enumerate(lines):
        m = _EXC_LINE.search(line)
        if not m:
            continue
        if _GENERIC.search(line):
            generic = generic or _message_at(lines, i)
            continue
        if _NOT_ERROR.search(line):
            continue
        return _message_at(lines, i)
    return generic


_NOISE = re.compile(r"warnings\.warn|resource_tracker|nanobind|leaked|^\s*- |^See https?://")


def last_line(text: str) -> str:
    """The last log line that says something (shutdown noise such as leak reports is skipped)."""
    lines = [x for x in text.splitlines() if x.strip()]
    for line in reversed(lines):
        if not _NOISE.search(line):
            return strip_prefix(line)[:300]
    return strip_prefix(lines[-1])[:300] if lines else ""


def classify_failure(text: str, *, returncode: int | None = None, timed_out: bool = False,
                     timeout_s: float | None = None) -> tuple[LaunchFailureKind, str]:
    """(kind, one-line human message) for a launch that exited or never became healthy.

    A known root cause wins even over a timeout: a server that hung after its engine failed is still that
    failure. A process killed by a signal with nothing in its log is a `crash` naming the signal (SIGKILL
    from the kernel usually means host memory ran out).
    """
    lines = text.splitlines()
    for kind, pattern in _RULES:
        for i, line in enumerate(lines):
            # INFO/WARNING lines may name a limitation vLLM works around ("... not supported on CPU,
            # falling back"); only error lines and bare traceback lines can say why a launch died.
            if pattern.search(line) and not _NOT_ERROR.search(line):
                return kind, _message_at(lines, i)
    if timed_out:
        last = last_line(text)
        after = f" after {timeout_s:.0f} s" if timeout_s is not None else ""
        return "timeout", f"not healthy{after}" + (f"; last log line: {last}" if last else "")
    cause = root_cause(text)
    if cause:
        return "crash", cause
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if -returncode == signal.SIGILL:
            return "unsupported", f"killed by {name}: the build uses an instruction this CPU or VM lacks"
        hint = " (often the kernel's OOM killer)" if -returncode == signal.SIGKILL else ""
        return "crash", f"killed by {name}{hint}"
    last = last_line(text)
    return "crash", f"exited with code {returncode}" + (f": {last}" if last else "")


_KV_TOKENS = re.compile(r"(?:GPU|CPU|XPU|TPU|HPU|NPU)? ?KV cache size: ([\d,_]+) tokens", re.I)
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,_]+) tokens per request: ([\d,_.]+) ?x", re.I)
_KV_GIB = re.compile(r"Available KV cache memory: ([\d.]+) GiB", re.I)


def _num(s: str) -> float:
    return float(s.replace(",", "").replace("_", ""))


def parse_launch_info(text: str) -> dict:
    """`LaunchInfo` fields from a healthy server's log: KV cache tokens and maximum concurrency.

    Data-parallel or multi-engine launches print one line per engine; the smallest is reported, since the
    tightest engine bounds what one request can get. Missing lines give None (e.g. a non-vLLM server).
    """
    kv = [int(_num(m.group(1))) for m in _KV_TOKENS.finditer(text)]
    conc = [_num(m.group(2)) for m in _CONCURRENCY.finditer(text)]
    return {"kv_cache_tokens": min(kv) if kv else None, "max_concurrency": min(conc) if conc else None}


def kv_cache_gib(text: str) -> float | None:
    """`Available KV cache memory: X GiB` (GPU builds), for reports."""
    m = _KV_GIB.search(text)
    return float(m.group(1)) if m else None


_NUM = r"(\d+(?:\.\d+)?)"
# "Free memory on device (X/Y GiB) on startup is less than desired GPU memory utilization (U, Z GiB)";
# the CPU build says "Available memory on node 0 (X/Y GiB) ..."
_MEMORY = re.compile(rf"\({_NUM}/{_NUM} GiB\) on startup is less than desired (?:GPU|CPU) memory "
                     rf"utilization \({_NUM}", re.I)
_ESTIMATED_LEN = re.compile(r"estimated maximum model length is (\d+)")
#: Which knob a hardware or build failure names, when its message names one (most specific first).
_NAMES_KNOB = [
    ("kv_cache_dtype", re.compile(r"KV cache|kv_cache_dtype|cache_dtype|cache dtype", re.I)),
    ("quantization", re.compile(r"quant|fp8|awq|gptq|marlin|compressed.tensors", re.I)),
]


def launch_facts(message: str) -> LaunchFacts:
    """The typed facts of a failure's message (`LaunchFacts`): what the search learns from, read here so
    vLLM's wording stays in the engine package."""
    facts = LaunchFacts(named_knobs=[k for k, pattern in _NAMES_KNOB if pattern.search(message)])
    m = _MEMORY.search(message)
    if m:
        facts.free_gib, facts.total_gib, facts.asked_utilization = (float(x) for x in m.groups())
    m = _ESTIMATED_LEN.search(message)
    if m:
        facts.estimated_max_model_len = int(m.group(1))
    return facts


def classified_failure(kind: LaunchFailureKind, message: str, log_tail: str = "") -> LaunchFailure:
    """A `LaunchFailure` with the facts of its message."""
    return LaunchFailure(kind, message, log_tail, facts=launch_facts(message))
