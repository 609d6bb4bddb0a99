"""Reading a user's input files and checking a user's output paths, with one kind of error for each mistake.

Every input file (workload, SLO, search space, GPU and model profiles, gate) goes through the same few
steps: it must exist and be a file, decode as UTF-8, parse (YAML or JSON), then validate. Each step's
failure is a `UserError` naming the file and, where the file has lines, the line: a byte offset into an
invalid UTF-8 file or a YAML parser's column is no use to someone with an editor. Output paths are checked
before anything is written, so a bad `--out` ends in one line instead of a traceback halfway through a run.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterable

from tuner.errors import UserError
from tuner.yaml_strict import load


def looks_like_path(name: str) -> bool:
    """A name a user meant as a file (a directory part or a file extension), not a built-in's name."""
    return "/" in name or "\\" in name or name.startswith(("~", ".")) or bool(
        re.search(r"\.(ya?ml|json|jsonl|csv|gz)$", name, re.IGNORECASE))


def decode_utf8(raw: bytes, path: str | Path, encoding: str = "utf-8") -> str:
    """`raw` as text; invalid UTF-8 is reported at its line (and column) rather than its byte offset."""
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise UserError(f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {col})", file=path,
                        line=line) from None


#: Input files (YAML, a model's config.json) larger than this are refused unread: every such file the tool
#: reads is a few kilobytes, and a gigabyte one (or /dev/zero) would otherwise be read into memory first.
MAX_INPUT_BYTES = 8 * 1024 * 1024


def read_text(path: str | Path, what: str = "file", field: str | None = None,
              max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The text of an input file that must exist and be a regular file (`what` names it in errors)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError("no such file", file=path, field=field)
    if p.is_dir():
        raise UserError(f"is a directory, not a {what}", file=path, field=field)
    try:
        with p.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror or e}", file=path, field=field) from None
    if len(raw) > max_bytes:
        raise UserError(f"larger than {max_bytes // (1024 * 1024)} MiB: not a {what}", file=path, field=field)
    return decode_utf8(raw, path)


class DuplicateKey(ValueError):
    """A JSON object names one key twice: `json` keeps the last silently, as YAML would."""

    def __init__(self, key: str):
        self.key = key
        super().__init__(f"duplicate key {key!r}")


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`object_pairs_hook` for every JSON input (workload records, config.json): a key given twice is a
    user mistake to report, not a value to drop."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out


class JSONLimit(ValueError):
    """A JSON text past a bound the parser enforces (an integer's digits, the nesting depth): one line for
    the user, never Python's own traceback (`ValueError: Exceeds the limit (4300 digits)`,
    `RecursionError`)."""


def json_limits(call):
    """Run `call()` (a JSON decode), its parser limits turned into `JSONLimit` (see `loads_json`)."""
    try:
        return call()
    except RecursionError:
        raise JSONLimit("nested too deep (thousands of levels): not an input record") from None
    except ValueError as e:
        if isinstance(e, (json.JSONDecodeError, DuplicateKey)) or "digits" not in str(e):
            raise
        raise JSONLimit("a number with more than 4,300 digits: not an input value") from None


def loads_json(text: str) -> Any:
    """`json.loads` for every JSON input (workload lines, adapter configs, model config.json, quality task
    files): duplicate keys refused (`DuplicateKey`), and the parser's own limits turned into `JSONLimit`:
    CPython refuses integers of more than 4,300 digits with a bare ValueError and raises RecursionError on
    nesting near its stack limit. A caller reports either with its file and line."""
    return json_limits(lambda: json.loads(text, object_pairs_hook=unique_keys))


def parse_yaml(text: str, path: str | Path) -> tuple[Any, Any]:
    """(data, composed node tree for line lookups) of a YAML document: the one YAML reader of every input
    file. A syntax error names its line; so do a duplicate key (YAML's last-one-wins would silently drop
    the first `ttft:` of an SLO) and aliases that expand past `MAX_YAML_NODES` (a "billion laughs" file
    would otherwise be expanded into gigabytes, then printed back in an error)."""
    return load(text, path)


