"""The gate's verdict for people (`format_result`) and for CI systems (`write_junit`)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from pydantic import BaseModel, Field

from tuner.gate.file import GateFile


class Check(BaseModel):
    name: str
    passed: bool
    message: str
    skipped: bool = False
    seconds: float = 0.0


class GateResult(BaseModel):
    exit_code: int
    verdict: str
    checks: list[Check] = Field(default_factory=list)
    measured_capacity_rps: float | None = None


def format_result(r: GateResult, gate: GateFile, engine: str, knobs: dict) -> str:
    kn = ", ".join(f"{k}={v}" for k, v in knobs.items()) or "vLLM defaults"
    where = f"{gate.model} on {gate.gpu}" if gate.gpu else f"{gate.model} (GPU not named)"
    lines = [f"gate: {r.verdict}  {where} (engine {engine}); {kn}"]
    lines += [f"  [{'ok' if c.passed else 'FAIL'}] {c.message}" for c in r.checks]
    return "\n".join(lines)


def write_junit(r: GateResult, path: str | Path) -> Path:
    """JUnit XML, one test case per check, so any CI shows which part of the gate failed."""
    failures = sum(not c.passed and not c.skipped for c in r.checks)
    suite = ET.Element("testsuite", name="slo-tuner-gate", tests=str(len(r.checks)), failures=str(failures),
                       errors="1" if r.exit_code == 2 else "0", skipped=str(sum(c.skipped for c in r.checks)),
                       time=f"{sum(c.seconds for c in r.checks):.3f}")
    for c in r.checks:
        case = ET.SubElement(suite, "testcase", classname="slo-tuner.gate", name=c.name, time=f"{c.seconds:.3f}")
        if c.skipped:
            ET.SubElement(case, "skipped", message=c.message)
        elif not c.passed:
            ET.SubElement(case, "failure", message=c.message).text = c.message
        else:
            ET.SubElement(case, "system-out").text = c.message
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tree = ET.ElementTree(ET.Element("testsuites", name="slo-tuner", tests=str(len(r.checks)),
                                     failures=str(failures)))
    tree.getroot().append(suite)
    ET.indent(tree)
    tree.write(p, encoding="utf-8", xml_declaration=True)
    return p


