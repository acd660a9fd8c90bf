"""Strings from data never drive the terminal: no control character reaches it, Rich markup is shown as typed.

A Falco ``hostname``, a Slurm account or a user name is whatever the collector
wrote; printed raw, an OSC sequence retitles the user's terminal and a CSI one
clears it, and Rich would render ``[bold]`` or raise on ``[/x]``.
"""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from hpcwatch.cli import common
from hpcwatch.records import Job, Sample
from hpcwatch.reports.text import visible
from hpcwatch.store import Store

# (hostile value, how the terminal must show it)
HOSTILE = [
    # OSC 0: sets the terminal's title (ESC ] 0 ; text BEL)
    ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
    # CSI 2 J: clears the screen
    ("\x1b[2J", "\\x1b[2J"),
    # Rich markup: would be rendered bold instead of shown
    ("[bold]root[/bold]", "[bold]root[/bold]"),
    # a closing tag with nothing open: Rich raises MarkupError
    ("[/x]", "[/x]"),
    # the 8-bit CSI (C1 U+009B): some terminals obey it like ESC [
    ("\x9b2J", "\\x9b2J"),
    # an emoji code: Rich would replace it with a picture
    (":warning:", ":warning:"),
    # the right-to-left override U+202E: "evil\u202egnp.exe" shows as "evilexe.png" (Trojan Source, UAX #9)
    ("evil\u202egnp.exe", "evil\\u202egnp.exe"),
    # a right-to-left isolate and the Arabic letter mark: the other bidi controls, shown the same way
    ("a\u2067b\u061c", "a\\u2067b\\u061c"),
]
#: What must never reach the terminal raw: ESC, the 8-bit CSI, BEL, and every bidi formatting character.
CONTROL_BYTES = ("\x1b", "\x9b", "\x07", "\u061c", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F)))
CONTROL_BYTES += tuple(map(chr, range(0x2066, 0x206A)))


@pytest.fixture
def wide_console():
    """A console wide enough that no cell is cut (the check is on the whole text)."""
    old = common.console.width
    common.console.width = 400
    yield common.console
    common.console.width = old


def _store(path, hostile: str) -> str:
    """One finished job whose user, account and node are ``hostile``, with one GPU's utilisation."""
    job = Job(
        id="7",
        user=hostile,
        account=hostile,
        partition="gpu",
        nodes=(hostile,),
        gpus=1,
        gpus_by_node={hostile: (0,)},
        start=0.0,
        end=100.0,
        state="COMPLETED",
        name=hostile,
    )
    samples = [
        Sample(
            metric="DCGM_FI_DEV_GPU_UTIL",
            labels={"Hostname": hostile, "gpu": "0", "hpc_job": "7"},
            t=float(t),
            value=90.0,
        )
        for t in range(0, 100, 10)
    ]
    db = str(path / "hostile.duckdb")
    with Store(db) as store:
        store.add([job, *samples])
    return db


def _falco_file(path, hostile: str):
    line = {
        "time": "2026-01-01T00:00:00.000000000Z",
        "rule": "Terminal shell in container",
        "priority": "Critical",
        "source": "syscall",
        "output": "shell",
        "hostname": hostile,
        "tags": ["T1059"],
        "output_fields": {"user.name": hostile, "container.image.repository": hostile, "proc.cmdline": "bash"},
    }
    file = path / "falco.json"
    file.write_text(json.dumps(line) + "\n")
    return file


def _assert_safe(text: str, shown: str) -> None:
    assert not any(c in text for c in CONTROL_BYTES), repr(text[:400])
    assert shown in text


@pytest.mark.parametrize("hostile,shown", HOSTILE)
def test_jobs_shows_user_and_account_literally(tmp_path, run_cli, wide_console, hostile, shown):
    code, out, err = run_cli(["jobs", "--db", _store(tmp_path, hostile)])
    assert code == 0, err
    _assert_safe(out + err, shown)


@pytest.mark.parametrize("hostile,shown", HOSTILE)
def test_job_shows_user_account_and_host_literally(tmp_path, run_cli, wide_console, hostile, shown):
    code, out, err = run_cli(["job", "7", "--db", _store(tmp_path, hostile)])
    assert code == 0, err
    _assert_safe(out + err, shown)
    assert out.count(shown) >= 3  # user, account, the GPU's host (and the job name)


