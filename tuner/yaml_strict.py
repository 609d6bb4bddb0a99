"""The one YAML reader of every user file (SLO, search space, GPU profile, gate): strict where PyYAML is lax.

PyYAML's `safe_load` is safe from code execution but not from three user mistakes: a duplicate key (the
last one wins without a word, so a second `ttft:` silently replaces the first), aliases that expand
exponentially (a nine-level "billion laughs" file of 1 KB becomes 387 million nodes, a MemoryError or an
error line hundreds of megabytes long), and nesting deep enough to exhaust Python's stack. Each is refused
here as one `UserError` naming the file and line, before anything is constructed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tuner.errors import UserError

#: A YAML input file's text is at most this long (the largest shipped file is a few KB).
MAX_YAML_CHARS = 4 * 1024 * 1024
#: Nodes of the document once every alias is expanded: far above any real input, far below a bomb's.
MAX_YAML_NODES = 200_000
#: Nesting depth: a real file nests four or five levels; Python's own stack ends near 1000.
MAX_YAML_DEPTH = 100


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (merge keys `<<:` excepted)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key, line = self.construct_object(key_node), key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:  # an unhashable key: PyYAML's own error says so below
                continue
            if first != line or key_node is not next(k for k, _ in node.value if k.value == key_node.value
                                                      and isinstance(k, yaml.ScalarNode)):
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given at line {first})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: yaml.Node | None, path: str | Path) -> None:
    """Refuse a document whose aliases expand past `MAX_YAML_NODES`, or that nests (or refers to itself)
    deeper than `MAX_YAML_DEPTH`: counted on the composed graph, where each alias is one shared node, so
    the check costs what the file's text costs, not what its expansion would."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node, depth: int) -> int:
        if depth > MAX_YAML_DEPTH:
            raise UserError(f"nested more than {MAX_YAML_DEPTH} levels deep (or an alias refers to itself)",
                            file=path, line=node.start_mark.line + 1)
        if id(node) in sizes:
            return sizes[id(node)]
        if isinstance(node, yaml.MappingNode):
            n = 1 + sum(size(k, depth + 1) + size(v, depth + 1) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n = 1 + sum(size(v, depth + 1) for v in node.value)
        else:
            n = 1
        if n > MAX_YAML_NODES:
            raise UserError(f"its aliases expand to more than {MAX_YAML_NODES:,} values: not an input file "
                            "(a YAML alias bomb?)", file=path, line=node.start_mark.line + 1)
        sizes[id(node)] = n
        return n

    if root is not None:
        size(root, 0)


def load(text: str, path: str | Path) -> tuple[Any, Any]:
    """(data, composed node tree) of one YAML document, every limit above checked first."""
    if len(text) > MAX_YAML_CHARS:
        raise UserError(f"larger than {MAX_YAML_CHARS // (1024 * 1024)} MiB: not an input file", file=path)
    try:
        loader = _Loader(text)  # the reader refuses control characters here, before any parsing
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, max(0, e.position)) + 1
        raise UserError(f"invalid YAML: a control character (#x{e.character if isinstance(e.character, int) else ord(e.character):04x}) "
                        "is not allowed in YAML text", file=path, line=line) from None
    try:
        root = loader.get_single_node()
        _check_expansion(root, path)
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"invalid YAML: {problem}"[:300], file=path,
                        line=mark.line + 1 if mark else None) from None
    except RecursionError:
        raise UserError(f"nested more than {MAX_YAML_DEPTH} levels deep", file=path) from None
    finally:
        loader.dispose()
    return data, root

