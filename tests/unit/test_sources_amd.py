"""AMD GPUs: device-metrics-exporter text, amd-smi and rocm-smi JSON read as the DCGM fields the analyses read,
on real captures (tests/data/amd, SOURCES.md); a twin run of the MI300X model attributed to its jobs."""

from __future__ import annotations

import json

import pytest

from hpcwatch import vocab
from hpcwatch.errors import ParseError
from hpcwatch.model.catalog import gpu_spec
from hpcwatch.records import Sample
from hpcwatch.schemas import sample_keys
from hpcwatch.sources.amd_exporter import parse_amd_exporter_text, read_amd_exporter_text
from hpcwatch.sources.amd_gpu import EXPORTER_CLOCK
from hpcwatch.sources.amd_smi import parse_amd_smi_json, read_amd_smi_json
from hpcwatch.sources.rocm_smi import parse_rocm_smi_json, read_rocm_smi_json
from tests.conftest import DATA

AMD = DATA / "amd"


def _by_metric(samples: list[Sample]) -> dict[str, Sample]:
    return {s.metric: s for s in samples}


# -- device-metrics-exporter -----------------------------------------------------------------------------------


def test_exporter_vram_and_energy_become_dcgm_fields_in_dcgm_units():
    got = _by_metric(list(read_amd_exporter_text(AMD / "dme_issue259_gpu_id0_vram_energy.prom", t=10.0)))
    assert got[vocab.DCGM_FI_DEV_FB_USED].value == 26.0  # MB (MiB) as exposed
    assert got[vocab.DCGM_FI_DEV_FB_FREE].value == 24534.0
    assert got[vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION].value == 0.0
    # what has no DCGM twin keeps the exporter's name
    assert got["gpu_used_gtt"].value == 15.0 and got["gpu_vcn_activity"].labels["vcn_index"] == "0"
    used = got[vocab.DCGM_FI_DEV_FB_USED]
    assert sample_keys(used.labels, used.metric) == ("cb76105c40d0", "0", None)  # empty job_id: no job
    assert used.labels["vendor"] == "amd" and used.labels["serial_number"] == ""  # the exporter's labels kept
    assert used.t == 10.0


def test_exporter_energy_in_microjoules_becomes_millijoules_and_job_id_is_the_job():
    text = (AMD / "dme_issue171_mi300x_vf_edge_temperature.prom").read_text()
    line = text.splitlines()[-1].replace("gpu_edge_temperature", vocab.GPU_ENERGY_CONSUMED)
    line = line.replace('job_id=""', 'job_id="4101"').rsplit(" ", 1)[0] + " 154864215852000"
    (s,) = parse_amd_exporter_text(line + "\n", t=1.0)
    assert s.metric == vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION and s.value == 154864215852.0
    assert sample_keys(s.labels, s.metric) == ("master-1", "0", "4101")
    assert s.labels["UUID"] == "17ff74b5-0000-1000-805c-37b0fbe69430"
    spec = gpu_spec(s.labels["modelName"])  # "Aqua Vanjaram [Instinct MI300X VF]"
    assert spec is not None and spec.key == "mi300x"


def test_exporter_gfx_activity_of_an_mi210_host_and_an_mi325x_guest():
    host, guest = read_amd_exporter_text(AMD / "dme_pr219_gfx_activity_mi210_host_mi325x_guest.prom", t=1.0)
    assert host.metric == guest.metric == vocab.DCGM_FI_DEV_GPU_UTIL and host.value == guest.value == 0.0
    assert sample_keys(host.labels, host.metric) == ("ubuntu22", "0", None)
    assert sample_keys(guest.labels, guest.metric) == ("mi325x8-110.atl1.do.cpe.ice.amd.com", "7", None)
    assert host.labels["modelName"] == "AMD Instinct MI210" and "modelName" not in guest.labels  # card_series ""
    assert guest.labels["virtualization_mode"] == "guest"


