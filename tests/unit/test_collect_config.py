"""The collector's TOML: the sample parses, every default is what the docs say, bad input is one line with its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcwatch.collect.config import CollectConfig, FollowSection, SlurmSection, load_config, parse_config
from hpcwatch.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_sample_config_parses_into_every_collector_kind():
    cfg = load_config(ROOT / "deploy" / "hpcwatch.toml")
    kinds = {type(c).__name__ for c in cfg.collectors}
    assert kinds == {"SlurmSection", "PrometheusSection", "FollowSection", "SpoolSection", "ScheduleSection"}
    assert [c.name for c in cfg.collectors if isinstance(c, FollowSection)] == ["falco", "tetragon"]


def test_empty_config_is_every_default():
    cfg = parse_config("")
    assert cfg.store.path == "/var/lib/hpcwatch/store" and cfg.collectors == ()
    assert cfg.collect.status_every_s == 5.0


def test_unnamed_collectors_are_named_by_kind_and_position():
    cfg = parse_config('[[follow]]\npath = "/a"\n[[follow]]\npath = "/b"\n[[slurm]]\n')
    assert [c.name for c in cfg.collectors] == ["slurm", "follow", "follow-2"]
    assert isinstance(cfg.collectors[0], SlurmSection) and cfg.collectors[0].interval_s == 30.0


def test_every_sample_key_is_documented_in_deploy_md():
    doc = (ROOT / "docs" / "deploy.md").read_text()
    from dataclasses import fields

    from hpcwatch.collect.config import SECTIONS, DaemonSection, StoreSection

    for cls in (StoreSection, DaemonSection, *SECTIONS.values()):
        for f in fields(cls):
            assert f"`{f.name}`" in doc, f"{cls.__name__}.{f.name} is not in docs/deploy.md"


BAD = [
    # an unknown key, on line 3, in the second [[follow]]
    ('[[follow]]\npath = "/a"\n[[follow]]\npath = "/b"\nformt = "x"\n', r"cfg\.toml:5: unknown key 'formt'"),
    # an unknown table
    ('[store]\npath = "/s"\n[slurmm]\nurl = "x"\n', r"cfg\.toml:3: unknown table \[slurmm\]"),
    # a collector written as a table, not an array of tables
    ('[slurm]\nmode = "rest"\n', r"cfg\.toml:1: \[slurm\] must be an array of tables"),
    # a string where a number belongs
    ('[[slurm]]\ninterval_s = "30"\n', r"cfg\.toml:2: interval_s must be float"),
    # a boolean where a number belongs (TOML true is not 1)
    ('[[spool]]\npath = "/s"\nsettle_s = true\n', r"cfg\.toml:3: settle_s must be float"),
    # a value outside its choices
    ('[[slurm]]\nmode = "grpc"\n', r"cfg\.toml:2: mode must be one of 'rest', 'cli'"),
    # a value its section refuses, with the line of that key
    (
        '[[prometheus]]\nurl = "http://p:9090"\n\ninterval_s = 0\n',
        r"cfg\.toml:4: \[prometheus\] interval_s must be > 0",
    ),
    # a follower with no path: the table's header line
    ('[collect]\n\n[[follow]]\nformat = "falco-json"\n', r"cfg\.toml:3: \[follow\] path is required"),
    # a format no follower reads
    ('[[follow]]\npath = "/x"\nformat = "kineto"\n', r"cfg\.toml:3: \[follow\] format must be one of"),
    # JWT half configured
    (
        '[[slurm]]\nurl = "http://c:6820"\nuser = "hpcwatch"\n',
        r"cfg\.toml:3: \[slurm\] user and token_file go together",
    ),
    # a TOML syntax error: tomllib's own line and column
    ("[store\npath = 1\n", r"cfg\.toml: .*line 1"),
    # two collectors with one name
    ('[[follow]]\nname = "x"\npath = "/a"\n[[spool]]\nname = "x"\npath = "/b"\n', r"two collectors are named 'x'"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_bad_config_is_one_line_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert "\n" not in str(err.value)


def test_a_missing_config_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"absent\.toml: cannot read"):
        load_config(tmp_path / "absent.toml")


def test_collect_config_is_frozen():
    with pytest.raises(AttributeError):
        CollectConfig().path = "x"  # type: ignore[misc]
