"""docs/extending.md, followed step by step: a toy format, a toy threat vector with its detector, and a toy report
with its command go in through the registries the page names, and run through the real entry points.

Each place this test touches is one the page names (the first test checks the page says so), so a change to a
registry that the page does not follow breaks here.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path

import click
import orjson
import pytest
from click.testing import CliRunner

import hpcwatch.sources.builtin  # noqa: F401 - the built-in formats registered before the registry is copied
from hpcwatch import records
from hpcwatch.cli import app
from hpcwatch.cli.common import PATH, argument, db_option, emit_json, json_option, open_store
from hpcwatch.records import Event, Finding, Sample
from hpcwatch.store import Store

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


@pytest.mark.parametrize(
    ("section", "names"),
    [
        ("A new format", ["src/hpcwatch/sources/builtin.py", "register(Format(...))", "sniff", "yields", "kinds"]),
        (
            "A new detector",
            [
                "VECTOR_TABLE",
                "`Vector`",
                "VectorInfo(id, number, short, target)",
                "RULES",
                "DETECTORS",
                "ScanConfig",
                "finding.<rule>",
                "model/cards.yaml",
                "_PLANT_OF",
                "EXPECTED_RULES",
            ],
        ),
        (
            "A new health rule",
            [
                "HEALTH_RULES",
                "HealthRuleId",
                "src/hpcwatch/analysis/health_rules.py",
                "src/hpcwatch/analysis/health.py",
                "PASSIVE_METRICS",
                "HealthConfig",
                "src/hpcwatch/vocab.py",
                "src/hpcwatch/reports/health.py",
                "tests/unit/test_health_rules.py",
                "docs/usage.md",
                "health_rule.<id>.one",
                "tests/unit/test_web_svg.py",
            ],
        ),
        ("A new report", ["src/hpcwatch/reports/", "src/hpcwatch/store/queries.py", "frozen dataclass"]),
        ("A new command", ["_COMMAND_MODULES", "@app.command()", "db_option", "json_option", "CliRunner"]),
    ],
)
def test_the_page_names_every_place_this_test_touches(section: str, names: list[str]) -> None:
    text = _section(section)
    assert [n for n in names if n not in text] == []


# -- a format ---------------------------------------------------------------------------------------------------


def parse_widgets(lines: list[str], *, path: Path, host: str | None) -> list[Sample]:
    """`# toy-widgets` then `name=value` lines: one sample a line, dated by nothing but the line's order."""
    from hpcwatch.errors import ParseError

    out = []
    for number, line in enumerate(lines, start=2):
        name, sep, value = line.partition("=")
        if not sep:
            raise ParseError("want name=value", path=path, line=number, text=line)
        out.append(
            Sample(metric=f"toy_widget_{name}", labels={"Hostname": host or "?"}, t=float(number), value=float(value))
        )
    return out


@pytest.fixture
def toy_format(monkeypatch):
    from hpcwatch.sources import registry

    monkeypatch.setattr(registry, "_FORMATS", list(registry._FORMATS))  # the registration ends with the test
    registry.register(
        registry.Format(
            name="toy-widgets",
            sniff=lambda head: head.text.startswith("# toy-widgets\n"),
            read=lambda path, ctx: parse_widgets(path.read_text().splitlines()[1:], path=path, host=ctx.host),
            kinds=frozenset({"samples"}),
            uses_host=True,
            summary="toy widgets",
        ),
        before="prometheus",
    )


