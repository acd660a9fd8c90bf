"""Attribution (hpc_job label vs Slurm allocation) and the job report, and the jobs/job commands' contract."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcwatch.analysis.attribution import REPORT_METRICS, attribute, job_reports
from hpcwatch.model import reference_cluster
from hpcwatch.records import Job
from hpcwatch.store import SAMPLE_SCHEMA, Store
from hpcwatch.twin.live import LiveTwin


@pytest.fixture(scope="module")
def twin_store(tmp_path_factory):
    """Ten minutes of the reference twin, tick by tick, in a store file."""
    path = tmp_path_factory.mktemp("attr") / "twin.duckdb"
    with Store(path) as store:
        live = LiveTwin(
            store, reference_cluster(), seed=21, scenarios=["straggler"], tick_s=10.0, start=1_796_000_000.0
        )
        live.write_tick()
        for _ in range(60):
            live.step()
    return path, live.twin


def _without_hpc_job(table: pa.Table) -> pa.Table:
    labels = [
        json.dumps({k: v for k, v in json.loads(lab).items() if k != "hpc_job"})
        for lab in table.column("labels").to_pylist()
    ]
    metric = table.column("metric").to_pylist()
    job = [None if m.startswith("DCGM_") else j for m, j in zip(metric, table.column("job").to_pylist())]
    return table.set_column(table.schema.get_field_index("job"), "job", pa.array(job, pa.string())).set_column(
        table.schema.get_field_index("labels"), "labels", pa.array(labels, pa.string())
    )


def test_attribution_by_hpc_job_and_by_allocation_agree(twin_store) -> None:
    path, _twin = twin_store
    with Store(path) as store:
        table = store.samples("DCGM_FI_DEV_GPU_UTIL")
        jobs = store.jobs()
    host = np.array(table.column("host").to_pylist(), dtype=object)
    gpu = np.array(table.column("gpu").to_pylist(), dtype=object)
    t = np.array(table.column("t").to_pylist())
    by_label = attribute(host, gpu, t, np.array(table.column("job").to_pylist(), dtype=object), jobs)
    by_alloc = attribute(host, gpu, t, np.full(len(t), None, dtype=object), jobs)
    assert (by_label != None).sum() > 0.9 * len(t)  # noqa: E711 (elementwise)
    assert by_label.tolist() == by_alloc.tolist()


def test_reports_are_the_same_with_and_without_hpc_job_labels(twin_store) -> None:
    path, _ = twin_store
    with Store(path) as store:
        table, jobs = store.samples(list(REPORT_METRICS)), store.jobs()
    with_labels = job_reports(table, jobs)
    without = job_reports(_without_hpc_job(table), jobs)
    assert [(r.id, r.energy_kwh, r.mean_gpu_util, r.ib_bytes, r.idle_gpus) for r in with_labels] == [
        (r.id, r.energy_kwh, r.mean_gpu_util, r.ib_bytes, r.idle_gpus) for r in without
    ]


def test_allocated_but_idle_gpu_and_users_accounts(twin_store) -> None:
    path, _ = twin_store
    with Store(path) as store:
        reports = {r.id: r for r in job_reports(store.samples(list(REPORT_METRICS)), store.jobs())}
    notebook = next(r for r in reports.values() if r.name == "jupyter")
    assert notebook.user == "dave" and notebook.account == "proj-vision" and notebook.idle_gpus == 1
    train = next(r for r in reports.values() if r.name == "gpt-pretrain")
    assert train.idle_gpus == 0 and train.mean_gpu_util > 90 and train.ib_bytes > 0 and train.lustre_bytes > 0
    assert train.max_fb_used_bytes <= 80 * 1024**3


def _table(rows: list[tuple[str, float, float, str | None, str | None, str | None, dict]]) -> pa.Table:
    cols = list(zip(*rows))
    return pa.table(
        {
            "metric": cols[0],
            "t": cols[1],
            "value": cols[2],
            "host": cols[3],
            "gpu": cols[4],
            "job": cols[5],
            "labels": [orjson.dumps(c).decode() for c in cols[6]],
        },
        schema=SAMPLE_SCHEMA,
    )


def test_ib_bytes_of_a_shared_rail_split_between_its_gpus_and_counter_resets_skipped() -> None:
    # 4 HCAs for 8 GPUs: mlx5_1 serves GPUs 2 and 3, held by two jobs; then the counter resets.
    job_a = Job(id="1", user="u", gpus=1, gpus_by_node={"n1": (2,)}, start=0.0, end=None, nodes=("n1",))
    job_b = Job(id="2", user="v", gpus=1, gpus_by_node={"n1": (3,)}, start=0.0, end=None, nodes=("n1",))
    rows = []
    for t in (10.0, 20.0, 30.0, 40.0):
        for g in range(8):
            rows.append(("DCGM_FI_DEV_GPU_UTIL", t, 50.0, "n1", str(g), None, {}))
    tx = {10.0: 1000.0, 20.0: 3000.0, 30.0: 3400.0, 40.0: 100.0}
    for t, v in tx.items():
        for h in range(4):
            rows.append(
                (
                    "node_infiniband_port_data_transmitted_bytes_total",
                    t,
                    v if h == 1 else 0.0,
                    None,
                    None,
                    None,
                    {"device": f"mlx5_{h}", "port": "1", "instance": "n1:9100"},
                )
            )
    reports = {r.id: r for r in job_reports(_table(rows), [job_a, job_b])}
    assert reports["1"].ib_tx_bytes == reports["2"].ib_tx_bytes == (2000 + 400) // 2


def test_jobs_json_contract(twin_store, run_cli) -> None:
    path, _ = twin_store
    code, out, _ = run_cli(["jobs", "--db", str(path), "--json"])
    assert code == 0
    doc = json.loads(out)
    required = {
        "id",
        "user",
        "account",
        "gpus",
        "gpu_hours",
        "energy_kwh",
        "mean_gpu_util",
        "ib_bytes",
        "lustre_bytes",
        "xid_errors",
        "idle_gpus",
    }
    assert doc["jobs"] and all(required <= set(j) for j in doc["jobs"])
    first = doc["jobs"][0]["id"]
    code, out, _ = run_cli(["job", first, "--db", str(path), "--json"])
    one = json.loads(out)
    assert code == 0 and one["id"] == first and required <= set(one) and one["per_gpu"]
    assert {"host", "gpu", "mean_util_pct", "max_fb_used_bytes", "energy_kwh", "idle"} <= set(one["per_gpu"][0])


def test_unknown_job_exits_2_with_one_line(twin_store, run_cli) -> None:
    path, _ = twin_store
    code, out, err = run_cli(["job", "999999", "--db", str(path), "--json"])
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("hpcwatch: ")


_ODD_ROWS = st.lists(
    st.tuples(
        st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS"]),
        st.sampled_from([8.0, 16.0, 24.0]),
        st.sampled_from([0.0, 50.0, 79.0]),
        st.sampled_from(["n1", "n2", "", None]),
        st.sampled_from(["0", "1", "", None]),
        st.sampled_from(["j1", "j2", "", None]),
        st.sampled_from([None, "{}", '{"GPU_I_ID": "1"}', '{"pod": "p", "namespace": "ml"}']),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(_ODD_ROWS)
def test_odd_rows_are_reported_not_raised_each_utilisation_sample_counted_once(rows) -> None:
    """Rows without a host, a GPU or labels, MIG instances and pods mixed in any order (a store's label sets
    come dictionary-encoded, null where a row has none): a report per workload, and each of its utilisation
    samples in exactly one of its GPUs' counts. Reports used to raise on some of these (a column of null
    labels; a host missing on some rows only)."""
    cols = list(zip(*rows)) if rows else [()] * 7
    labels = pa.array(list(cols[6]), pa.string()).dictionary_encode()
    table = pa.table(
        {name: pa.array(list(col), SAMPLE_SCHEMA.field(name).type) for name, col in zip(SAMPLE_SCHEMA.names[:6], cols)}
        | {"labels": labels}
    )
    reports = {r.id: r for r in job_reports(table, [], now=100.0)}
    for job in {r[5] for r in rows if r[5]}:
        util = [r for r in rows if r[5] == job and r[0] == "DCGM_FI_DEV_GPU_UTIL"]
        counted = sum(g.samples for g in reports[job].per_gpu) if job in reports else 0
        assert counted == len(util)
