"""Read a workload file of any supported format into a `Workload`, or fail with one line that says where.

Format detection looks at content, not just the name, because traces are routinely renamed (`.json` that is
really JSONL, a CSV without extension): the extension picks CSV vs JSON, the first record's keys pick the
JSON flavour, and `format=` overrides both. Every bad record stops the load with `file:line: field: message`
unless the caller opts into `skip_invalid`, and even then the skipped lines are returned, never hidden.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import json
from pathlib import Path
from typing import Any, Iterator

from pydantic import ValidationError

from tuner.errors import UserError
from tuner.inputs import DuplicateKey, JSONLimit, check_out_file, decode_utf8, json_limits, loads_json, unique_keys
from tuner.workload.formats import (ALIASES, AZURE_COLUMNS, FORMATS, TUNER_ONLY_KEYS, RecordError,
                                    guess_from_record)
from tuner.validation import first_error as first_validation_error
from tuner.workload.model import Workload

#: A workload file is read whole; the largest public traces are a few hundred MB.
MAX_WORKLOAD_BYTES = 2 ** 30
_DETECT_LINES = 20
_AMBIGUOUS_LINES = 1000


def format_names() -> list[str]:
    return list(FORMATS)


def resolve_format(name: str, path: str | Path | None = None) -> str:
    """Canonical format name for `name` (aliases allowed), or a `UserError` listing the known ones."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in FORMATS:
        raise UserError(f"unknown format {name!r} (known: {', '.join(FORMATS)})", file=path, field="format")
    return key


