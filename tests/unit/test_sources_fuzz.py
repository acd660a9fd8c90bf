"""Every reader, fed arbitrary text or bytes, yields records or raises ParseError: never another exception."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcwatch.errors import ParseError
from hpcwatch.sources import infiniband, lustre, mapping, nvidia_smi, prometheus_text, slurm
from hpcwatch.sources.registry import read_input

PARSERS = {
    "prometheus": lambda text: list(prometheus_text.parse_prometheus_text(text, t=0)),
    "prometheus-columns": lambda text: prometheus_text.parse_prometheus_columns(text, t=0),
    "squeue": lambda text: list(slurm.parse_squeue_json(text)),
    "squeue-records": lambda text: list(slurm.parse_squeue_records(text, t=0)),
    "sacct": lambda text: list(slurm.parse_sacct_json(text)),
    "scontrol": lambda text: list(slurm.parse_scontrol_show_job(text)),
    "perfquery": lambda text: list(infiniband.parse_perfquery(text)),
    "ibstat": lambda text: list(infiniband.parse_ibstat(text)),
    "lustre": lambda text: list(lustre.parse_job_stats(text, t=0)),
    "nvidia-smi-xml": lambda text: list(nvidia_smi.parse_nvidia_smi_xml(text, t=0)),
    "nvidia-smi-csv": lambda text: list(nvidia_smi.parse_nvidia_smi_csv(text, t=0)),
    "mapping-file": lambda text: mapping.parse_job_mapping_file(text),
}

# Text that looks a little like each format, so the fuzzing reaches past the first line.
_SEEDS = [
    '{"jobs": [{"job_id": 1, "nodes": "n[1-2]", "gres_detail": ["gpu:2(IDX:0-1)"], "job_state": ["RUNNING"]}]}',
    "JobId=1 JobState=RUNNING NodeList=n[1-2] Nodes=n1 GRES=gpu:1(IDX:0) StartTime=2026-01-01T00:00:00",
    "# Port counters: Lid 1 port 1\nPortXmitData:.....5\n",
    "CA 'mlx5_0'\n\tPort 1:\n\t\tState: Active\n\t\tRate: 400\n",
    "- job_id: 1\n  snapshot_time: 5\n  read_bytes: { samples: 1, unit: bytes, sum: 4 }\n",
    "<nvidia_smi_log><gpu><fb_memory_usage><used>4 MiB</used></fb_memory_usage></gpu></nvidia_smi_log>",
    "index, utilization.gpu [%]\n0, 5 %\n",
    'up{a="1"} 1 1000\n# TYPE up gauge\n',
]
_ALPHABET = st.sampled_from(list("{}[]()\",:=-_.0123456789 \n\tabcJobIdPortCA<>/#%'+eNaInf\\") + ["\x00", "é"])


def _texts():
    mutated = st.builds(
        lambda seed, cut, junk: seed[:cut] + junk + seed[cut:],
        st.sampled_from(_SEEDS),
        st.integers(0, 120),
        st.text(_ALPHABET, max_size=8),
    )
    return st.one_of(st.text(_ALPHABET, max_size=80), mutated, st.text(max_size=40))


@pytest.mark.parametrize("name", sorted(PARSERS))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_texts())
def test_reader_yields_or_raises_parse_error(name, text):
    try:
        PARSERS[name](text)
    except ParseError:
        pass


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=200))
def test_read_any_on_arbitrary_bytes(tmp_path, data):
    path = tmp_path / "blob"
    path.write_bytes(data)
    try:
        list(read_input(path))
    except ParseError as err:
        assert str(path) in str(err)


_KEYS = st.sampled_from(
    [
        "jobs",
        "job_id",
        "nodes",
        "gres_detail",
        "job_state",
        "start_time",
        "end_time",
        "time",
        "start",
        "end",
        "tres",
        "allocated",
        "requested",
        "type",
        "name",
        "count",
        "set",
        "number",
        "infinite",
        "array",
        "task_id",
        "array_job_id",
        "array_task_id",
        "state",
        "current",
        "user_name",
        "user",
        "tres_alloc_str",
        "tres_req_str",
    ]
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2**64),
    st.floats(),
    st.sampled_from(
        ["", "gres", "gpu", "gpu:2(IDX:0-1)", "node[1-2]", "RUNNING", "PENDING", "gres/gpu=4", "None assigned"]
    ),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=5)),
    max_leaves=25,
)


@pytest.mark.parametrize("name", ["squeue", "squeue-records", "sacct"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=st.lists(_JSON, max_size=3))
def test_slurm_json_of_any_shape(name, jobs):
    import json

    text = json.dumps({"jobs": jobs})
    try:
        PARSERS[name](text)
    except ParseError:
        pass


READERS = {
    "prometheus": prometheus_text.read_prometheus_text,
    "prometheus-columns": prometheus_text.read_prometheus_columns,
    "squeue": slurm.read_squeue_json,
    "squeue-records": slurm.read_squeue_records,
    "sacct": slurm.read_sacct_json,
    "scontrol": slurm.read_scontrol_show_job,
    "perfquery": infiniband.read_perfquery,
    "ibstat": infiniband.read_ibstat,
    "lustre": lustre.read_job_stats,
    "nvidia-smi-xml": nvidia_smi.read_nvidia_smi_xml,
    "nvidia-smi-csv": nvidia_smi.read_nvidia_smi_csv,
}


@pytest.mark.parametrize("name", sorted(READERS))
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.one_of(st.binary(max_size=120), st.sampled_from(_SEEDS).map(lambda s: s.encode() + b"\xff\xfe")))
def test_reader_of_arbitrary_bytes(tmp_path, name, data):
    path = tmp_path / "blob"
    path.write_bytes(data)
    try:
        result = READERS[name](path)
        if not hasattr(result, "num_rows"):
            list(result)
    except ParseError as err:
        assert str(path) in str(err)