@pytest.mark.parametrize("hostile,shown", HOSTILE)
def test_scan_shows_a_falco_hostname_literally(tmp_path, run_cli, wide_console, hostile, shown):
    code, out, err = run_cli(["scan", str(_falco_file(tmp_path, hostile))])
    assert code == 0, err
    _assert_safe(out + err, shown)


@pytest.mark.parametrize("hostile,shown", HOSTILE)
def test_health_shows_a_node_name_literally(tmp_path, run_cli, wide_console, hostile, shown):
    code, out, err = run_cli(["health", "--db", _store(tmp_path, hostile)])
    assert code == 0, err
    _assert_safe(out + err, shown)


def test_top_table_shows_host_and_user_literally():
    from hpcwatch.cli.top import _table, latest_gpus

    lines = []
    for hostile, shown in HOSTILE:
        with Store(":memory:") as store:
            store.add(
                [
                    Job(id="7", user=hostile, gpus=1, start=0.0, state="RUNNING"),
                    Sample(
                        metric="DCGM_FI_DEV_GPU_UTIL",
                        labels={"Hostname": hostile, "gpu": "0", "hpc_job": "7"},
                        t=1.0,
                        value=50.0,
                    ),
                ]
            )
            gpus = latest_gpus(store)
        console = Console(width=400, emoji=False)
        with console.capture() as captured:
            console.print(_table(gpus, 0.0, 1))
        text = captured.get()
        _assert_safe(text, shown)
        assert text.count(shown) >= 2, text  # node and user
        lines.append(text)
    assert len(lines) == len(HOSTILE)


def test_json_output_keeps_the_value_exact(tmp_path, run_cli):
    hostile = "\x1b]0;pwned\x07[bold]root[/bold]"
    code, out, _ = run_cli(["jobs", "--db", _store(tmp_path, hostile), "--json"])
    assert code == 0 and "\x1b" not in out  # orjson writes \u001b
    (job,) = json.loads(out)["jobs"]
    assert job["account"] == hostile and job["user"] == hostile


# -- the error edge ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,expected",
    [
        # a job id from the user's own terminal, holding a CSI: shown, not obeyed
        (["job", "\x1b[2J", "--db", ":memory:"], "no job \\x1b[2J in the store"),
        # an unknown option: click's "Usage: ... Error: ..." block becomes one line, naming the command's help
        # (click 8.1 says "No such option: --bogus", 8.5 "No such option '--bogus'. Did you mean '--gpu'?")
        (["steps", "--bogus"], ("No such option", "--bogus", "(see hpcwatch steps --help)")),
        # a missing argument: one line too
        (["goodput"], "Missing argument 'JOB'. (see hpcwatch goodput --help)"),
        # a value out of its range, in a sub-group's command
        (
            ["demo", "--nodes", "0"],
            "Invalid value for '--nodes': 0 is not in the range x>=1. (see hpcwatch demo --help)",
        ),
        # a value of the wrong type
        (["twin", "traces", "--out", "x", "--ranks", "many"], "'many' is not a valid integer"),
        # an unknown command
        (["stpes"], "No such command 'stpes'"),
    ],
)
def test_every_error_is_one_line_with_controls_escaped(run_cli, argv, expected):
    code, _out, err = run_cli(argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcwatch: "), err
    assert all(part in lines[0] for part in ((expected,) if isinstance(expected, str) else expected)), lines[0]
    assert "\x1b" not in err and "╭" not in err


def test_a_job_id_longer_than_any_is_a_usage_error_before_the_store_opens(run_cli, monkeypatch):
    """`hpcwatch job <20,000 characters>` used to query the store for seconds and print the id back whole."""
    from hpcwatch.cli import jobs as jobs_cli

    def never(db):
        raise AssertionError("the store was opened")

    monkeypatch.setattr(jobs_cli, "open_store", never)
    code, out, err = run_cli(["job", "9" * 20_000, "--db", ":memory:"])
    assert code == 2 and out == ""
    assert err == (
        "hpcwatch: Invalid value for 'JOB_ID': 20000 characters; a job id has at most 512 (see hpcwatch job --help)\n"
    )


@pytest.mark.parametrize("argv", [[], ["twin"], ["simulate"]])
def test_a_bare_group_shows_its_help_with_status_2(run_cli, argv):
    code, out, err = run_cli(argv)
    assert code == 2 and err == ""
    usage = " ".join(["Usage: hpcwatch", *argv, "[OPTIONS] COMMAND [ARGS]..."])
    assert out.startswith(usage) and "Commands:" in out


def test_help_is_status_0_on_stdout(run_cli):
    code, out, err = run_cli(["steps", "--help"])
    assert code == 0 and err == "" and out.startswith("Usage: hpcwatch steps [OPTIONS] [PATHS]...")
    assert "Arguments:\n  [PATHS]...  Kineto traces" in out and "[default: 300.0; x>0.0]" in out


def test_an_error_of_several_lines_is_joined_into_one():
    line = common.error_line("f.parquet: not a readable Parquet file:\nIOError: bad\x00magic\n  at footer")
    assert "\n" not in line and "\x00" not in line
    assert line == "hpcwatch: f.parquet: not a readable Parquet file: IOError: bad\\x00magic at footer"


def test_an_os_error_past_the_commands_checks_is_one_line(run_cli, monkeypatch):
    from hpcwatch.cli import jobs as jobs_cli

    def unreadable(db):
        raise PermissionError(13, "Permission denied", "/data/store.duckdb")

    monkeypatch.setattr(jobs_cli, "open_store", unreadable)
    code, _, err = run_cli(["jobs"])
    assert code == 2 and err == "hpcwatch: /data/store.duckdb: Permission denied\n"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("tab\there", "tab\\x09here"),  # C0 other than ESC: still not sent raw
        ("del\x7f", "del\\x7f"),  # DEL
        ("nel\x85", "nel\\x85"),  # C1 NEL: a line break on some terminals
        ("rlo\u202eexe", "rlo\\u202eexe"),  # the right-to-left override: shown, not obeyed
        ("\u202a\u202b\u202c\u202d", "\\u202a\\u202b\\u202c\\u202d"),  # embeddings and the pop
        ("\u2066\u2068\u2069", "\\u2066\\u2068\\u2069"),  # isolates
        ("\u200e\u200f\u061c", "\\u200e\\u200f\\u061c"),  # LRM, RLM, the Arabic letter mark
        ("ok é 東京 שלום \u200d", "ok é 東京 שלום \u200d"),  # printable text (and the ZWJ of emoji) kept
    ],
)
def test_visible_escapes_every_control_character(text, expected):
    assert visible(text) == expected


