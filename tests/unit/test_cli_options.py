"""What the commands receive from click: repeated options and positional lists as lists, paths as ``Path``,
defaults as they were under typer, ranges refused with one line."""

from __future__ import annotations

from pathlib import Path

import click
import orjson
import pytest

from hpcwatch.cli import app
from hpcwatch.cli.common import Number

DATA = Path(__file__).resolve().parents[1] / "data"


def _params(*argv: str) -> dict:
    """The values click hands the command at ``argv`` (a path under ``app``), without running it."""
    group, names = app, list(argv)
    while isinstance(group, click.Group):
        group = group.get_command(click.Context(group), names.pop(0))  # imports the command's module
    with group.make_context(" ".join(argv[: len(argv) - len(names)]), names, parent=None) as ctx:
        return ctx.params


@pytest.mark.parametrize(
    "argv, name, expected",
    [
        # a positional list: a list of Path, empty when none given
        (("steps", "a.json", "b.json.gz"), "paths", [Path("a.json"), Path("b.json.gz")]),
        (("nccl",), "paths", []),
        # repeated options: lists, in the order given
        (("scan", "--storage-host", "oss1", "--storage-host", "oss2"), "storage_host", ["oss1", "oss2"]),
        (("health", "--dcgmi-diag", "d1.json", "--dcgmi-diag", "d2.json"), "dcgmi", [Path("d1.json"), Path("d2.json")]),
        (("twin", "run", "--out", "o", "--scenario", "straggler"), "scenario", ["straggler"]),
        # a repeatable option's default is a list too
        (("scan",), "dataset_prefix", ["/lustre/datasets"]),
        (("steps", "t.json"), "slurm_job_extra", []),
        # an option of type Path, and one left out (None)
        (("assess", "--cluster", "c.yaml"), "cluster_file", Path("c.yaml")),
        (("assess",), "html", None),
        # typed numbers, and the defaults copied into cli/defaults.py
        (("steps", "t.json", "--d-model", "4096"), "d_model", 4096),
        (("steps", "t.json"), "dask_timeout", 300.0),
        (("collect",), "config", Path("/etc/hpcwatch/hpcwatch.toml")),
        (("serve",), "keep_read_jobs", 3),
        (("demo", "--keep-read-jobs", "0"), "keep_read_jobs", 0),
        # an on/off pair, on by default
        (("twin", "serve"), "hpc_job", True),
        (("twin", "serve", "--no-hpc-job"), "hpc_job", False),
        # a flag, off by default, under the name the function takes
        (("jobs",), "json_out", False),
        (("steps", "t.json", "--json"), "as_json", True),
    ],
)
def test_a_command_receives_typed_values(argv, name, expected):
    value = _params(*argv)[name]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("argv", [("serve", "--keep-read-jobs", "33"), ("demo", "--keep-read-jobs", "-1")])
def test_a_count_out_of_its_range_is_refused(argv):
    with pytest.raises(click.BadParameter, match=r"not in the range 0<=x<=32") as refused:
        _params(*argv)
    assert refused.value.param is not None and refused.value.param.name == "keep_read_jobs"


def test_a_port_out_of_range_is_the_usage_error_not_a_traceback(run_cli):
    """``exporter --port 70000`` ended in the socket's OverflowError."""
    code, out, err = run_cli(["exporter", "--db", ":memory:", "--port", "70000", "--duration", "0.1"])
    assert (
        code == 2 and out == "" and "Traceback" not in err and "'--port': 70000 is not in the range 0<=x<=65535" in err
    )


def _number_options():
    """(command path, option) of every option of every command whose value is a number with a fraction."""
    from tests.unit.test_cli_startup import _commands

    for path, command in _commands(app):
        for param in command.params:
            if isinstance(param.type, click.FloatRange) or param.type is click.FLOAT:
                yield path, param


def test_every_number_option_refuses_nan_and_infinity_with_the_usage_error():
    """``nan`` passes click's ``float`` and every range (no comparison holds for it): each option that takes a
    number is a ``Number``, which refuses it, and ``inf`` unless the option says what infinity means."""
    found = list(_number_options())
    assert len(found) > 30
    for path, param in found:
        assert isinstance(param.type, Number), f"{' '.join(path)} {param.opts[0]}: click's float takes nan"
        with pytest.raises(click.BadParameter, match=r"is not a (finite )?number"):
            param.type.convert("nan", param, None)
        if not param.type.infinite:
            with pytest.raises(click.BadParameter, match=r"is not a finite number|not in the range"):
                param.type.convert("inf", param, None)
    assert _params("exporter", "--ended-within", "inf")["ended_within_s"] == float("inf")


@pytest.mark.parametrize(
    "argv",
    [["top", "--speed", "nan"], ["top", "--speed", "0"], ["twin", "run", "--out", "x", "--step", "nan"]],
)
def test_a_number_that_would_break_a_command_is_one_line_and_status_2(run_cli, argv):
    """``top --speed nan`` ended in a traceback (``round(interval / (tick * speed))``), ``--speed 0`` in a division
    by zero."""
    code, out, err = run_cli(argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and f"'{argv[-2]}'" in err


def test_repeated_options_reach_the_scan_as_lists(run_cli):
    """``--storage-host`` is added to the cluster's host list (list + list): a tuple would raise here."""
    code, out, err = run_cli(
        [
            "scan",
            str(DATA / "security/falco_docs_alert.jsonl"),
            "--storage-host",
            "oss1",
            "--storage-host",
            "oss2",
            "--owner",
            "alice",
            "--allow-shell",
            "root@nvcr.io/",
            "--json",
        ]
    )
    assert code == 0, err
    assert [f["rule"] for f in orjson.loads(out)["findings"]] == ["container_escape.falco_other"]
