"""Security logs whose fields are not the type the detectors take (found while typing the readers).

Tetragon: the line is the ``security_file_permission`` kprobe of Tetragon's documentation
(tests/data/security/tetragon_docs_events.jsonl), its ``file_arg.path`` replaced by a number, a list or an
object, as a broken or hostile export could hold. The reader took that value as the event's ``path``, and
the detectors that do string work on it (weights access, container escape) stopped with a TypeError.

Falco: the alert of Falco's documentation (tests/data/security/falco_docs_alert.jsonl) with its ``rule``
a list; the container-escape detector looks rules up by name and stopped with a TypeError (unhashable).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from hpcwatch.errors import ParseError
from hpcwatch.security.container_escape import detect_container_escape
from hpcwatch.security.weights_access import weights_report
from hpcwatch.sources.falco import read_falco_json
from hpcwatch.sources.tetragon import read_tetragon_json

SECURITY = Path(__file__).resolve().parents[1] / "data" / "security"
KPROBE = orjson.loads((SECURITY / "tetragon_docs_events.jsonl").read_bytes().splitlines()[1])
FALCO_ALERT = orjson.loads((SECURITY / "falco_docs_alert.jsonl").read_bytes().splitlines()[0])


def _kprobe_with_path(tmp_path: Path, path: object) -> Path:
    doc = orjson.loads(orjson.dumps(KPROBE))
    doc["process_kprobe"]["args"][0]["file_arg"]["path"] = path
    out = tmp_path / "tetragon.log"
    out.write_bytes(orjson.dumps(doc) + b"\n")
    return out


def test_documented_kprobe_keeps_its_path(tmp_path):
    (event,) = read_tetragon_json(_kprobe_with_path(tmp_path, "/etc/passwd"))
    assert event.attrs["path"] == "/etc/passwd"
    assert event.attrs["mask"] == 2


@pytest.mark.parametrize("path", [5, ["/models/w.safetensors"], {"p": "/etc/passwd"}])
def test_a_path_that_is_not_text_is_no_path_and_the_detectors_go_on(tmp_path, path):
    events = list(read_tetragon_json(_kprobe_with_path(tmp_path, path)))
    assert events[0].attrs["path"] is None
    assert weights_report(events) == []
    assert detect_container_escape(events) == []


def test_documented_falco_alert_reads():
    (event,) = read_falco_json(SECURITY / "falco_docs_alert.jsonl")
    assert event.attrs["rule"] == FALCO_ALERT["rule"]


@pytest.mark.parametrize("rule", [["Write below binary dir"], {"name": "x"}, 7])
def test_a_falco_rule_that_is_not_text_is_a_parse_error_naming_the_line(tmp_path, rule):
    log = tmp_path / "falco.log"
    log.write_bytes(orjson.dumps({**FALCO_ALERT, "rule": rule}) + b"\n")
    with pytest.raises(ParseError) as err:
        list(read_falco_json(log))
    assert f"{log}:1" in str(err.value)
    assert "rule is text" in str(err.value)
