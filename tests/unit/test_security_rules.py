"""Every rule id a detector can emit is registered (``security.scan.RULES``) and has a title template in
both web catalogues, so a finding never reaches the French page in English."""

from __future__ import annotations

import importlib
import re
import string
from pathlib import Path

import pytest

import hpcwatch.security as security
from hpcwatch.model import reference_cluster
from hpcwatch.records import VECTOR_TABLE, VECTORS, Finding
from hpcwatch.security.scan import DETECTORS, RULES
from hpcwatch.twin.threats import THREAT_SCENARIOS, write_threat_fixtures
from hpcwatch.web.i18n import LANGUAGES, finding_key, finding_text, load_catalogue
from tests.conftest import scan_folder

MODULES = tuple(importlib.import_module(f"hpcwatch.security.{d.module}") for d in DETECTORS)
FAMILIES = tuple(v.short for v in VECTOR_TABLE)
#: A rule id written as a string literal in a detector's source: "<family>.<name>".
RULE_LITERAL = re.compile(r"""["'](%s)\.([a-z_]+)["']""" % "|".join(FAMILIES))


def _literals() -> set[str]:
    found = set()
    for path in Path(security.__file__).parent.glob("*.py"):
        found |= {f"{a}.{b}" for a, b in RULE_LITERAL.findall(path.read_text(encoding="utf-8"))}
    return found


def test_every_rule_literal_in_the_detectors_is_registered() -> None:
    literals = _literals()
    assert len(literals) >= 30  # the regex does find the detectors' rule ids
    assert literals <= set(RULES), sorted(literals - set(RULES))
    assert set(RULES) == {r for m in MODULES for r in m.RULES} and len(RULES) == len(set(RULES))


def test_one_detector_a_vector_in_the_tables_order_and_its_rules_carry_the_vectors_short_name() -> None:
    assert tuple(d.vector for d in DETECTORS) == VECTORS
    for detector, vector in zip(DETECTORS, VECTOR_TABLE, strict=True):
        rules = importlib.import_module(f"hpcwatch.security.{detector.module}").RULES
        assert rules and all(r.startswith(f"{vector.short}.") for r in rules), (vector.id, rules)


def test_a_finding_refuses_a_vector_or_a_severity_outside_the_vocabulary() -> None:
    fields = dict(target="node1", title="t", evidence={}, t=0.0, rule="rdma.traffic_no_job")
    assert Finding(vector="rdma_blind_spot", severity="high", **fields).vector == "rdma_blind_spot"
    with pytest.raises(ValueError, match="unknown vector 'rdma'"):
        Finding(vector="rdma", severity="high", **fields)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown severity"):
        Finding(vector="rdma_blind_spot", severity="severe", **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_rule_has_a_title_template(lang: str) -> None:
    words = load_catalogue(lang).words
    missing = [r for r in RULES if finding_key(r) not in words]
    assert not missing, missing


def test_templates_use_the_same_placeholders_in_every_language() -> None:
    def names(text: str) -> set[str]:
        return {field for _, field, _, _ in string.Formatter().parse(text) if field}

    en = load_catalogue("en").words
    for lang in LANGUAGES:
        words = load_catalogue(lang).words
        for rule in RULES:
            assert names(words[finding_key(rule)]) == names(en[finding_key(rule)]), (lang, rule)


def _findings(tmp_path: Path, scenario: str) -> list:
    cluster = reference_cluster()
    write_threat_fixtures(tmp_path, scenario)
    return scan_folder(tmp_path, cluster)


@pytest.mark.parametrize("scenario", [s for s in THREAT_SCENARIOS if s.startswith("threat_")])
def test_templates_rebuild_the_detectors_titles_and_translate_them(scenario: str, tmp_path: Path) -> None:
    for f in _findings(tmp_path, scenario):
        en = finding_text(f.rule, f.evidence, target=f.target, t=f.t, lang="en")
        fr = finding_text(f.rule, f.evidence, target=f.target, t=f.t, lang="fr")
        if not f.rule.startswith("container_escape."):  # its page title names the escape, not the event source
            assert en == f.title
        assert fr and fr != en and "{" not in fr and "?" not in fr, (f.rule, fr)


def test_french_numbers_use_a_decimal_comma_and_missing_values_show_as_a_question_mark() -> None:
    text = finding_text("rdma.traffic_no_job", {"host": "node3", "peak_bytes_per_s": 1.25e8}, lang="fr")
    assert text == "node3 a transféré 125,0 Mo/s sur InfiniBand sans aucun job"
    assert finding_text("rdma.traffic_no_job", {}, lang="en") == "? moved ? MB/s over InfiniBand with no job on it"
    assert finding_text("no.such_rule", {}, lang="fr") is None
