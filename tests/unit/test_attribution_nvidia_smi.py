"""nvidia-smi CSV as attribution input: one power sample per GPU and time, no GPU without its index."""

from __future__ import annotations

import pytest

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.sources.nvidia_smi import parse_nvidia_smi_csv
from tests.conftest import DATA

REAL = (DATA / "nvidia_smi/nvidia_smi_query.csv").read_text()  # one real H200 row, power.draw only


def _with_instant_power(text: str, watts: str) -> str:
    """The real CSV with a power.draw.instant column added after power.draw (as a --query-gpu list naming
    both would print it); made here, in memory."""
    header, row = text.strip().split("\n")
    return (
        header.replace("power.draw [W],", "power.draw [W], power.draw.instant [W],")
        + "\n"
        + row.replace("77.88 W,", f"77.88 W, {watts},")
        + "\n"
    )


def test_power_draw_and_instant_give_one_power_sample_the_instant_one() -> None:
    samples = list(parse_nvidia_smi_csv(_with_instant_power(REAL, "81.02 W")))
    power = [s for s in samples if s.metric == vocab.DCGM_FI_DEV_POWER_USAGE]
    assert [(s.labels["gpu"], s.value) for s in power] == [("0", 81.02)]


def test_instant_power_not_supported_falls_back_to_power_draw() -> None:
    samples = list(parse_nvidia_smi_csv(_with_instant_power(REAL, "[N/A]")))
    assert [s.value for s in samples if s.metric == vocab.DCGM_FI_DEV_POWER_USAGE] == [77.88]


@pytest.mark.parametrize(
    "text",
    [
        # the real row without its index column: which GPU it is, nothing says
        REAL.replace(" index,", "").replace(", 0, GPU-", ", GPU-"),
        # uuid alone names the board, not the index dcgm-exporter and Slurm use
        "timestamp, uuid, utilization.gpu [%]\n2026/11/29 22:14:46.082, GPU-75d41c9c, 5 %\n",
    ],
)
def test_a_csv_without_index_is_a_parse_error_not_gpu_none(text) -> None:
    with pytest.raises(ParseError, match="no index column"):
        list(parse_nvidia_smi_csv(text, path="q.csv"))


def test_real_mig_xml_gives_one_gpu_report_per_instance(tmp_path) -> None:
    """The real CEEMS A100 capture: a job holding GPU 2 of n1 sees its three MIG instances, each with its own
    memory high-water mark (keyed 2.1, 2.5, 2.13 as dcgm-exporter's GPU_I_ID lines are)."""
    from hpcwatch.ingest import ingest_paths
    from hpcwatch.records import Job
    from hpcwatch.reports.jobs import job_report
    from hpcwatch.store import Store

    t = 1728671049.0  # <timestamp>Fri Oct 11 18:24:09 2024</timestamp>
    with Store(tmp_path / "s") as store:
        ingest_paths(store, [DATA / "nvidia_smi/nvidia_smi_q_a100_mig_ceems.xml"], host="n1")
        with store.transaction() as tx:
            tx.add([Job(id="77", nodes=("n1",), gpus=1, gpus_by_node={"n1": (2,)}, start=t - 60, end=t + 60)])
        report = job_report(store, "77")
    per = {(g.gpu, g.instance): g.max_fb_used_bytes for g in report.per_gpu}
    assert per == {("2", "1"): 37 * 2**20, ("2", "5"): 12 * 2**20, ("2", "13"): 12 * 2**20}