def test_exporter_metrics_field_prefix_is_dropped_from_the_families_it_renames():
    line = (AMD / "dme_pr219_gfx_activity_mi210_host_mi325x_guest.prom").read_text().splitlines()[0]
    text = "amd_" + line + "\namd_gpu_xgmi_link_rx" + line[len(vocab.GPU_GFX_ACTIVITY) :] + "\n"
    util, xgmi = parse_amd_exporter_text(text, t=1.0)
    assert util.metric == vocab.DCGM_FI_DEV_GPU_UTIL and xgmi.metric == "amd_gpu_xgmi_link_rx"


def test_exporter_clocks_by_type_and_xgmi_links_by_index():
    clocks = list(read_amd_exporter_text(AMD / "dme_docs_gpu_clock_labels.prom", t=1.0))
    assert [(s.metric, s.labels["clock_type"], s.value) for s in clocks] == [
        (EXPORTER_CLOCK, "data", 22.0),
        (vocab.DCGM_FI_DEV_SM_CLOCK, "system", 132.0),
        (vocab.DCGM_FI_DEV_MEM_CLOCK, "memory", 900.0),
        (EXPORTER_CLOCK, "video", 29.0),
        (EXPORTER_CLOCK, "soc", 29.0),
    ]
    links = list(read_amd_exporter_text(AMD / "dme_docs_xgmi_link_rx_tx.prom", t=1.0))
    rx = {s.labels["link_index"]: s.value for s in links if s.metric == vocab.GPU_XGMI_LINK_RX}
    assert len(rx) == 8 and rx["0"] == 0.0 and rx["1"] == 2.776148269e09  # KB, as exposed


def test_exporter_bad_line_is_one_parse_error_with_its_line():
    good = (AMD / "dme_issue259_gpu_id0_vram_energy.prom").read_text()
    with pytest.raises(ParseError) as err:
        list(parse_amd_exporter_text(good + 'gpu_used_vram{gpu_id="0"} lots\n', path="scrape.prom"))
    assert str(err.value).startswith(f"scrape.prom:{good.count(chr(10)) + 1}: ") and "\n" not in str(err.value)


# -- amd-smi ----------------------------------------------------------------------------------------------------


def test_amd_smi_metric_of_a_real_mi300x():
    got = _by_metric(list(read_amd_smi_json(AMD / "amd_smi_metric_mi300x_26.0.2_lilbee.json", hostname="n1", t=5.0)))
    assert got[vocab.DCGM_FI_DEV_GPU_UTIL].value == 0.0
    assert got[vocab.DCGM_FI_DEV_POWER_USAGE].value == 158.0
    assert got[vocab.DCGM_FI_DEV_GPU_TEMP].value == 45.0  # hotspot: the MI300X has no edge sensor (N/A)
    assert got[vocab.DCGM_FI_DEV_MEMORY_TEMP].value == 38.0
    assert vocab.GPU_EDGE_TEMPERATURE not in got
    assert got[vocab.DCGM_FI_DEV_GPU_UTIL].labels == {"gpu": "0", "vendor": "amd", "Hostname": "n1"}


def test_amd_smi_units_static_names_and_old_bare_list():
    doc = [
        {
            "gpu": 3,
            "asic": {"market_name": "AMD Instinct MI300X"},
            "bus": {"bdf": "0000:83:00.0"},
            "vram": {"size": {"value": 196592, "unit": "MB"}},
            "energy": {"total_energy_consumption": {"value": 2.5, "unit": "J"}},
            "mem_usage": {"used_vram": {"value": 1, "unit": "GB"}},
            "ecc": {"total_uncorrectable_count": 2, "total_correctable_count": "N/A"},
        }
    ]
    got = _by_metric(list(parse_amd_smi_json(json.dumps(doc), t=1.0)))
    assert got[vocab.DCGM_FI_DEV_FB_TOTAL].value == 196592.0
    assert got[vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION].value == 2500.0  # J -> mJ
    assert got[vocab.DCGM_FI_DEV_FB_USED].value == 1024.0  # GB -> MiB
    assert got[vocab.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL].value == 2.0  # the health rule ecc_dbe reads it
    assert vocab.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL not in got
    labels = got[vocab.DCGM_FI_DEV_FB_TOTAL].labels
    assert labels["gpu"] == "3" and labels["modelName"] == "AMD Instinct MI300X"
    assert labels["pci_bus_id"] == "0000:83:00.0"