def test_safe_text_escapes_markup_after_controls():
    assert common.safe_text("[red]\x1b[0m") == "\\[red]\\x1b[0m"
    assert common.safe_text(None) == "-" and common.safe_text("", empty="") == ""


# -- the exporter and the web --------------------------------------------------------------------


def test_metrics_label_values_hold_no_control_character():
    from prometheus_client import generate_latest

    from hpcwatch.exporter import JobUsage, registry_for

    hostile = "\x1b]0;pwned\x07\x9b2J"
    usage = [
        JobUsage(
            job=Job(id="7", user=hostile, account=hostile, gpus=1, state="RUNNING"),
            gpu_hours=1.0,
            energy_j=None,
            mean_util_percent=None,
            idle_gpus=0,
        )
    ]
    text = generate_latest(registry_for(Store(":memory:"), usage=lambda store: usage)).decode()
    assert not any(c in text for c in CONTROL_BYTES)
    assert 'user="\\\\x1b]0;pwned\\\\x07\\\\x9b2J"' in text  # our \x1b, with the exposition's \\ escape


def test_web_page_and_api_keep_a_hostile_name_inert():
    from fastapi.testclient import TestClient

    from hpcwatch.model.cluster import reference_cluster
    from hpcwatch.web.app import create_app

    hostile = "\x1b[2J</script><script>alert(1)</script>[bold]root[/bold]"
    store = Store(":memory:")
    store.add(
        [
            Job(
                id="7",
                user=hostile,
                account=hostile,
                nodes=("node1",),
                gpus=1,
                start=0.0,
                state="RUNNING",
                name=hostile,
            ),
            Sample(
                metric="DCGM_FI_DEV_GPU_UTIL",
                labels={"Hostname": "node1", "gpu": "0", "hpc_job": "7"},
                t=1.0,
                value=50.0,
            ),
        ]
    )
    with TestClient(create_app(store, reference_cluster())) as client:
        page = client.get("/").text
        live = client.get("/api/live")
    assert "<script>alert(1)" not in page  # HTML-escaped in the table, \u003c in the boot JSON
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in page and "[bold]root[/bold]" in page  # shown as typed
    assert page.count("</script>") == page.count("<script")  # only the page's own elements close
    assert live.json()["gpus"]["node1/0"]["user"] == hostile  # JSON keeps the value exact, escaped
    assert b"\x1b" not in live.content