def _read_text(path: Path) -> str:
    if not path.exists():
        raise UserError("no such file", file=path)
    if path.is_dir():
        raise UserError("is a directory, not a workload file", file=path)
    if path.is_char_device() or path.is_block_device() or path.is_socket():
        raise UserError("is a device, not a workload file", file=path)
    try:  # read up to the cap, never past it: a pipe, or a small .gz that inflates to terabytes
        with (gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")) as f:
            raw = f.read(MAX_WORKLOAD_BYTES + 1)
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read: {e}", file=path) from None
    if len(raw) > MAX_WORKLOAD_BYTES:
        raise UserError(f"larger than {MAX_WORKLOAD_BYTES // 2 ** 30} GiB (uncompressed): take a slice of it",
                        file=path)
    if path.suffix != ".gz" and raw[:2] == b"\x1f\x8b":  # gzip's magic bytes under another name
        raise UserError("gzip-compressed data: name the file *.gz (it is read compressed) or decompress it",
                        file=path)
    return decode_utf8(raw, path, "utf-8-sig")


def _suffix(path: Path) -> str:
    return Path(path.stem).suffix.lower() if path.suffix == ".gz" else path.suffix.lower()


def _bad_json(e: json.JSONDecodeError) -> RecordError:
    return RecordError(None, f"invalid JSON: {e.msg} (column {e.colno})")


def _jsonl_records(text: str) -> Iterator[tuple[int, Any]]:
    """(line, record or RecordError) for each non-blank line; a bad line does not stop the others."""
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield n, loads_json(line)
        except JSONLimit as e:
            yield n, RecordError(None, str(e))
        except json.JSONDecodeError as e:
            yield n, _bad_json(e)
        except DuplicateKey as e:
            yield n, RecordError(e.key, "given twice in one record")


def _json_list_records(text: str, path: Path) -> Iterator[tuple[int, Any]]:
    """(line where the element starts, element) of a top-level JSON list, decoded one element at a time.

    Decoding element by element is what gives each ShareGPT conversation a real line number. Broken JSON
    syntax cannot be skipped (the rest of the list has no reliable boundaries), so it always raises.
    """
    dec = json.JSONDecoder(object_pairs_hook=unique_keys)
    n = len(text)
    i = text.index("[") + 1
    line, counted = 1, 0  # line number of position `counted`, advanced incrementally (files can be large)

    def skip_ws(j: int) -> int:
        while j < n and text[j] in " \t\r\n":
            j += 1
        return j

    def fail(pos: int, msg: str) -> UserError:
        return UserError(msg, file=path, line=1 + text.count("\n", 0, pos))

    i = skip_ws(i)
    if i < n and text[i] == "]":
        return
    while True:
        line += text.count("\n", counted, i)
        counted = i
        try:
            obj, end = json_limits(lambda: dec.raw_decode(text, i))
        except JSONLimit as e:
            raise fail(i, str(e)) from None
        except json.JSONDecodeError as e:
            raise fail(e.pos, f"invalid JSON: {e.msg}") from None
        except DuplicateKey as e:
            raise fail(i, f"{e.key}: given twice in one record") from None
        yield line, obj
        i = skip_ws(end)
        if i < n and text[i] == ",":
            i = skip_ws(i + 1)
            continue
        if i < n and text[i] == "]":
            if skip_ws(i + 1) < n:
                raise fail(skip_ws(i + 1), "invalid JSON: extra data after the list")
            return
        if i >= n:
            raise fail(n, "invalid JSON: unexpected end of file (the list is not closed)")
        raise fail(i, "invalid JSON: expected ',' or ']' between list elements")


def _csv_records(text: str, path: Path) -> Iterator[tuple[int, Any]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        yield from _csv_rows(reader, path)
    except csv.Error as e:  # a stray carriage return or NUL inside a field
        raise UserError(f"not valid CSV: {e}", file=path, line=max(reader.line_num, 1)) from None


def _csv_rows(reader: csv.DictReader, path: Path) -> Iterator[tuple[int, Any]]:
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in AZURE_COLUMNS if c not in header]
    if missing:
        raise UserError(f"missing column {', '.join(missing)} (need {','.join(AZURE_COLUMNS)})",
                        file=path, line=1, field="header")
    reader.fieldnames = header
    for row in reader:
        # cells absent from a short row come back as None: drop them so they read as "missing"
        yield reader.line_num, {k: v for k, v in row.items() if k is not None and v is not None}


def _ours_or_vllm(records: Iterator[tuple[int, Any]]) -> str:
    """A file that opens with `{"prompt", "output_tokens"}` is vLLM's unless a later record uses our fields.

    Our own writer emits such lines too (a request with only text), so look further before deciding.
    """
    try:
        for _, rec in itertools.islice(records, _AMBIGUOUS_LINES):
            if isinstance(rec, dict) and rec.keys() & TUNER_ONLY_KEYS:
                return "tuner"
    except UserError:  # broken JSON further on: loading will report it with its line
        pass
    return "vllm-custom"


def detect_format(path: str | Path, text: str | None = None) -> str:
    """The format of `path` from its extension and first records; `UserError` when it is not clear."""
    p = Path(path)
    text = _read_text(p) if text is None else text
    body = text.lstrip()
    if not body:
        raise UserError("empty file", file=p)
    if _suffix(p) == ".csv" or body[0] not in "[{":
        header = body.splitlines()[0]
        if all(c in header for c in AZURE_COLUMNS):
            return "azure"
        raise UserError(f"cannot tell the format from the first line {header[:60]!r} "
                        f"(pass --format, one of {', '.join(FORMATS)})", file=p, line=1)
    records = _json_list_records(text, p) if body[0] == "[" else _jsonl_records(text)
    first_error: tuple[int, RecordError] | None = None
    for line, rec in itertools.islice(records, _DETECT_LINES):
        if isinstance(rec, RecordError):
            first_error = first_error or (line, rec)
            continue
        guess = guess_from_record(rec)
        if guess == "vllm-custom":
            return _ours_or_vllm(records)
        if guess:
            return guess
        keys = ", ".join(sorted(rec)) if isinstance(rec, dict) else type(rec).__name__
        raise UserError(f"cannot tell the format from its keys ({keys}); pass --format, one of "
                        f"{', '.join(FORMATS)}", file=p, line=line)
    if first_error:
        raise UserError(first_error[1].message, file=p, line=first_error[0])
    raise UserError("no records", file=p)


def load_workload(path: str | Path, format: str | None = None, skip_invalid: bool = False) -> Workload:
    """Load any supported workload file; see `docs/workload-format.md` for the formats.

    Timed traces (Azure, Mooncake) get `arrival_s` as seconds since their earliest request, so a trace
    starts at 0 whatever clock it was recorded on. Our own format keeps `arrival_s` as written.
    """
    p = Path(path)
    text = _read_text(p)
    fmt = resolve_format(format, p) if format else detect_format(p, text)
    spec = FORMATS[fmt]
    if spec.csv:
        records = _csv_records(text, p)
    elif text.lstrip().startswith("["):
        records = _json_list_records(text, p)
    else:
        records = _jsonl_records(text)
    requests, times, lines, skipped = [], [], [], []
    for line, raw in records:
        try:
            if isinstance(raw, RecordError):
                raise raw
            try:
                conv = spec.convert(raw)
            except ValidationError as ve:  # a format's own fields pass, the request's bounds do not
                raise RecordError(*first_validation_error(ve)) from None
        except RecordError as e:
            err = UserError(e.message, file=p, line=line, field=e.field)
            if not skip_invalid:
                raise err from None
            skipped.append(err.format())
            continue
        requests.append(conv.request)
        times.append(conv.t_abs)
        lines.append(line)
    if not requests:
        why = f" ({len(skipped)} invalid skipped; first: {skipped[0]})" if skipped else ""
        raise UserError(f"no requests{why}", file=p)
    given = [t is not None for t in times]
    if any(given) and not all(given):
        line = lines[given.index(False)]
        raise UserError("missing (other requests have it: give it on every request or on none)",
                        file=p, line=line, field="arrival_s")
    if all(given) and fmt != "tuner":
        t0 = min(times)
        requests = [r.model_copy(update={"arrival_s": round(t - t0, 6)}) for r, t in zip(requests, times)]
    name = Path(p.stem).stem if p.suffix == ".gz" else p.stem
    return Workload(name=name, source_format=fmt, requests=requests, skipped=skipped)


def save_workload(workload: Workload, path: str | Path) -> Path:
    """Write `workload` in the project's JSONL format (fields at their defaults are left out)."""
    p = Path(path)
    if not p.parent.exists():
        raise UserError("directory does not exist", file=p.parent)
    check_out_file(p)
    with p.open("w", encoding="utf-8") as f:
        for r in workload.requests:
            f.write(json.dumps(r.model_dump(exclude_defaults=True), separators=(",", ":")) + "\n")
    return p
