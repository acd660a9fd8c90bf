"""Critical path (analysis.critical_path) against HTA 0.5.0's answers on HTA's own example traces.

"Equal" here means: the same path, edge for edge (type, weight in µs, the trace row it is put down to), so the
same length and the same µs by bound_by; HTA's numbers are in tests/data/kineto/hta_cp_expected.json, written by
benchmarks/hta_critical_path_expected.py with HTA in its own venv.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcwatch.analysis.critical_path import (
    EDGE_DEPENDENCY,
    EDGE_OPERATOR,
    CriticalPathError,
    critical_path,
)
from hpcwatch.cli.common import app
from hpcwatch.errors import ConfigError, InputError
from hpcwatch.sources.kineto import parse_kineto, read_kineto

DATA = Path(__file__).resolve().parent.parent / "data" / "kineto"
EXPECTED = json.loads((DATA / "hta_cp_expected.json").read_text())["cases"]
_SIMPLE_ADD = "hta_cp_simple_add.json.gz [param|pytorch.model.alex_net|0|0|0|measure|forward] #1"


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_equals_hta(name: str) -> None:
    want = EXPECTED[name]
    cp = critical_path(
        read_kineto(DATA / want["file"]), annotation=want["annotation"], instances=(want["instance"],) * 2
    )
    assert [[e.kind, e.duration_us, e.event] for e in cp.edges] == want["edges"]
    assert cp.length_us == want["length_us"]
    assert {k: v for k, v in cp.bound_by_us.items() if v} == want["bound_by_us"]
    assert (cp.nodes, cp.graph_edges) == (want["nodes"], want["graph_edges"])
    shares = sum(e.share for e in cp.events)
    assert 0 < shares <= 1.0 + 1e-9  # the path's op/kernel time; the rest is launch delays and gaps


def test_the_step_is_cpu_bound_by_cuda_malloc() -> None:
    """simple_add's measured forward: 99.8 % of the path is host time, 3/4 of it one cudaMalloc (HTA says so too)."""
    want = EXPECTED[_SIMPLE_ADD]
    cp = critical_path(read_kineto(DATA / "hta_cp_simple_add.json.gz"), annotation=want["annotation"], instances=(1, 1))
    top = cp.events[0]
    assert top.name == "cudaMalloc" and top.on_path_us == 179324
    assert cp.bound_by_us["cpu_bound"] / cp.length_us > 0.99


@pytest.mark.parametrize("enabled", [True, False])
def test_the_analysis_leaves_garbage_collection_as_it_was(enabled: bool) -> None:
    import gc

    trace, was = read_kineto(DATA / "hta_cp_simple_add.json.gz"), gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        critical_path(trace, annotation=EXPECTED[_SIMPLE_ADD]["annotation"], instances=(1, 1))
        assert gc.isenabled() is enabled
        with pytest.raises(CriticalPathError):
            critical_path(trace, annotation="no such step")
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def _doc(events: list[dict]) -> dict:
    return {"traceEvents": events, "distributedInfo": {"rank": 0, "world_size": 1}}


def _x(name: str, cat: str, ts: float, dur: float, **args: object) -> dict:
    tid = args.pop("tid", 1)
    pid = args.pop("pid", 1)
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_a_launch_hangs_its_kernel_off_the_launch() -> None:
    events = [
        _x("ProfilerStep#1", "user_annotation", 0, 100),
        _x("aten::mm", "cpu_op", 1, 20),
        _x("cudaLaunchKernel", "cuda_runtime", 5, 5, correlation=7),
        _x("gemm", "kernel", 12, 80, correlation=7, stream=7, pid=0, tid=7),
        _x("cudaStreamSynchronize", "cuda_runtime", 30, 65, correlation=8),
        _x("Stream Sync", "cuda_sync", 30, 65, correlation=8, stream=7, pid=0, tid=7),
        _x("aten::add", "cpu_op", 96, 4),
    ]
    cp = critical_path(parse_kineto(_doc(events)))
    kinds = [e.kind for e in cp.edges]
    assert kinds == [
        EDGE_OPERATOR,  # aten::mm until its launch
        "critical_path_kernel_launch_delay",
        EDGE_OPERATOR,  # the kernel
        "critical_path_sync_dependency",  # the sync returns when the kernel ends (its wait weighs 0)
        EDGE_DEPENDENCY,
        EDGE_OPERATOR,  # aten::add
    ]
    assert cp.length_us == 4 + 7 + 80 + 4
    assert cp.events[0].name == "gemm" and cp.events[0].on_path_us == 80
    assert cp.bound_by_us["gpu_kernel_launch_overhead"] == 7