@pytest.mark.parametrize(
    "text,what",
    [
        ('{"gpu_data": [{"gpu": 0, "usage": {"gfx_activity": {"value": "lots", "unit": "%"}}}]}', "not a reading"),
        ('{"gpu_data": [{"gpu": 0, "power": {"socket_power": {"value": 1e400, "unit": "W"}}}]}', "not JSON"),
        ('{"gpu_data": [{"gpu": 0, "power": {"socket_power": {"value": 3, "unit": "furlong"}}}]}', "unit"),
        ('{"gpu_data": [{"gpu": -1, "usage": {}}]}', "not an index"),
        ('{"gpu_data": {"gpu": 0}}', "not amd-smi JSON"),
        ('{"gpu_data": [{"gpu": 0,\n "usage": }]}', "not JSON"),
    ],
)
def test_amd_smi_bad_input_is_one_line(text, what):
    with pytest.raises(ParseError) as err:
        list(parse_amd_smi_json(text, path="m.json", t=1.0))
    message = str(err.value)
    assert message.startswith("m.json") and what in message and "\n" not in message


# -- rocm-smi ---------------------------------------------------------------------------------------------------


def test_rocm_smi_a_of_a_real_mi250_gcd_rocm6():
    got = _by_metric(list(read_rocm_smi_json(AMD / "rocm_smi_a_mi250_rocm6_wandb.json", hostname="n2", t=7.0)))
    assert got[vocab.DCGM_FI_DEV_POWER_USAGE].value == 91.0  # Average Graphics Package Power (MI200)
    assert got[vocab.DCGM_FI_DEV_GPU_TEMP].value == 44.0  # junction
    assert got[vocab.GPU_EDGE_TEMPERATURE].value == 43.0
    assert got[vocab.DCGM_FI_DEV_SM_CLOCK].value == 800.0  # "(800Mhz)"
    assert got[vocab.DCGM_FI_DEV_PCIE_REPLAY_COUNTER].value == 3824.0
    assert got[vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION].value == pytest.approx(4275228873299.2185)  # uJ -> mJ
    labels = got[vocab.DCGM_FI_DEV_GPU_UTIL].labels
    assert labels["modelName"] == "AMD INSTINCT MI250 (MCM) OAM AC MBA" and labels["driver_version"] == "6.2.4"
    assert gpu_spec(labels["modelName"]) is None  # an MI250 is not an MI250X: no other device's peak


def test_rocm_smi_of_a_real_mi300x_bytes_become_mib():
    got = _by_metric(list(read_rocm_smi_json(AMD / "rocm_smi_mi300x_lilbee.json", t=1.0)))
    assert got[vocab.DCGM_FI_DEV_POWER_USAGE].value == 159.0  # Current Socket Graphics Package Power (MI300)
    assert got[vocab.DCGM_FI_DEV_FB_TOTAL].value == 205822885888 / 2**20
    assert got[vocab.DCGM_FI_DEV_FB_USED].value == 299687936 / 2**20


