"""MkDocs hooks: the pages of the docs site that are generated, not written, and the links that lead out
of `docs/`.

Generated at build time, so they cannot drift from the code:
- `index.md`: the README, its links rewritten for the site;
- `results.md`: `benchmarks/RESULTS.md`, the index of the measured figures and their dates, and
  `results/<page>.md`: the pages it links to (`benchmarks/results/*.md`, the sections in full), with their
  plots; under "Results" in the nav, in the order the index links them;
- `reference/cli.md`: every `tune` command and option, from the typer app (help text and defaults as the
  code declares them);
- `reference/files.md`: the input and output file formats (SLO, search space, GPU profile, gate file,
  run settings), from their pydantic models' schemas.

A link from a page to a file outside `docs/` (`../benchmarks/RESULTS.md`, `../tuner/recommend.py`) becomes
the site's page for it where there is one, and the path as code otherwise; a link to a file that does not
exist fails the build (`mkdocs build --strict`, `tests/unit/test_docs_site.py`).
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


def _site_files() -> dict[str, str]:
    """Files outside docs/ that are on the site, by their path in the repository: the README, the results
    index and the pages and plots it links to (written by `benchmarks/run_all.py --assemble`)."""
    out = {"README.md": "index.md", "benchmarks/RESULTS.md": "results.md"}
    for f in sorted([*RESULTS.glob("*.md"), *RESULTS.glob("*.png")]):
        out[f.relative_to(ROOT).as_posix()] = f"results/{f.name}"
    return out


PAGES = _site_files()


def _rewrite(text: str, source: Path, site_path: str) -> str:
    """Links of a page whose source is `source` (a file in the repository) that leave `docs/`, made relative
    to the page's place on the site, `site_path`."""
    here = posixpath.dirname(site_path)

    def one(m: re.Match) -> str:
        target, anchor = m.group(1), m.group(2) or ""
        if "://" in target or target.startswith("mailto:"):
            return m.group(0)
        path = (source.parent / target).resolve()
        try:
            rel = path.relative_to(ROOT).as_posix()
        except ValueError:
            raise PluginError(f"{source.relative_to(ROOT)}: link {target!r} leaves the repository") from None
        if rel.startswith("docs/"):
            return f"]({posixpath.relpath(Path(rel).relative_to('docs').as_posix(), here or '.')}{anchor})"
        if rel in PAGES:
            return f"]({posixpath.relpath(PAGES[rel], here or '.')}{anchor})"
        if not path.exists():
            raise PluginError(f"{source.relative_to(ROOT)}: link {target!r} names no file ({rel})")
        return f"]({_REPO_PREFIX}{rel})"
    return LINK.sub(one, text)


#: links to source files are written relative to the site's root as `repo/<path>`, then turned into
#: code text by `on_page_content` (the site holds no copy of the source)
_REPO_PREFIX = "repo:"


def _cli_reference() -> str:
    import typer

    from tuner.cli import app

    out = ["# Command line", "",
           "Every `tune` command and its options, generated from the command line's own declarations.", ""]

    def walk(cmd, path: list[str]) -> None:
        name = " ".join(path)
        subs = sorted(getattr(cmd, "commands", {}).items())  # a group (typer may carry its own click)
        if not subs or len(path) == 1:  # the root group is the main job
            section(cmd, name)
        for sub_name, sub in subs:
            walk(sub, path + [sub_name])

    def section(cmd, name: str) -> None:
        out.extend([f"## `{name}`", "", (cmd.help or "").strip().split("\n\n")[0], ""])
        rows = []
        for p in cmd.params:
            if p.param_type_name == "option" and not getattr(p, "hidden", False):
                flags = ", ".join(f"`{o}`" for o in p.opts + p.secondary_opts)
                default = "" if p.default is None or callable(p.default) or p.required else f"`{p.default}`"
                rows.append(f"| {flags} | {default} | {_cell(p.help or '')} |")
            elif p.param_type_name == "argument":
                rows.append(f"| `{p.name.upper()}` (argument) | | {_cell(getattr(p, 'help', '') or '')} |")
        if rows:
            out.extend(["| option | default | what it does |", "|---|---|---|", *rows, ""])
    walk(typer.main.get_command(app), ["tune"])
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _schema_type(prop: dict | bool) -> str:
    if not isinstance(prop, dict):
        return "any"
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in prop:
        return " or ".join(_schema_type(p) for p in prop["anyOf"])
    if prop.get("type") == "array":
        return f"list of {_schema_type(prop.get('items', {}))}"
    if prop.get("type") == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"map to {_schema_type(prop['additionalProperties'])}"
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    return prop.get("type", "any")