def test_missing_correlation_is_a_partial_answer() -> None:
    """A kernel whose launch is not in the trace is not in the window: the host chain alone is the path."""
    events = [
        _x("ProfilerStep#1", "user_annotation", 0, 100),
        _x("aten::mm", "cpu_op", 1, 20),
        _x("gemm", "kernel", 12, 80, correlation=99, stream=7, pid=0, tid=7),
    ]
    cp = critical_path(parse_kineto(_doc(events)))
    assert [e.kind for e in cp.edges] == [EDGE_OPERATOR] and cp.length_us == 20


def test_no_such_annotation_is_one_line() -> None:
    with pytest.raises(CriticalPathError, match="no event named like"):
        critical_path(parse_kineto(_doc([_x("aten::mm", "cpu_op", 1, 20)])))


def test_a_cycle_is_refused_not_looped() -> None:
    from hpcwatch.analysis.critical_path import _Graph, _longest_path

    g = _Graph([0, 1, 2])
    g.add(0, 1, 1)
    g.add(1, 2, 1)
    g.add(2, 0, 1)
    with pytest.raises(CriticalPathError, match="cycle"):
        _longest_path(g)


def test_sync_on_its_own_stream_is_refused() -> None:
    """Two Stream Wait Events chained so a kernel waits on one of its own stream: HTA's graph check fails it."""
    events = [
        _x("ProfilerStep#1", "user_annotation", 0, 200),
        _x("cudaLaunchKernel", "cuda_runtime", 1, 2, correlation=1),
        _x("k1", "kernel", 5, 10, correlation=1, stream=7, pid=0, tid=7),
        _x("cudaEventRecord", "cuda_runtime", 4, 1, correlation=2),
        _x("cudaStreamWaitEvent", "cuda_runtime", 6, 1, correlation=3),
        _x(
            "Stream Wait Event",
            "cuda_sync",
            6,
            0,
            correlation=3,
            stream=7,
            pid=0,
            tid=7,
            wait_on_stream=7,
            wait_on_cuda_event_record_corr_id=2,
        ),
        _x("cudaLaunchKernel", "cuda_runtime", 8, 2, correlation=4),
        _x("k2", "kernel", 20, 10, correlation=4, stream=7, pid=0, tid=7),
    ]
    with pytest.raises(CriticalPathError, match=r"sync between two kernels of stream 7"):
        critical_path(parse_kineto(_doc(events)))


