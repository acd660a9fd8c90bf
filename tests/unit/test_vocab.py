"""Event kinds and metric names are spelt once, in vocab.py: no module writes one as a string literal."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hpcwatch import vocab

SRC = Path(__file__).resolve().parents[2] / "src" / "hpcwatch"
FILES = sorted(p for p in SRC.rglob("*.py") if p.name != "vocab.py")


def _literals(path: Path) -> list[tuple[int, str]]:
    """(line, value) of string constants in code (docstrings, f-string parts and dict keys aside)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip |= {id(c) for c in ast.walk(node)}
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            skip |= {id(s.value) for s in node.body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)}
        if isinstance(node, ast.Dict):
            skip |= {id(k) for k in node.keys if k is not None}
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_metric_names_come_from_vocab(path):
    spelt = [f"line {line}: {value}" for line, value in _literals(path) if value in vocab.METRICS]
    assert not spelt, f"{path.relative_to(SRC)}: use hpcwatch.vocab: " + "; ".join(spelt)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_events_are_made_with_a_vocab_kind(path):
    tree = ast.parse(path.read_text())
    literal = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Event"
        for k in n.keywords
        if k.arg == "kind" and isinstance(k.value, ast.Constant)
    ]
    assert not literal, f"{path.relative_to(SRC)}: Event(kind=<literal>) on lines {literal}; use vocab.EventKind"


def test_every_kind_is_listed_once():
    kinds = [v for k, v in vars(vocab.EventKind).items() if k.isupper()]
    assert len(kinds) == len(set(kinds)) == len(vocab.EVENT_KINDS)
    assert set(vocab.EventKindName.__args__) == vocab.EVENT_KINDS