def test_a_format_registered_as_the_page_says_is_found_by_ingest_and_its_errors_name_the_line(toy_format, tmp_path):
    good, bad = tmp_path / "w.txt", tmp_path / "bad.txt"
    good.write_text("# toy-widgets\nspin=3\nwobble=0.5\n")
    bad.write_text("# toy-widgets\nspin\n")
    db = str(tmp_path / "store")
    result = CliRunner().invoke(app, ["ingest", str(good), "--host", "node1", "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["formats"] == {"toy-widgets": 1}
    with Store(db) as store:
        table = store.samples(["toy_widget_spin", "toy_widget_wobble"])
        assert table.column("value").to_pylist() == [3.0, 0.5] and set(table.column("host").to_pylist()) == {"node1"}
    result = CliRunner().invoke(app, ["ingest", str(bad), "--host", "node1", "--db", db])
    assert result.exit_code == 2 and f"{bad}:2: want name=value" in " ".join(result.output.split())


# -- a threat vector and its detector --------------------------------------------------------------------------


TOY = records.VectorInfo("toy_leak", None, "toy", "weights")  # type: ignore[arg-type]


def _toy_finding(event: Event) -> Finding:
    return Finding(
        vector="toy_leak",  # type: ignore[arg-type]
        severity="high",
        target=event.source,
        title=f"toy leak on {event.source}",
        evidence={"bytes": event.attrs["bytes"]},
        t=event.t,
        rule="toy.leak",
    )


@pytest.fixture
def toy_vector(monkeypatch):
    """The row, the module with its RULES and the DETECTORS line, as the page lists them."""
    from hpcwatch.reports import findings
    from hpcwatch.security import scan

    table = (*records.VECTOR_TABLE, TOY)
    vectors = tuple(v.id for v in table)
    # Module-level names bound at import from the table: a real row is there before any import.
    monkeypatch.setattr(records, "VECTOR_TABLE", table)
    monkeypatch.setattr(records, "VECTORS", vectors)
    monkeypatch.setattr(findings, "VECTORS", vectors)
    module = types.ModuleType("hpcwatch.security.toy")
    module.RULES = ("toy.leak",)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    detector = scan.Detector("toy_leak", "toy", lambda i, c: [_toy_finding(e) for e in i.events if e.kind == "toy"])  # type: ignore[arg-type]
    monkeypatch.setattr(scan, "DETECTORS", (*scan.DETECTORS, detector))


def test_a_finding_of_a_vector_without_its_row_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown vector 'toy_leak'"):
        _toy_finding(Event(kind="toy", t=1.0, source="node1", attrs={"bytes": 1}))


def test_a_vector_added_as_the_page_says_is_scanned_stored_and_summarised(toy_vector) -> None:
    from hpcwatch.reports.findings import findings_summary
    from hpcwatch.security.scan import scan_records

    found = scan_records([], [Event(kind="toy", t=5.0, source="node2", attrs={"bytes": 7})], [])
    assert [(f.vector, f.rule, f.target) for f in found] == [("toy_leak", "toy.leak", "node2")]
    with Store(":memory:") as store:
        store.add(found)
        summary = findings_summary(store)
    assert list(summary)[-1] == "toy_leak" and summary["toy_leak"].findings == 1
    assert summary["toy_leak"].rule == "toy.leak"


# -- a report and its command ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WidgetReport:
    metric: str
    hosts: tuple[str, ...]
    total: float


def widget_report(store: Store, metric: str) -> WidgetReport:
    """What the page asks of a report: reads through the store's API, computes, returns a frozen result."""
    table = store.samples(metric)
    return WidgetReport(
        metric=metric,
        hosts=tuple(sorted(set(table.column("host").to_pylist()))),
        total=float(sum(table.column("value").to_pylist())),
    )


@click.command("widgets")
@argument("paths", nargs=-1, type=PATH, help="Files or folders to read.")
@db_option()
@json_option()
@click.option("--metric", type=str, default="toy_widget_spin", help="Which widget.")
def widgets(paths: list[Path], db: str | None, as_json: bool, metric: str) -> None:
    """The total of one widget, per the store (a view: it only formats what the report returned)."""
    with open_store(db) as store:
        report = widget_report(store, metric)
    if as_json:
        emit_json(report)
    else:
        click.echo(f"{report.metric}: {report.total:g} on {', '.join(report.hosts)}")


def test_a_report_and_its_command_agree(toy_format, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(app.commands, "widgets", widgets)
    good = tmp_path / "w.txt"
    good.write_text("# toy-widgets\nspin=3\nspin=4\n")
    db = str(tmp_path / "store")
    assert CliRunner().invoke(app, ["ingest", str(good), "--host", "node3", "--db", db]).exit_code == 0
    with Store(db) as store:
        expected = widget_report(store, "toy_widget_spin")
    assert expected == WidgetReport(metric="toy_widget_spin", hosts=("node3",), total=7.0)
    result = CliRunner().invoke(app, ["widgets", "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout) == {"metric": "toy_widget_spin", "hosts": ["node3"], "total": 7.0}
    assert CliRunner().invoke(app, ["widgets", "--db", db]).output == "toy_widget_spin: 7 on node3\n"
    assert "widgets" in CliRunner().invoke(app, ["--help"]).output
