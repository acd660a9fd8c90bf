"""Every import of the package follows the layering table of docs/architecture.md: nothing reaches backwards.

The table is read from the document itself, so the document and the code cannot drift apart: a
row names a layer (a module or a package of ``src/hpcwatch``) and the layers it may import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "hpcwatch"
DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _table() -> dict[str, set[str]]:
    """layer -> layers it may import, from the rows ``| `layer` | what | `a`, `b` |`` of the doc's table."""
    allowed: dict[str, set[str]] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        layers = re.findall(r"`([a-z_]+)(?:/|\.py)?`", cells[0])
        imports = set(re.findall(r"`([a-z_]+)(?:/|\.py)?`", cells[2]))
        for layer in layers:
            allowed[layer] = imports
    return allowed


def _layer(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, layer) of every hpcwatch import in one file, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ("hpcwatch",) + path.relative_to(SRC).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                names = [f"{base}.{node.module}" if node.module else base]
            else:
                names = [node.module or ""]
            if names == ["hpcwatch"]:
                names = [f"hpcwatch.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "hpcwatch" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


FILES = sorted(p for p in SRC.rglob("*.py"))


def test_the_table_names_every_layer():
    table = _table()
    layers = {_layer(p) for p in FILES} - {"__init__", "__main__"}
    assert layers <= set(table), f"layers missing from docs/architecture.md: {sorted(layers - set(table))}"
    assert set(table) <= layers | {"deploy"}, f"rows naming no layer: {sorted(set(table) - layers)}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_follow_the_table(path):
    table = _table()
    layer = _layer(path)
    if layer in ("__init__", "__main__"):
        return
    wrong = [
        f"line {line}: {layer} imports {target}"
        for line, target in _imports(path)
        if target != layer and target not in table[layer]
    ]
    assert not wrong, f"{path.relative_to(SRC)}: " + "; ".join(wrong)


def _guarded_own_imports(path: Path) -> list[int]:
    """Lines of ``try: import hpcwatch... except ImportError`` (a real import error of ours would vanish)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Try):
            continue
        catches = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
        if not catches & {"ImportError", "ModuleNotFoundError"}:
            continue
        for stmt in ast.walk(ast.Module(body=node.body, type_ignores=[])):
            module = getattr(stmt, "module", None) if isinstance(stmt, ast.ImportFrom) else None
            names = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else []
            if (module or "").startswith("hpcwatch") or any(n.startswith("hpcwatch") for n in names):
                lines.append(stmt.lineno)
    return lines


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_silent_fallback_for_our_own_modules(path):
    assert not _guarded_own_imports(path), f"{path.relative_to(SRC)}: ImportError of our own module caught"


def test_the_table_allows_only_what_each_layer_imports():
    """The table is narrow: a layer allowed an import it never makes would hide the next wrong one."""
    table = _table()
    used: dict[str, set[str]] = {layer: set() for layer in table}
    for path in FILES:
        layer = _layer(path)
        if layer not in ("__init__", "__main__"):
            used[layer] |= {target for _, target in _imports(path) if target != layer}
    loose = {layer: sorted(table[layer] - used[layer]) for layer in table if table[layer] - used[layer]}
    assert not loose, f"docs/architecture.md allows imports no module makes: {loose}"


CITED_SECTION = re.compile(r'docs/([a-z_]+\.md)[, ]+\\?"([^"\\\n]+)\\?"')


def test_the_code_cites_only_documents_the_repository_holds():
    """DESIGN.md and STYLE.md live outside the repository; a section of docs/ cited by name must exist."""
    outside = [
        f"{p.relative_to(SRC)}:{n}"
        for p in FILES
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"(DESIGN|STYLE)(\.md)? *(§|section)", line)
    ]
    assert not outside, f"cites a document outside the repository: {outside}"
    headings: dict[str, set[str]] = {}
    for path in FILES:
        for doc, section in CITED_SECTION.findall(path.read_text()):
            if doc not in headings:
                text = (DOC.parent / doc).read_text()
                headings[doc] = {h.lstrip("#").strip() for h in text.splitlines() if h.startswith("#")}
            assert section in headings[doc], f"{path.relative_to(SRC)} cites docs/{doc}, {section!r}: no such heading"