def _comments(model) -> dict[str, str]:
    """A model's fields' comments in its source (`#:` lines above a field, or `# ...` after it), for the
    fields declared without a `description`: the models are documented where they are declared."""
    import inspect

    out: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        try:
            lines = inspect.getsource(cls).splitlines()
        except (OSError, TypeError):
            continue
        above: list[str] = []
        for line in lines:
            text = line.strip()
            if text.startswith("#:"):
                above.append(text[2:].strip())
                continue
            m = re.match(r"(\w+)\s*:[^#]*?(?:#\s*(.*))?$", text)
            if m and m.group(1) in getattr(cls, "model_fields", {}):
                out[m.group(1)] = " ".join(above + ([m.group(2)] if m.group(2) else []))
            above = []
    return out


def _models(model) -> dict[str, type]:
    """`model` and the models its fields name, by name (their schema titles)."""
    seen: dict[str, type] = {}

    def visit(m) -> None:
        if m.__name__ in seen:
            return
        seen[m.__name__] = m
        for f in m.model_fields.values():
            for t in _leaf_types(f.annotation):
                if isinstance(t, type) and hasattr(t, "model_fields"):
                    visit(t)
    visit(model)
    return seen


def _leaf_types(t) -> list:
    import typing

    args = typing.get_args(t)
    return [x for a in args for x in _leaf_types(a)] if args else [t]


def _model_tables(title: str, model, intro: str) -> list[str]:
    schema = model.model_json_schema()
    models = _models(model)
    out = [f"## {title}", "", intro, ""]
    defs = schema.get("$defs", {})
    for name, sch in [(schema.get("title", model.__name__), schema), *sorted(defs.items())]:
        props = sch.get("properties")
        if not props:
            continue
        out.extend([f"### {name}", "", _cell(sch.get("description", "")), "",
                    "| field | type | default | description |", "|---|---|---|---|"])
        need = set(sch.get("required", []))
        said = _comments(models[name]) if name in models else {}
        for field, prop in props.items():
            default = "required" if field in need else (f"`{json.dumps(prop['default'])}`" if "default" in prop else "")
            what = prop.get("description") or said.get(field, "")
            out.append(f"| `{field}` | {_schema_type(prop)} | {default} | {_cell(what)} |")
        out.append("")
    return out


def _file_reference() -> str:
    from tuner.gate.file import GateFile
    from tuner.profiles.gpus import GPUProfile
    from tuner.search.space import SearchSpace
    from tuner.settings import RunSettings
    from tuner.slo import SLO

    out = ["# File formats", "",
           "The files `tune` reads and writes, generated from the pydantic models that read them: a field "
           "not listed here is refused with the file, line and field named. The workload format is on its "
           "own page ([workload format](../workload-format.md)), `report.json` on "
           "[its own](../report-json.md).", ""]
    out += _model_tables("SLO file (`--slo`)", SLO, "What a request must meet, and the share of requests that must.")
    out += _model_tables("Search space (`--search-space`)", SearchSpace, "The knobs a study may turn and their values.")
    out += _model_tables("GPU profile (`--gpu`, a YAML file)", GPUProfile,
                         "A GPU the simulator and the twin model, beside the built-in ones.")
    out += _model_tables("Gate file (`gate.yaml`)", GateFile, "What `tune gate` re-measures in CI, written by a study.")
    out += _model_tables("Run settings (`--config`)", RunSettings,
                         "Every setting of a run, validated once; the command line's options fill it.")
    return "\n".join(out) + "\n"


def on_config(config):
    """The results pages in the nav under "Results", after the index, in the order the index links them."""
    index = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    linked = list(dict.fromkeys(re.findall(r"\]\(results/(\w+\.md)", index)))
    for item in config.nav or []:
        if isinstance(item, dict) and item.get("Results") == "results.md":
            item["Results"] = ["results.md", *(f"results/{name}" for name in linked)]
    return config


def on_files(files: Files, config) -> Files:
    """Add the generated pages to the site."""
    def add(name: str, text: str) -> None:
        files.append(File.generated(config, name, content=text))
    for rel, site in PAGES.items():
        path = ROOT / rel
        if path.suffix == ".md":
            add(site, _rewrite(path.read_text(), path, site))
        else:
            files.append(File.generated(config, site, abs_src_path=str(path)))
    add("reference/cli.md", _cli_reference())
    add("reference/files.md", _file_reference())
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """A written page's links out of `docs/` (generated pages were rewritten when made)."""
    if page.file.generated_by or page.file.abs_src_path is None:
        return markdown
    return _rewrite(markdown, ROOT / "docs" / page.file.src_uri, page.file.src_uri)  # as if in docs/


def on_page_content(html: str, page, config, files) -> str:
    """A link to a source file becomes its path as code: the site holds no copy of the source."""
    return re.sub(r'<a href="(?:\.\./)*' + re.escape(_REPO_PREFIX) + r'([^"]+)"[^>]*>(.*?)</a>',
                  lambda m: f"{m.group(2)} (<code>{m.group(1)}</code>)" if m.group(2) != f"<code>{m.group(1)}</code>"
                  else m.group(2), html)
