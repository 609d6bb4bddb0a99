"""docs/adding-a-knob.md, followed literally: its entry added to a copy of the package's knob table, and
nothing else edited, reaches every part of the tool that reads knobs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adding-a-knob.md"

#: Run in the copy: each part of the tool that reads knobs sees the new one.
CHECKS = '''
from pydantic import ValidationError

from tuner.diagnose import KNOBS
from tuner.engine.sim import SimEngine
from tuner.knobs import KNOB_SPECS, Knobs, answering, vllm_defaults
from tuner.profiles.gpus import get_gpu
from tuner.search.space import SearchSpace
from tuner.cli.sim import _knobs, build_parser
from tuner.storage.records import TrialRecord

NAME = "max_num_partial_prefills"
spec = KNOB_SPECS[NAME]
k = Knobs(**{NAME: 2})
# the record and its validation (strict: a count is an int of at least 1)
for bad in (0, "2", True, 1.5):
    try:
        Knobs(**{NAME: bad})
    except ValidationError:
        continue
    raise AssertionError(f"{bad!r} was accepted")
# the vllm serve spelling, the configuration's key, storage and back
assert k.flags() == ["--max-num-partial-prefills", "2"], k.flags()
assert k.key() == '{"max_num_partial_prefills": 2}', k.key()
assert TrialRecord.model_validate_json(TrialRecord(knobs=k).model_dump_json()).config == k
# vLLM's default, the diagnosis's rank and direction
assert vllm_defaults(get_gpu("rtx4090"))[NAME] == spec.default
names, directions = answering("prefill")
assert names.index(NAME) == sorted(s.answers["prefill"][0] for s in KNOB_SPECS.values()
                                   if "prefill" in s.answers).index(spec.answers["prefill"][0])
assert directions[NAME] == "up" and NAME in KNOBS["prefill"][0]
# the simulator's flag parser (vLLM's spelling) and a search space
args = build_parser().parse_args(["--gpu", "-", "--model", "-", "--max-num-partial-prefills", "2"])
assert _knobs(args) == k
SearchSpace(knobs={NAME: {"values": [1, 2, 4]}})
# the simulated engines do not model it yet: a study that turns it is refused before it starts
refused = SimEngine.unsupported_value({NAME: [None, 2]})
assert refused is not None and refused[0] == NAME, refused
print("ok")
'''


def _entry() -> str:
    """The doc's first Python block: the knob table entry it tells a reader to add."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert blocks, "docs/adding-a-knob.md has no ```python entry"
    return blocks[0]


def test_the_documented_entry_alone_adds_a_knob(tmp_path: Path) -> None:
    from tuner.knobs import KNOB_SPECS

    entry = _entry()
    assert "max_num_partial_prefills" in entry and "max_num_partial_prefills" not in KNOB_SPECS
    shutil.copytree(ROOT / "tuner", tmp_path / "tuner", ignore=shutil.ignore_patterns("__pycache__"))
    knobs_py = tmp_path / "tuner" / "knobs.py"
    text = knobs_py.read_text()
    start = text.index("KNOB_SPECS: dict[str, KnobSpec] = {s.name: s for s in (")
    end = text.index("\n)}\n", start)  # the table's closing line: the entry goes last
    knobs_py.write_text(text[:end] + "\n" + "".join("    " + line + "\n" for line in entry.splitlines())
                        + text[end + 1:])
    done = subprocess.run([sys.executable, "-c", CHECKS], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
