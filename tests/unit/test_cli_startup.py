"""``hpcwatch --help`` stays fast: it imports none of the heavy packages, lists every command with its help,
the option defaults copied into cli/defaults.py equal the constants they copy, and numpy's OpenBLAS
starts one thread, not one per core.

A timing test would be flaky on a shared machine; the imports are what made it slow (0.8-1.3 s before),
so the guard is on them.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

import hpcwatch
from hpcwatch.cli import app, defaults

#: Packages that cost --help tens to hundreds of milliseconds each, and that no help text needs. pydantic
#: (0.19 s) and rich (0.03 s) were typer's: it coerced every parameter through pydantic and drew with rich;
#: click needs neither, and the commands that print tables import rich when they run.
HEAVY = (
    "duckdb",
    "pyarrow",
    "numpy",
    "fastapi",
    "plotly",
    "torch",
    "scipy",
    "pandas",
    "yaml",
    "uvicorn",
    "starlette",
    "rich",
    "markdown_it",
    "dask",
    "distributed",
    "dask_jobqueue",
    "pydantic",
    "typer",
    "webbrowser",
)

_PROBE = """
import sys
sys.argv = ["hpcwatch", *sys.argv[1:]]
from hpcwatch.cli import main
try:
    main()
except SystemExit:
    pass
heavy = [m for m in {heavy!r} if m in sys.modules]
print("HEAVY-LOADED:", ",".join(heavy))
"""


def _help_in_a_fresh_process(*argv: str) -> tuple[str, list[str]]:
    env = dict(os.environ, PYTHONPATH=str(Path(hpcwatch.__file__).parents[1]), COLUMNS="100")
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    text, _, loaded = done.stdout.rpartition("HEAVY-LOADED:")
    return text, [m for m in loaded.strip().split(",") if m]


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),  # the whole command list
        ("twin", "--help"),  # a sub-group
        ("simulate", "--help"),
        ("steps", "--help"),  # one command's options
        ("goodput", "--help"),  # defaults that live in analysis modules
        ("scan", "--help"),
        ("twin",),  # a bare group shows its help
        ("steps", "--no-such-option"),  # a usage error is one line
    ],
)
def test_help_imports_no_heavy_package(argv):
    _, loaded = _help_in_a_fresh_process(*argv)
    assert loaded == [], f"hpcwatch {' '.join(argv)} imported {loaded}"


_READERS_PROBE = """
import sys
sys.argv = ["hpcwatch", "steps", *sys.argv[1:], "--json"]
from hpcwatch.cli import main
try:
    main()
except SystemExit:
    pass