@pytest.mark.parametrize(
    "text,what",
    [
        ('{"card0": {"GPU use (%)": "busy"}}', "not a reading"),
        ('{"card0": {"GPU use (%)": "1e400"}}', "not a finite number"),
        ('{"card0": ["x"]}', "not an object"),
        ('{"system": {}}', "not rocm-smi JSON"),
    ],
)
def test_rocm_smi_bad_input_is_one_line(text, what):
    with pytest.raises(ParseError) as err:
        list(parse_rocm_smi_json(text, path="r.json", t=1.0))
    assert str(err.value).startswith("r.json") and what in str(err.value) and "\n" not in str(err.value)


# -- catalog ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,key",
    [
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI300X OAM", "mi300x"),
        ("MI300X-O", "mi300x"),
        ("AMD Instinct MI325X", "mi325x"),
        ("AMD Instinct MI355X", "mi355x"),
        ("AMD INSTINCT MI250X (MCM) OAM LC MBA", "mi250x"),
        ("AMD Instinct MI308X", None),
        ("AMD INSTINCT MI250 (MCM) OAM AC MBA", None),
    ],
)
def test_amd_names_as_the_tools_report_them_resolve_to_their_own_spec_only(name, key):
    spec = gpu_spec(name)
    assert (spec.key if spec else None) == key


def test_mfu_works_on_amd_parts():
    from hpcwatch.analysis.mfu import compute_mfu

    # DESIGN's GPT 407M step (B 8, T 2048, 111.8 ms), as if on one MI300X and one H100: same FLOPs, other peaks.
    shape = {"params": 407e6, "layers": 24, "d_model": 1024, "seq": 2048, "tokens_per_step": 8 * 2048}
    amd = compute_mfu(**shape, step_time_s=0.1118, gpus=1, gpu="mi300x")
    nvidia = compute_mfu(**shape, step_time_s=0.1118, gpus=1, gpu="h100-sxm")
    assert amd.peak_flops == 1307.4e12 and amd.mfu == pytest.approx(nvidia.mfu * 989.4 / 1307.4)
    assert compute_mfu(**shape, step_time_s=0.1118, gpus=1, gpu="AMD Instinct MI355X").peak_flops == 2516.6e12


# -- the twin as an AMD cluster ---------------------------------------------------------------------------------


def test_twin_of_the_mi300x_model_is_attributed_to_its_jobs(tmp_path, run_cli):
    out, db = tmp_path / "run", tmp_path / "store"
    code, _, _ = run_cli(["twin", "run", "--model", "mi300x", "--out", str(out), "--duration", "120", "--json"])
    assert code == 0
    scrape = (out / "amd-device-metrics" / "node1.prom").read_text()
    assert not (out / "dcgm").exists() and "DCGM_FI" not in scrape and 'job_id="' in scrape
    code, ingested, _ = run_cli(["ingest", str(out), "--db", str(db), "--json"])
    assert code == 0 and json.loads(ingested)["formats"]["amd-device-metrics"] == 2
    code, text, _ = run_cli(["jobs", "--db", str(db), "--json"])
    jobs = {j["id"]: j for j in json.loads(text)["jobs"]}
    busy = [j for j in jobs.values() if j["gpus_observed"]]
    assert busy and all("hpc_job" in j["attributed_by"] for j in busy)  # the exporter's job_id label
    assert all(j["gpu_hours_observed"] > 0 and j["mean_gpu_util"] is not None for j in busy)
    assert any(j["energy_kwh"] > 0 for j in busy) and any(j["max_fb_used_bytes"] for j in busy)


# -- the existing health rules judge AMD readings of the same meaning ------------------------------------------


def _exporter_line(metric: str, value: float, t: float, *, gpu: int = 0) -> str:
    """One device-metrics-exporter line with the label set of the MI300X VF scrape of issue #171."""
    text = (AMD / "dme_issue171_mi300x_vf_edge_temperature.prom").read_text().splitlines()[-1]
    labels = text[text.index("{") : text.rindex("}") + 1].replace('gpu_id="0"', f'gpu_id="{gpu}"')
    return f"{metric}{labels} {value:g} {int(t * 1000)}"