def yaml_line(root: Any, path: Iterable[Any]) -> int | None:
    """Line of the deepest key (or list item) of `path` found in the composed YAML, for `file:line`."""
    import yaml

    line, node = None, root
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if getattr(k, "value", None) == str(part):
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def check_out_dir(path: str | Path, field: str | None = None, shown: str | Path | None = None) -> Path:
    """A directory to be created or reused: neither it nor any parent may be an existing non-directory,
    and the nearest existing one must take a new entry (`/proc/x`, a read-only mount, a folder without
    write permission for this user): proved by creating and removing a scratch entry there, because
    permission bits say nothing of /proc or of root on a read-only file system."""
    p = Path(path).expanduser()
    for q in (p, *p.parents):
        if q.exists():
            if not q.is_dir():
                what = ("is a file, not a directory" if q == p and shown is None
                        else f"{q} is a file, not a directory")
                raise UserError(what, file=shown or path, field=field)
            _probe_writable(q, shown or path, field)
            break
    return p


def _probe_writable(folder: Path, path: str | Path, field: str | None) -> None:
    import tempfile

    try:
        scratch = tempfile.mkdtemp(prefix=".tune-probe-", dir=folder)
    except OSError as e:
        where = "" if Path(path).expanduser() == folder else f" in {folder}"
        raise UserError(f"cannot create anything{where}: {e.strerror or e}", file=path, field=field) from None
    Path(scratch).rmdir()


def check_out_file(path: str | Path, field: str | None = None) -> Path:
    """A file to be written: not a directory, and its parent a directory (or creatable as one)."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UserError("is a directory, not a file", file=path, field=field)
    if p.exists() and not p.is_file():
        raise UserError("is not a regular file", file=path, field=field)
    check_out_dir(p.parent, field, shown=path)
    return p


def file_sha256(path: str | Path) -> str:
    """The digest a study and its gate record of each input file (a gate refuses a changed one)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


#: What a resumed study must be run with as it was started (`StudyInfo` field, dotted -> the option that
#: sets it): the stored launches were measured under these, and a study that mixed two of them would
#: compare launches of different workloads, SLOs or engines, or follow a plan another strategy made.
RESUME_MUST_MATCH = {"settings.search.strategy": "--strategy", "workload_sha256": "--workload",
                     "slo_sha256": "--slo", "settings.engine.name": "--engine", "settings.engine.gpu": "--gpu",
                     "settings.engine.model": "--model", "search_space": "--search-space"}


def _at(d: dict, path: str) -> Any:
    for part in path.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def check_resume(stored: dict, now: dict) -> None:
    """`--resume` with an option that differs from the study's start is a user error (exit 2), named.
    Both are `StudyInfo` dumps."""
    for field, option in RESUME_MUST_MATCH.items():
        if _at(stored, field) != _at(now, field):
            what = "contents" if field.endswith("sha256") else "value"
            was = "" if field.endswith("sha256") or field == "search_space" else f" ({_at(stored, field)})"
            raise UserError(f"this study was started with another {what}{was}; resume it with the options it "
                            "was started with, or start a new study in another --out", field=option)


#: a safetensors header is JSON of tensor names, dtypes and shapes: kB for an adapter, a few MB for a large
#: model; the format itself refuses headers over 100 MB
MAX_SAFETENSORS_HEADER = 100 * 2**20


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (8 bytes of little-endian length, then that much JSON: the
    format's own layout), read without loading a tensor. A file that is not one is a `UserError` naming it."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"{len(head)} bytes, shorter than the 8 that give its header's length")
            n = int.from_bytes(head, "little")
            if not 2 <= n <= MAX_SAFETENSORS_HEADER:
                raise ValueError(f"a header length of {n} bytes")
            header = loads_json(f.read(n).decode("utf-8"))
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror}", file=str(path)) from None
    except ValueError as e:  # JSON, UTF-8, the length, JSONLimit and DuplicateKey are ValueErrors
        raise UserError(f"not a safetensors file ({str(e)[:120]})", file=str(path)) from None
    if not isinstance(header, dict):
        raise UserError("not a safetensors file (its header is not a JSON object)", file=str(path))
    return header


def check_model_files(model: str) -> None:
    """A local model for a real engine, read as far as is cheap before anything launches: a `.gguf` file
    starts with the GGUF magic, and a folder's safetensors files have headers. vLLM would otherwise fail in
    its worker, minutes in, after the run directory was made. A hub id (not a local path) is vLLM's to fetch."""
    p = Path(model)
    if p.is_file() and p.suffix.lower() == ".gguf":
        try:
            with p.open("rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise UserError(f"cannot read: {e.strerror}", file=model, field="--model") from None
        if magic != b"GGUF":
            raise UserError(f"not a GGUF file (it starts with {magic!r}, not b'GGUF')", file=model, field="--model")
    elif p.is_dir():
        for weights in sorted(p.glob("*.safetensors")):
            safetensors_header(weights)