print("READERS-LOADED:", ",".join(sorted(m for m in sys.modules if m.startswith("hpcwatch.sources."))))
"""


def test_steps_on_a_trace_loads_no_reader_but_kineto_s(data_dir):
    """Every format before Kineto's sniffs the trace; none may load its reader to say no (the NCCL log's
    reader compiles ~20 patterns: its sniff has a module of its own)."""
    env = dict(os.environ, PYTHONPATH=str(Path(hpcwatch.__file__).parents[1]))
    done = subprocess.run(
        [sys.executable, "-c", _READERS_PROBE, str(data_dir / "kineto" / "hta_a100_nccl_rank0.json.gz")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    loaded = set(done.stdout.rpartition("READERS-LOADED:")[2].strip().split(","))
    assert "hpcwatch.sources.kineto" in loaded and "hpcwatch.sources.nccl_sniff" in loaded
    assert "hpcwatch.sources.nccl_log" not in loaded, sorted(loaded)


def test_steps_on_a_trace_loads_no_cluster_model(data_dir):
    """MFU needs the catalog's GPU peaks, not the cluster model (whose module imports PyYAML)."""
    env = dict(os.environ, PYTHONPATH=str(Path(hpcwatch.__file__).parents[1]))
    done = subprocess.run(
        [sys.executable, "-c", _DEEPDIVE_PROBE, str(data_dir / "kineto" / "h200_annotated_steps.json.gz")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    loaded = set(done.stdout.rpartition("LOADED:")[2].strip().split(","))
    assert "hpcwatch.analysis.mfu" in loaded
    assert not {"yaml", "hpcwatch.model.cluster"} & loaded


_DEEPDIVE_PROBE = """
import io, sys
sys.argv = ["hpcwatch", "steps", *sys.argv[1:], "--json"]
from hpcwatch.cli import main
out, sys.stdout = sys.stdout, io.StringIO()
try:
    main()
except SystemExit:
    pass
sys.stdout = out
print("LOADED:", ",".join(sorted(sys.modules)))
"""


@pytest.mark.parametrize(
    ("argv", "unneeded"),
    [
        (
            ("hta_cp_event_sync.json.gz", "--critical-path"),
            # nor the other commands' modules (cli/__init__.py loads each when it runs), the table of every
            # format, or the record dataclasses
            (
                "hpcwatch.analysis.trace_diff",
                "hpcwatch.analysis.counters",
                "hpcwatch.cli.jobs",
                "hpcwatch.cli.whatif",
                "hpcwatch.sources.registry",
                "hpcwatch.records",
            ),
        ),
        (("hta_diff_base.json.gz", "--compare", "hta_diff_test.json.gz"), ("hpcwatch.analysis.counters",)),
    ],
)
def test_deepdive_loads_only_its_analysis(data_dir, argv, unneeded):
    """``--critical-path`` and ``--compare`` are timed against HTA whole process (benchmarks/RESULTS.md): they load
    no heavy package, not numpy.ma (np.isin's np.unique imports it), nor the other deep-dive analyses."""
    env = dict(os.environ, PYTHONPATH=str(Path(hpcwatch.__file__).parents[1]))
    args = [str(data_dir / "kineto" / a) if a.endswith(".gz") else a for a in argv]
    done = subprocess.run(
        [sys.executable, "-c", _DEEPDIVE_PROBE, *args], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    loaded = set(done.stdout.rpartition("LOADED:")[2].strip().split(","))
    assert "numpy" in loaded and "hpcwatch.reports.deepdive" in loaded  # it ran
    assert not loaded & {*HEAVY, *unneeded, "numpy.ma"} - {"numpy"}, sorted(loaded & {*HEAVY, *unneeded, "numpy.ma"})


_THREADS_PROBE = """
import importlib.abc, io, os, sys
seen = []

class AtNumpy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "numpy" and not seen:
            seen.append(os.environ.get("OPENBLAS_NUM_THREADS"))
        return None

sys.meta_path.insert(0, AtNumpy())
sys.argv = ["hpcwatch", "steps", {trace!r}, "--json"]
from hpcwatch.cli import main
out, sys.stdout = sys.stdout, io.StringIO()
try:
    main()
except SystemExit:
    pass
sys.stdout = out
print("AT-NUMPY:", seen)
"""


@pytest.mark.parametrize(("given", "seen"), [(None, "1"), ("4", "4")])
def test_numpy_loads_openblas_with_one_thread_unless_told(given, seen):
    # OpenBLAS reads the variable once, when numpy loads it: the command line sets it before any numpy import.
    trace = Path(__file__).parents[1] / "data/kineto/hta_a100_nccl_rank0.json.gz"
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["PYTHONPATH"] = str(Path(hpcwatch.__file__).parents[1])
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    done = subprocess.run(
        [sys.executable, "-c", _THREADS_PROBE.format(trace=str(trace))],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert done.stdout.rpartition("AT-NUMPY:")[2].strip() == repr([seen])


def _commands(group, prefix: tuple[str, ...] = ()):
    """(path, command) of every command under ``group``, sub-groups included (each command's module imported)."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield (*prefix, name), command
        if hasattr(command, "commands"):
            yield from _commands(command, (*prefix, name))


def test_the_lazy_tables_name_the_module_of_every_command():
    """``hpcwatch X`` imports the module ``HelpGroup.lazy`` names for X: with every module of cli/ imported, each
    group's commands are those of its table (a command missing from it would be missing from ``--help``), each
    registered by the module named."""
    import hpcwatch.cli as cli

    for module in pkgutil.iter_modules(cli.__path__):
        importlib.import_module(f"hpcwatch.cli.{module.name}")
    groups = {"": app, "twin": cli.twin_app, "simulate": cli.simulate_app}
    for where, group in groups.items():
        commands = {n: c for n, c in group.commands.items() if n not in groups}
        assert set(commands) == set(group.lazy), where
        assert {n: c.callback.__module__ for n, c in commands.items()} == group.lazy, where


def test_help_lists_every_command_with_the_start_of_its_help():
    listed = {}
    for path, command in _commands(app):
        parent = path[:-1]
        if parent not in listed:
            listed[parent] = " ".join(_help_in_a_fresh_process(*parent, "--help")[0].split())
        first_words = " ".join((command.help or "").split()[:6])
        assert first_words, f"{' '.join(path)} has no help text"
        assert f"{path[-1]} {first_words}" in listed[parent], f"{' '.join(path)} is missing from its group's help"


@pytest.mark.parametrize(
    "copy, home, name",
    [
        ("ACTIVE_CHECK_DAYS", "hpcwatch.assess.evidence", "DEFAULT_ACTIVE_CHECK_DAYS"),
        ("EXPORTER_PORT", "hpcwatch.exporter", "DEFAULT_PORT"),
        ("EXPORTER_RECENT_STEPS", "hpcwatch.exporter", "DEFAULT_RECENT_STEPS"),
        ("EXPORTER_ENDED_WITHIN_S", "hpcwatch.exporter", "DEFAULT_ENDED_WITHIN_S"),
        ("SERVE_MAX_STREAMS", "hpcwatch.httpguard", "DEFAULT_MAX_STREAMS"),
        ("SERVE_MAX_STREAMS_PER_CLIENT", "hpcwatch.httpguard", "DEFAULT_MAX_STREAMS_PER_CLIENT"),
        ("SERVE_KEEP_READ_JOBS", "hpcwatch.web.pagewarm", "WARM_JOBS"),
        ("SERVE_KEEP_READ_MAX_JOBS", "hpcwatch.web.pagewarm", "WARM_MAX_JOBS"),
        ("HEALTH_WINDOW_S", "hpcwatch.reports.health", "DEFAULT_HEALTH_WINDOW_S"),
        ("GOODPUT_GPUS", "hpcwatch.analysis.goodputsim", "LLAMA3_GPUS"),
        ("GOODPUT_DAYS", "hpcwatch.analysis.goodputsim", "LLAMA3_DAYS"),
        ("CHECKPOINT_COST_S", "hpcwatch.analysis.goodputsim", "DEFAULT_CHECKPOINT_COST_S"),
        ("RESTART_COST_S", "hpcwatch.analysis.goodputsim", "DEFAULT_RESTART_COST_S"),
        ("RESTORE_COST_S", "hpcwatch.analysis.goodputsim", "DEFAULT_RESTORE_COST_S"),
        ("GOODPUT_STEP_S", "hpcwatch.analysis.goodputsim", "DEFAULT_STEP_S"),
        ("SWEEP_GPUS", "hpcwatch.analysis.goodputsim", "DEFAULT_SWEEP_GPUS"),
        ("DATASET_PREFIXES", "hpcwatch.security.data_poisoning", "DEFAULT_DATASET_PREFIXES"),
        ("TWIN_STEP_S", "hpcwatch.twin.run", "DEFAULT_STEP_S"),
        ("TWIN_SERVE_PORT", "hpcwatch.twin.serve", "DEFAULT_PORT"),
        ("TWIN_SERVE_TICK_S", "hpcwatch.twin.serve", "DEFAULT_TICK_S"),
        ("MFU_GPU", "hpcwatch.analysis.mfu", "DEFAULT_GPU"),
        ("STRAGGLER_SIM_STEPS", "hpcwatch.analysis.stragglersim", "DEFAULT_STEPS"),
        ("DASK_SLURM_MEMORY", "hpcwatch.distributed", "DEFAULT_SLURM_MEMORY"),
        ("DASK_SLURM_WALLTIME", "hpcwatch.distributed", "DEFAULT_SLURM_WALLTIME"),
        ("DASK_START_TIMEOUT_S", "hpcwatch.distributed", "DEFAULT_START_TIMEOUT_S"),
    ],
)
def test_a_copied_default_equals_its_home_constant(copy, home, name):
    assert getattr(defaults, copy) == getattr(importlib.import_module(home), name)


def test_the_collect_config_default_is_the_collector_s():
    from hpcwatch.collect.config import DEFAULT_CONFIG_PATH

    assert Path(defaults.COLLECT_CONFIG_PATH) == DEFAULT_CONFIG_PATH


def test_every_copied_default_is_checked():
    """A new copy in cli/defaults.py needs its row in the table above."""
    checked = {c for c, *_ in test_a_copied_default_equals_its_home_constant.pytestmark[0].args[1]}
    assert set(defaults.__all__) == checked | {"COLLECT_CONFIG_PATH"}


def _gz_of(path: Path, json_bytes: int) -> Path:
    import gzip

    path.write_bytes(gzip.compress(b" " * json_bytes))
    return path


def test_a_small_set_is_read_in_this_process(tmp_path):
    from hpcwatch.reports.steps import reader_processes

    files = [_gz_of(tmp_path / f"rank-{r}.json.gz", 2**20) for r in range(8)]  # 8 MB of JSON
    assert reader_processes(files, cpus=16) == 1  # below PARALLEL_READ_MIN_JSON_BYTES: a fork would not pay


def test_a_large_set_is_shared_out_by_its_json_bytes(tmp_path, monkeypatch):
    import hpcwatch.reports.steps as step_reports

    monkeypatch.setattr(step_reports, "PARALLEL_READ_MIN_JSON_BYTES", 2 * 2**20)  # sizes scaled down 8 times
    monkeypatch.setattr(step_reports, "JSON_BYTES_PER_READER", 2**20)
    files = [_gz_of(tmp_path / f"rank-{r}.json.gz", 2**20) for r in range(8)]
    assert step_reports.reader_processes(files, cpus=16) == 8  # the gzip trailer's size, not the 1 KB file
    assert step_reports.reader_processes(files, cpus=2) == 2  # no more processes than cores
    assert step_reports.reader_processes(files[:1], cpus=16) == 1  # one file: nothing to share


@pytest.mark.parametrize(
    "words, cword, offered",
    [
        ("hpcwatch st", 1, "plain,steps"),  # a command
        ("hpcwatch twin s", 2, "plain,serve"),  # a sub-group's command
        ("hpcwatch steps --slurm-pa", 2, "plain,--slurm-partition"),  # an option
    ],
)
def test_the_shell_completion_offers_commands_and_options(words, cword, offered):
    """click's completion (``eval "$(_HPCWATCH_COMPLETE=bash_source hpcwatch)"``), answered in a fresh process."""
    env = dict(
        os.environ,
        PYTHONPATH=str(Path(hpcwatch.__file__).parents[1]),
        COMP_WORDS=words,
        COMP_CWORD=str(cword),
        _HPCWATCH_COMPLETE="bash_complete",
    )
    done = subprocess.run(
        [sys.executable, "-c", "from hpcwatch.cli import main; main()"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.split() == [offered], done.stdout + done.stderr