def test_cli_json_and_errors(tmp_path: Path) -> None:
    want = EXPECTED["hta_cp_event_sync.json.gz ProfilerStep #0"]
    trace = DATA / "hta_cp_event_sync.json.gz"
    result = CliRunner().invoke(app, ["steps", str(trace), "--critical-path", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["length_us"] == want["length_us"]
    assert doc["shorten"][0]["bound_by"] == "cpu_bound"
    human = CliRunner().invoke(app, ["steps", str(trace), "--critical-path"])
    assert human.exit_code == 0 and "Critical path" in human.output
    bad = CliRunner().invoke(app, ["steps", str(trace), "--critical-path", "--instance", "x"])
    assert isinstance(bad.exception, ConfigError) and "--instance" in str(bad.exception)
    two = CliRunner().invoke(app, ["steps", str(trace), str(trace), "--critical-path"])
    assert isinstance(two.exception, ConfigError)
    empty = tmp_path / "rank-0.json.gz"
    with gzip.open(empty, "wt") as f:
        json.dump(_doc([_x("aten::mm", "cpu_op", 1, 20)]), f)
    none = CliRunner().invoke(app, ["steps", str(empty), "--critical-path"])
    assert isinstance(none.exception, InputError) and "no event named like" in str(none.exception)
    assert "\n" not in str(none.exception)


def test_a_shared_correlation_pairs_as_pandas_does_without_n_squared_pairs() -> None:
    """HTA's merge writes every (launch, kernel) pair of a correlation; the last written stays. 20k events
    on each side of one correlation would be 4e8 pairs: we take the last ones directly."""
    import numpy as np

    from hpcwatch.analysis.critical_path import _index_correlation

    corr = np.array([5, 5, 5, 5, -1, 7, 9], dtype=np.int64)
    gpu = np.array([False, True, False, True, False, True, False])
    assert _index_correlation(corr, gpu).tolist() == [3, 2, 3, 2, -1, 0, 0]
    n = 20_000
    many = _index_correlation(np.full(2 * n, 11, dtype=np.int64), np.arange(2 * n) % 2 == 1)
    assert many[0] == 2 * n - 1 and many[1] == 2 * n - 2


def test_whole_process_errors_are_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    import hpcwatch

    trace = tmp_path / "rank-0.json"
    trace.write_text(json.dumps(_doc([_x("aten::mm", "cpu_op", 1, 20)])))
    done = subprocess.run(
        [sys.executable, "-m", "hpcwatch", "steps", str(trace), "--critical-path"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(hpcwatch.__file__).parents[1])},
    )
    assert done.returncode == 2
    assert (
        done.stderr.count("\n") == 1 and done.stderr.startswith("hpcwatch: ") and "no event named like" in done.stderr
    )


def test_shorten_names_the_ops_and_what_they_save_at_most() -> None:
    from hpcwatch.reports.deepdive import critical_path_document

    want = EXPECTED[_SIMPLE_ADD]
    doc = critical_path_document(
        read_kineto(DATA / "hta_cp_simple_add.json.gz"), annotation=want["annotation"], instances=(1, 1)
    )
    first = doc["shorten"][0]
    assert first["bound_by"] == "cpu_bound" and first["us"] == want["bound_by_us"]["cpu_bound"]
    assert first["first"][0] == {"name": "cudaMalloc", "on_path_us": 179324, "saves_at_most_us": 179324}
    assert sum(s["us"] for s in doc["shorten"]) == doc["length_us"]
    top = doc["by_name"][0]
    assert (top["name"], top["events"], top["on_path_us"]) == ("cudaMalloc", 5, 179324 + 16743 + 14614 + 14561 + 10176)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", ["hta_gpu_lags_host_rank0.json.gz", "hta_a100_nccl_rank0.json.gz"])
def test_the_fast_call_stack_walk_is_htas(name: str) -> None:
    """The numpy sort on compare_events' keys and the one-sweep walk give HTA's cmp sort and tree DFS, thread
    for thread, on real traces (every host event of a window lasts > 0 µs, where the fast way is taken)."""
    from collections import defaultdict

    from hpcwatch.analysis.critical_path import _stack_events, _walk, hta_columns

    trace = read_kineto(DATA / name)
    c = hta_columns(trace)
    threads: dict[tuple[int, int], list[int]] = defaultdict(list)
    for r in range(len(c.ts)):
        if c.stream[r] == -1 and c.dur[r] > 0:
            threads[(c.pid[r], c.tid[r])].append(r)
    assert sum(len(rows) for rows in threads.values()) > 1000
    for rows in threads.values():
        fast, total = _stack_events(rows, c)
        assert total and fast == _stack_events(rows, c, fast=False)[0]
        assert [list(col) for col in _walk(rows, c)] == [list(col) for col in _walk(rows, c, fast=False)]


def test_a_zero_duration_call_stack_is_sorted_as_hta_sorts() -> None:
    """A zero duration makes compare_events intransitive: the fast way is not taken."""
    from hpcwatch.analysis.critical_path import _stack_events, _walk, hta_columns

    trace = parse_kineto(
        _doc([_x("a", "cpu_op", 1, 10), _x("b", "cpu_op", 5, 0.4), _x("c", "cpu_op", 5, 3), _x("d", "cpu_op", 8, 0)])
    )
    c = hta_columns(trace)
    events, total = _stack_events([0, 1, 2, 3], c)
    assert not total and events == _stack_events([0, 1, 2, 3], c, fast=False)[0]
    walk = _walk([0, 1, 2, 3], c)
    entered, left = walk.row[walk.entering].tolist(), walk.row[~walk.entering].tolist()
    assert entered[0] == 0 and sorted(entered) == sorted(left) == [0, 1, 2, 3]