def _health(lines: list[str]):
    from hpcwatch.analysis.health import HealthConfig, judge, passive_checks
    from hpcwatch.store import Store

    with Store(":memory:") as store:
        store.add(parse_amd_exporter_text("\n".join(lines) + "\n", path="scrape.prom"))
        table = store.samples()
    checks = passive_checks(table, [], config=HealthConfig())
    return judge(checks, samples=table, events=[])


def test_an_uncorrectable_ecc_error_on_an_mi300x_drains_its_node_and_replays_warn():
    t0 = 1_700_000_000.0
    lines = [_exporter_line(vocab.GPU_GFX_ACTIVITY, 90, t0 + 15 * k, gpu=g) for k in range(4) for g in (0, 1)]
    lines += [_exporter_line(vocab.GPU_ECC_UNCORRECT_TOTAL, 0 if k < 2 else 1, t0 + 15 * k) for k in range(4)]
    lines += [_exporter_line(vocab.PCIE_REPLAY_COUNT, 10 * k, t0 + 15 * k, gpu=1) for k in range(4)]
    report = _health(lines)
    rules = {(c.rule, c.verdict) for c in report.node("master-1").checks}
    assert ("ecc_dbe", "drain") in rules and ("pcie_replay", "warn") in rules
    assert report.node("master-1").verdict == "drain"


def test_a_healthy_mi300x_scrape_is_ok():
    t0 = 1_700_000_000.0
    lines = [_exporter_line(vocab.GPU_GFX_ACTIVITY, 90, t0 + 15 * k) for k in range(4)]
    lines += [_exporter_line(vocab.GPU_ECC_UNCORRECT_TOTAL, 0, t0 + 15 * k) for k in range(4)]
    assert _health(lines).node("master-1").verdict == "ok"


def test_the_twin_s_amd_scrape_reads_back_to_its_own_numbers():
    from hpcwatch.twin import Twin
    from hpcwatch.twin.devices import FIELD
    from hpcwatch.twin.run import sized_model

    twin = Twin(sized_model("mi300x"), seed=3)
    twin.advance(30.0)
    got = {
        (s.metric, s.labels["gpu"]): s
        for s in parse_amd_exporter_text(twin.dcgm_text("node2", jobs_by_gpu={0: "77"}, timestamp=True))
    }
    row = twin.gpu_row("node2", 0)
    for field in (
        vocab.DCGM_FI_DEV_GPU_UTIL,
        vocab.DCGM_FI_DEV_POWER_USAGE,
        vocab.DCGM_FI_DEV_FB_USED,
        vocab.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    ):
        assert got[field, "0"].value == pytest.approx(round(twin.fields[row, FIELD[field]], 3)), field
    first = got[vocab.DCGM_FI_DEV_GPU_UTIL, "0"]
    assert sample_keys(first.labels, first.metric) == ("node2", "0", "77") and first.t == twin.now
    assert gpu_spec(first.labels["modelName"]).key == "mi300x"
    assert sample_keys(got[vocab.DCGM_FI_DEV_GPU_UTIL, "1"].labels)[2] is None  # not in the mapping: free


def test_rocm_smi_rocm5_spelling_and_two_cards():
    samples = list(read_rocm_smi_json(AMD / "rocm_smi_a_mi250_rocm5_two_cards_wandb.json", t=1.0))
    util = {s.labels["gpu"]: s.value for s in samples if s.metric == vocab.DCGM_FI_DEV_GPU_UTIL}
    assert util == {"0": 10.0, "1": 20.0}
    mem = [s for s in samples if s.metric == vocab.DCGM_FI_DEV_MEM_COPY_UTIL]
    assert [s.value for s in mem] == [0.0, 0.0]  # "GPU memory use (%)", ROCm 5's name
    assert {s.labels["modelName"] for s in samples} == {"AMD INSTINCT MI250 (MCM) OAM AC MBA"}  # "Card series"
