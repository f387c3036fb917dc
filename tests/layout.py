"""The module list in docs/contributors.md's Layout section: every product module with the
first sentence of its docstring, the one that names its job.

`python -m tests.layout` prints the list; `python -m tests.layout --write` puts it in
docs/contributors.md between its markers. tests/test_layout.py fails when the two disagree,
and when a module has no such sentence or outgrows the layout's targets.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "contributors.md"
# Product packages, in the order dependencies point (migrations/ aside: Alembic's own shape).
PACKAGES = {
    "bot": "the Slack transport",
    "gateway": "the second transport, for other agents (docs/gateway.md)",
    "agent": "the agent, its tools, policy and the workflow; no Slack",
    "storage": "the database: models, stores, the lifecycle",
}
BEGIN = "<!-- layout: written by `python -m tests.layout --write` from each module's docstring -->"
END = "<!-- /layout -->"
_SENTENCE = re.compile(r"(.+?[.!?])(?=\s|$)", re.S)


def modules(package: str) -> list[Path]:
    """The package's modules, relative to the top; an empty `__init__.py` has no job."""
    found = sorted((ROOT / package).rglob("*.py"))
    return [
        p.relative_to(ROOT) for p in found if not (p.name == "__init__.py" and not p.read_text())
    ]


def first_sentence(module: Path) -> str | None:
    """The first sentence of the module's docstring (of its first paragraph), on one line."""
    doc = ast.get_docstring(ast.parse((ROOT / module).read_text()))
    if not doc:
        return None
    paragraph = " ".join(doc.split("\n\n")[0].split())
    match = _SENTENCE.match(paragraph)
    return match.group(1) if match else paragraph


def package_lines(package: str) -> list[str]:
    lines = [f"**`{package}/`** — {PACKAGES[package]}:", ""]
    for module in modules(package):
        lines.append(f"- `{module.as_posix()}` — {first_sentence(module) or '(no docstring)'}")
    return lines


def section() -> str:
    """The whole generated list, markers included."""
    lines = [BEGIN]
    for package in PACKAGES:
        lines += ["", *package_lines(package)]
    return "\n".join([*lines, "", END])


def written() -> str:
    """The list as docs/contributors.md has it now, markers included ("" when absent)."""
    text = DOCS.read_text()
    start, end = text.find(BEGIN), text.find(END)
    return text[start : end + len(END)] if start != -1 and end > start else ""


def write() -> None:
    text, old = DOCS.read_text(), written()
    if not old:
        raise SystemExit(f"{DOCS} has no {BEGIN!r} … {END!r} markers to write between")
    DOCS.write_text(text.replace(old, section()))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print(section())
