"""Readers of the security formats: pip, OSV, Falco, Tetragon, shard manifests, NVIDIA params, partitions.conf."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources.falco import parse_falco_json
from hpcwatch.sources.manifest import parse_manifest, sign_manifest, signature_valid
from hpcwatch.sources.opensm import parse_partitions_conf
from hpcwatch.sources.osv import OsvRange, read_osv, version_affected
from hpcwatch.sources.pip import normalize_name, parse_pip_freeze, parse_pip_list, read_site_packages
from hpcwatch.sources.procparams import read_nvidia_params
from hpcwatch.sources.tetragon import parse_tetragon_json

DATA = Path(__file__).parent.parent / "data" / "security"


def test_pip_list_json_and_freeze_give_the_same_packages() -> None:
    listed = list(parse_pip_list('[{"name": "torch", "version": "2.3.0"}, {"name": "PyYAML", "version": "6.0.1"}]'))
    frozen = list(parse_pip_freeze(["torch==2.3.0", "# comment", "--index-url https://x", "PyYAML==6.0.1"]))
    assert [(e.attrs["name"], e.attrs["version"]) for e in listed] == [("torch", "2.3.0"), ("PyYAML", "6.0.1")]
    assert [(e.attrs["name"], e.attrs["version"]) for e in frozen] == [("torch", "2.3.0"), ("PyYAML", "6.0.1")]


def test_pip_freeze_reads_vcs_and_editable_installs() -> None:
    events = list(parse_pip_freeze(["lib @ git+https://github.com/o/lib@abc", "-e git+https://h/r.git@1#egg=mine"]))
    assert [(e.attrs["name"], e.attrs["url"], e.attrs["editable"]) for e in events] == [
        ("lib", "git+https://github.com/o/lib@abc", False),
        ("mine", "git+https://h/r.git@1#egg=mine", True),
    ]


@pytest.mark.parametrize(
    "text, line",
    [
        ("torch==2.3\nthis is not a requirement\n", 2),  # prose in a freeze file
        ('[{"name": "torch"}]', 1),  # pip list item without a version
        ('[{"name": "torch", "version": "1"}', 1),  # truncated JSON: orjson knows the line
    ],
)
def test_pip_bad_input_names_the_line(text: str, line: int | None) -> None:
    with pytest.raises(ParseError) as err:
        list(parse_pip_list(text, path="img.txt"))
    assert err.value.path == "img.txt" and err.value.line == line


def test_site_packages_yields_only_lines_that_site_executes(tmp_path: Path) -> None:
    (tmp_path / "paths.pth").write_text("/opt/lib\n# import os\n")
    (tmp_path / "evil.pth").write_text("/opt/x\nimport os; os.system('id')\n")
    events = list(read_site_packages(tmp_path, image="img"))
    assert [(Path(e.attrs["path"]).name, e.attrs["line"]) for e in events] == [("evil.pth", 2)]


def test_normalize_name_follows_pep_503() -> None:
    assert normalize_name("Foo.Bar__baz-") == "foo-bar-baz-"


def test_osv_real_malicious_record_matches_its_version() -> None:
    db = read_osv(DATA / "osv")
    assert [e.id for e in db.matching("1337test", "1")] == ["MAL-2024-4720"]
    assert db.matching("1337test", "2") == []


def test_osv_zip_is_read_like_a_folder(tmp_path: Path) -> None:
    archive = tmp_path / "all.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(DATA / "osv" / "MAL-2024-4720.json", "MAL-2024-4720.json")
    assert len(read_osv(archive)) == 1


@pytest.mark.parametrize(
    "version, events, affected",
    [
        ("5.3.1", [("introduced", "0"), ("fixed", "5.4")], True),
        ("5.4", [("introduced", "0"), ("fixed", "5.4")], False),
        ("2.2.2", [("introduced", "1.0"), ("last_affected", "2.2.2")], True),
        ("2.2.3", [("introduced", "1.0"), ("last_affected", "2.2.2")], False),
        ("0.9", [("introduced", "1.0"), ("fixed", "1.5"), ("introduced", "2.0")], False),
        ("2.1", [("introduced", "1.0"), ("fixed", "1.5"), ("introduced", "2.0")], True),
        ("1.10", [("introduced", "1.9"), ("fixed", "1.11")], True),  # PEP 440, not string order
    ],
)
def test_osv_ranges_follow_the_osv_evaluation(version: str, events: list, affected: bool) -> None:
    assert version_affected(version, (), [OsvRange(type="ECOSYSTEM", events=tuple(events))]) is affected


def test_falco_alert_keeps_fields_and_nanosecond_time() -> None:
    line = json.dumps(
        {
            "hostname": "node1",
            "output": "x",
            "priority": "Critical",
            "source": "syscall",
            "rule": "Detect release_agent File Container Escapes",
            "tags": ["T1611"],
            "time": "2026-11-29T10:00:01.123456789Z",
            "output_fields": {"user.name": "root"},
        }
    )
    (event,) = parse_falco_json([line])
    assert event.kind == "falco" and event.attrs["host"] == "node1"
    assert event.t == pytest.approx(1795946401.123456)


def test_falco_alert_without_rule_is_an_error_on_its_line() -> None:
    with pytest.raises(ParseError) as err:
        list(parse_falco_json(['{"time": "2026-01-01T00:00:00Z", "rule": "a"}', '{"time": "x"}'], path="f.json"))
    assert err.value.line == 2


def test_tetragon_kprobe_flattens_path_mask_and_user() -> None:
    line = (
        '{"process_kprobe":{"process":{"pid":7,"uid":1002,"binary":"/usr/bin/cp","user":{"name":"bob"}},'
        '"function_name":"security_file_permission","policy_name":"weights-read",'
        '"args":[{"file_arg":{"path":"/lustre/checkpoints/m.pt"}},{"int_arg":4}]},'
        '"node_name":"node2","time":"2026-11-29T10:00:00Z"}'
    )
    (event,) = parse_tetragon_json([line, '{"process_exit":{"process":{}},"time":"2026-11-29T10:00:00Z"}'])
    assert {k: event.attrs[k] for k in ("host", "user", "path", "mask", "function_name")} == {
        "host": "node2",
        "user": "bob",
        "path": "/lustre/checkpoints/m.pt",
        "mask": 4,
        "function_name": "security_file_permission",
    }


def test_manifest_signature_verifies_and_detects_tampering(tmp_path: Path) -> None:
    rows = [{"path": "a.bin", "sha256": "0" * 64, "bytes": 3, "samples": 1}]
    doc = sign_manifest("ds", rows, b"k")
    manifest = parse_manifest(json.dumps(doc, indent=3), path=tmp_path / "m.json")
    assert signature_valid(manifest, b"k") and not signature_valid(manifest, b"other")
    doc["shards"][0]["bytes"] = 4
    assert not signature_valid(parse_manifest(json.dumps(doc)), b"k")


def test_manifest_with_a_short_hash_is_refused() -> None:
    with pytest.raises(ParseError, match="sha256"):
        parse_manifest('{"shards": [{"path": "a", "sha256": "abc", "bytes": 1}]}')


def test_nvidia_params_reads_registry_dwords_from_a_root(tmp_path: Path) -> None:
    params = tmp_path / "proc" / "driver" / "nvidia" / "params"
    params.parent.mkdir(parents=True)
    params.write_text('ResmanDebugLevel: 4294967295\nRegistryDwords: "RMDisableScrubOnFree=1;RmFoo=0x2"\n')
    (event,) = read_nvidia_params(tmp_path, host="node2")
    assert event.attrs["params"]["RMDisableScrubOnFree"] == "1" and event.attrs["host"] == "node2"


def test_partitions_conf_default_file_and_multiline_definitions() -> None:
    text = "# shipped\nDefault=0x7fff, ipoib : ALL=full;\nllm=0x8001, ipoib, mtu=5 :\n  0x1=full,\n  0x2 ;\n"
    (event,) = parse_partitions_conf(text)
    parts = event.attrs["partitions"]
    assert [(p["name"], p["pkey"], p["line"]) for p in parts] == [("Default", "0x7fff", 2), ("llm", "0x8001", 3)]
    assert parts[1]["members"] == [["0x1", "full"], ["0x2", "limited"]]


def test_partitions_conf_without_a_colon_is_an_error() -> None:
    with pytest.raises(ParseError) as err:
        list(parse_partitions_conf("Default=0x7fff ALL=full;\n", path="partitions.conf"))
    assert err.value.line == 1


from hypothesis import given, settings  # noqa: E402 -- the property tests of this module start here
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_security_readers_raise_only_parse_errors(text: str) -> None:
    readers = [
        lambda: list(parse_pip_list(text)),
        lambda: list(parse_falco_json(text.splitlines())),
        lambda: list(parse_tetragon_json(text.splitlines())),
        lambda: parse_manifest(text),
        lambda: list(parse_partitions_conf(text)),
    ]
    for read in readers:
        try:
            result = read()
        except ParseError as err:
            assert "\n" not in str(err)  # one line
        else:
            assert result is not None


@pytest.mark.parametrize(
    "read, text",
    [
        (
            lambda t: list(parse_tetragon_json([t])),
            '{"process_kprobe": 5, "time": "2026-01-01T00:00:00Z"}',
        ),  # not an object
        (lambda t: list(parse_falco_json([t])), '{"rule": "r", "time": "2026-01-01T00:00:00Z", "output_fields": [1]}'),
        (
            lambda t: list(__import__("hpcwatch.sources.osv", fromlist=["x"]).parse_osv_entry(t)),
            '{"id": "X-1", "affected": [3]}',
        ),  # affected of numbers
        (lambda t: parse_manifest(t), '{"shards": [{"path": "a", "sha256": "' + "a" * 64 + '", "bytes": -1}]}'),
    ],
)
def test_malformed_nested_fields_are_parse_errors(read, text: str) -> None:
    with pytest.raises(ParseError):
        read(text)
