"""MkDocs hook: the CLI reference page generated from ``TuneParams``, so it is never hand-copied.

Every field is one ``hyperband tune`` flag; its help is the field's description. A field without a description
fails the build (``mkdocs build --strict`` in the test suite), as a flag without help would.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

MARKER = "<!-- generated: cli reference -->"
ROOT = Path(__file__).resolve().parents[1]
#: where the API reference reads the sources: the one package as installed, its subpackages linked in from the
#: repository root by pyproject.toml's package-dir (mkdocs.yml names this folder)
API_SOURCES = ROOT / "build" / "api-src"


def _api_sources() -> None:
    """``build/api-src/prefect_hyperband/`` as the wheel lays it out, made of links to the repository's folders."""
    import tomllib

    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items()):
        target = API_SOURCES.joinpath(*package.split("."))
        target.parent.mkdir(parents=True, exist_ok=True)
        if package == "prefect_hyperband":
            target.mkdir(exist_ok=True)
            link, source = target / "__init__.py", ROOT / folder / "__init__.py"
        else:
            link, source = target, ROOT / folder
        if not link.is_symlink() and not link.exists():  # a subpackage inside a linked folder is there already
            link.symlink_to(source)


_api_sources()


def cli_reference() -> str:
    from prefect_hyperband.app.flags import build_parser
    from prefect_hyperband.flows.params import TuneParams

    missing = [name for name, field in TuneParams.model_fields.items() if not (field.description or "").strip()]
    if missing:
        raise ValueError(f"TuneParams field(s) without a description: {', '.join(missing)}")
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001  (argparse keeps no public list)
    out = []
    for name, sub in commands.items():
        out.append(f"## `hyperband {name}`\n\n{sub.description or ''}\n")
        out.append("| flag | default | meaning |\n|---|---|---|")
        for action in sub._actions:  # noqa: SLF001
            if isinstance(action, argparse._HelpAction) or not action.option_strings:  # noqa: SLF001
                continue
            flags = ", ".join(f"`{f}`" for f in action.option_strings)
            out.append(f"| {flags} | {_default(name, action)} | {_cell(action.help or '')} |")
        out.append("")
    return "\n".join(out)


def _default(command: str, action: argparse.Action) -> str:
    from prefect_hyperband.flows.params import TuneParams

    field = TuneParams.model_fields.get(action.dest.replace("-", "_"))
    if field is None or command == "scale" and action.dest == "workers":
        return ""
    value = field.default
    return "" if value is None else f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
