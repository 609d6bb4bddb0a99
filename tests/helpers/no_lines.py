"""Hold a "no" line to its own numbers: a floor printed as below a threshold it exceeds, a request named
as breaking a bound it meets, or "the rest meet it" with a figure over the bound, is a contradiction.

Used by the unit tests of `tuner.capacity.explain` and by the e2e runs of every shipped scenario.
"""

from __future__ import annotations

import re

_NUM = r"(\d[\d,]*(?:\.\d+)?)"
_VAL = _NUM + r" (ms|s)\b"


def to_ms(x: str, unit: str) -> float:
    v = float(x.replace(",", ""))
    return v * 1000.0 if unit == "s" else v


def contradictions(line: str) -> list[str]:
    """Every statement of `line` its own figures contradict (empty: none)."""
    bad = []
    for m in re.finditer(_VAL + r" is below [^;()]*?" + _VAL, line):
        a, b = to_ms(m[1], m[2]), to_ms(m[3], m[4])
        if not a < b:
            bad.append(f"{m[0]!r}: {a:g} ms is not below {b:g} ms")
    head = re.search(r"p\d+(?:\.\d+)? (TTFT|TPOT|ITL|E2E latency) " + _NUM + r" ms is broken", line)
    if head:
        metric, bound = head[1], float(head[2].replace(",", ""))
        tail = line[head.end():]
        named = re.split(r"; (?:the other|would change)", tail)[0]  # the requests said to break it
        for m in re.finditer(r"\b" + metric + " " + _VAL + r"(?:-" + _VAL + r")?", named):
            low = to_ms(m[1], m[2])
            if not low > bound * 0.9995:  # the figure is printed to 3 digits
                bad.append(f"{m[0]!r}: a request said to break {bound:g} ms measured {low:g} ms")
        for m in re.finditer(r"meet it \(p\d+(?:\.\d+)? " + _VAL, tail):
            if to_ms(m[1], m[2]) > bound * 1.0005:
                bad.append(f"{m[0]!r}: said to meet {bound:g} ms")
    for m in re.finditer(r"breaks the SLO first \(p\d+ " + _NUM + r" ms\)", line):
        bad.append(f"{m[0]!r}: a pooled percentile is not what breaks a per-request bound")
    return bad


def numbers_in(line: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(_NUM, line)]
