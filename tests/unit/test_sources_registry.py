"""The format registry: every captured file finds its format, what a walk passes over is said, and the
paths a reader must never open (FIFOs, devices, sockets, loops) are refused with one line."""

from __future__ import annotations

import gzip
import os
import socket

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.records import Job, Sample
from hpcwatch.sources.registry import (
    RECORD_KINDS,
    Format,
    Input,
    Skipped,
    detect,
    format_named,
    formats,
    host_in_name,
    plan_inputs,
    read_input,
)
from tests.conftest import DATA


@pytest.mark.parametrize(
    "relpath,name",
    [
        ("prometheus/dcgm_exporter_node1.prom", "prometheus"),
        ("prometheus/node_exporter_infiniband.prom", "prometheus"),
        ("prometheus/timestamps_and_escapes.prom", "prometheus"),
        ("slurm/squeue.json", "squeue-json"),
        ("slurm/squeue_v0040_synthetic.json", "squeue-json"),
        ("slurm/sacct.json", "sacct-json"),
        ("slurm/sacct_v0040_synthetic.json", "sacct-json"),
        ("slurm/scontrol_show_job_detail.txt", "scontrol-job"),
        ("infiniband/perfquery_x_switch_2ports.out", "perfquery"),
        ("infiniband/perfquery_basic_hca.txt", "perfquery"),
        ("infiniband/ibstat_two_cas.txt", "ibstat"),
        ("infiniband/ibstat_mlx4_ib_down_eth_disabled_linux_rdma.txt", "ibstat"),
        ("infiniband/ibstat_mlx4_ddr_active_and_polling_archwiki.txt", "ibstat"),
        ("lustre/obdfilter_OST0000_job_stats.txt", "lustre-job-stats"),
        ("lustre/mdt_MDT0000_job_stats.txt", "lustre-job-stats"),
        ("nvidia_smi/nvidia_smi_q.xml", "nvidia-smi-xml"),
        ("nvidia_smi/nvidia_smi_query.csv", "nvidia-smi-csv"),
        ("amd/amd_smi_metric_mi300x_26.0.2_lilbee.json", "amd-smi-json"),
        ("amd/rocm_smi_a_mi250_rocm6_wandb.json", "rocm-smi-json"),
        ("amd/rocm_smi_mi300x_lilbee.json", "rocm-smi-json"),
        ("amd/rocm_smi_a_mi250_rocm5_two_cards_wandb.json", "rocm-smi-json"),
        ("amd/dme_issue259_gpu_id0_vram_energy.prom", "amd-device-metrics"),
        ("amd/dme_issue171_mi300x_vf_edge_temperature.prom", "amd-device-metrics"),
        ("amd/dme_docs_xgmi_link_rx_tx.prom", "amd-device-metrics"),
        ("amd/dme_pr219_gfx_activity_mi210_host_mi325x_guest.prom", "amd-device-metrics"),
        ("kineto/hta_a100_nccl_rank0.json.gz", "kineto"),
        ("bytedance/trace-ST.parquet", "optrace"),
        ("smartctl/nvme_samsung_mzwll3t2hajq_critical_warning_0x10.json", "smartctl-json"),
        ("smartctl/sat_wdc_wd20efrx_passed.json", "smartctl-json"),
        ("smartctl/nvme_gcm_learn_bad_nvme9_spare_below_threshold.json", "smartctl-json"),
        ("lspci/lspci_vvv_rtx6000ada_connectx7_stelline.txt", "lspci-vv"),
        ("lspci/lspci_vvd_10de_4x_rtx_a6000_neuropoly.txt", "lspci-vv"),
        ("chrony/chronyc_tracking_normal_chrony_doc.txt", "chronyc-tracking"),
        ("ofed_info/ofed_info_s_23.07_connectx5_daocloud.txt", "ofed-info"),
        ("prometheus/node_uname_info_6_nodes_otel_atlhyper.prom", "prometheus"),
        ("nvidia_smi/nvidia_smi_q_v100_busy_gen3_x16_datakit.xml", "nvidia-smi-xml"),
        ("nvidia_smi/nvidia_smi_q_gtx1660ti_idle_gen1_datakit.xml", "nvidia-smi-xml"),
        ("nvidia_smi/nvidia_smi_q_l4_idle_gen1_x8_thamada.txt", "nvidia-smi-q"),
        ("nvidia_smi/nvidia_smi_q_h100sxm_x8_replays_thamada.txt", "nvidia-smi-q"),
        ("chrony/chronyc_tracking_not_synchronised_liaosirui.txt", "chronyc-tracking"),
        ("kernel_log/dmesg_T_nvrm_xid_31_48_gcm.txt", "kernel-log"),
        ("kernel_log/dmesg_t_hung_task_docker_npd.txt", "kernel-log"),
        ("kernel_log/dmesg_t_oom_kill_memcg_npd.txt", "kernel-log"),
        ("systemd/systemctl_list_units_json_nginx_failed_ubuntu_tool.json", "systemctl-json"),
        ("ipmitool/ipmitool_sel_elist_bus_fatal_asserted_gcm.txt", "ipmitool-sel"),
        ("ipmitool/ipmitool_sdr_list_full_dell_r320_fans_cr_ha_issue52.txt", "ipmitool-sdr"),
        ("ipmitool/ipmitool_sdr_elist_full_hp_dl360g7_psu_failure_collegeboreal.txt", "ipmitool-sdr"),
        ("ipmitool/ipmitool_sensor_supermicro_ok_fancontrol_issue1.txt", "ipmitool-sdr"),
        ("ipmitool/ipmitool_sensor_supermicro_bpn_fan2_nc_issue1.txt", "ipmitool-sdr"),
        ("df/df_P_ohai_linux.txt", "df"),
        ("df/df_iP_ohai_linux.txt", "df"),
        ("df/df_PTk_zenoss_ubuntu1604_puffer.txt", "df"),
        ("df/df_h_root_96pct_snap_loops_aelve_codesearch_195.txt", "df"),
        ("df/df_i_root_inodes_100pct_psf_chef_43.txt", "df"),
        ("df/df_output_inodes_total_gnu_uutils_3355.txt", "df"),
        ("edac/edac_util_v_mc2_7836_ce_liaosirui.txt", "edac"),
        ("edac/sysfs_csrow_ch_ce_count_mc2_7836_liaosirui.txt", "edac"),
        ("edac/sysfs_rank_dimm_ce_count_edac_utils_15.txt", "edac"),
        ("edac/edac_util_report_full_noinfo_edac_utils_15.txt", "edac"),
        ("kernel_log/syslog_mce_bank6_corrected_nuc6_ha_os_2989.txt", "kernel-log"),
        ("kernel_log/syslog_mce_bank4_uncorrected_at_boot_mcelog_70.txt", "kernel-log"),
        ("kernel_log/dmesg_T_mce_sbridge_edac_ce_edac_utils_10.txt", "kernel-log"),
        ("kernel_log/syslog_edac_mc2_ce_ghes_corrected_liaosirui.txt", "kernel-log"),
    ],
)
def test_each_captured_file_is_recognised(relpath, name):
    assert detect(DATA / relpath).name == name


def test_empty_file_is_no_format_and_no_records():
    assert detect(DATA / "infiniband/perfquery_x_empty.out") is None
    assert list(read_input(DATA / "infiniband/perfquery_x_empty.out")) == []


def test_unknown_format_names_the_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("dear diary, the GPUs were hot today\n")
    with pytest.raises(ParseError) as err:
        read_input(path)
    assert str(err.value).startswith(f"{path}:1: unknown format")


def test_gzipped_files_are_read(tmp_path):
    path = tmp_path / "squeue.json.gz"
    path.write_bytes(gzip.compress((DATA / "slurm/squeue.json").read_bytes()))
    records = list(read_input(path))
    jobs = [r for r in records if isinstance(r, Job)]
    assert len(jobs) == 10 and all(isinstance(r, Sample) for r in records[10:])  # running jobs' elapsed, limit


def test_a_walk_reads_folders_in_name_order():
    planned = [i for i in plan_inputs([DATA / "lustre", DATA / "infiniband"]) if isinstance(i, Input)]
    assert [i.path.name for i in planned[:2]] == sorted(
        p.name for p in (DATA / "lustre").iterdir() if not p.name.startswith(".")
    )[:2]
    records = [r for i in planned if i.format for r in i.format.read(i.path, i.context)]
    assert all(isinstance(r, Sample) for r in records)
    assert {r.metric for r in records} >= {"lustre_job_write_bytes_total", "ib_PortXmitData_bytes", "ib_port_up"}


def test_forced_format_and_unknown_format_name():
    records = read_input(DATA / "slurm/squeue.json", format="squeue-json")
    assert len([r for r in records if isinstance(r, Job)]) == 10
    with pytest.raises(ParseError, match="unknown format 'yaml'"):
        format_named("yaml")


def test_format_names_are_unique_and_records_formats_name_their_kinds():
    names = [f.name for f in formats()]
    assert len(names) == len(set(names))
    assert all(f.kinds and set(f.kinds) <= set(RECORD_KINDS) for f in formats() if f.yields == "records")
    with pytest.raises(ValueError, match="must name its kinds"):
        Format(name="x", sniff=lambda h: False, read=lambda p, c: iter(()))


def test_a_walk_says_what_it_passed_over(tmp_path):
    (tmp_path / "README").write_text("dear diary\n")
    (tmp_path / "squeue.json").write_bytes((DATA / "slurm/squeue.json").read_bytes())
    (tmp_path / ".hidden.prom").write_text("up 1\n")
    planned = list(plan_inputs([tmp_path]))
    assert [(type(i).__name__, i.path.name) for i in planned] == [("Skipped", "README"), ("Input", "squeue.json")]
    assert planned[0].reason == "no format recognises it"


def _fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def _socket(tmp_path):
    path = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return path


def _zero_link(tmp_path):
    path = tmp_path / "zero.prom"
    path.symlink_to("/dev/zero")
    return path


def _dangling(tmp_path):
    path = tmp_path / "gone.prom"
    path.symlink_to(tmp_path / "nowhere")
    return path


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "make, what",
    [
        (_fifo, "a FIFO"),  # opening it would block until a writer came
        (_socket, "a socket"),
        (_zero_link, "a device"),  # a symlink to /dev/zero: endless bytes
        (_dangling, "a symlink to nothing"),
    ],
)
def test_special_files_are_refused_on_the_command_line_and_skipped_in_walks(tmp_path, make, what):
    path = make(tmp_path)
    with pytest.raises(ParseError) as err:
        list(plan_inputs([path]))
    assert str(err.value).startswith(f"{path}: {what}")
    if what != "a symlink to nothing":
        (skipped,) = [i for i in plan_inputs([tmp_path]) if isinstance(i, Skipped)]
        assert skipped.path == path and skipped.reason.startswith(what)


@pytest.mark.timeout(10)
def test_a_symlink_loop_is_walked_once(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "squeue.json").write_bytes((DATA / "slurm/squeue.json").read_bytes())
    (tmp_path / "a" / "loop").symlink_to(tmp_path / "a")
    planned = list(plan_inputs([tmp_path]))
    assert [i.path.name for i in planned if isinstance(i, Input)] == ["squeue.json"]
    assert any(isinstance(i, Skipped) and "already walked" in i.reason for i in planned)


def test_host_comes_from_the_path_as_a_whole_token():
    from pathlib import Path

    assert host_in_name(Path("/spool/node12-ib.prom"), ["node1", "node12"]) == "node12"
    assert host_in_name(Path("/spool/node1/mlx5_0.1.txt"), ["node1", "node12"]) == "node1"
    assert host_in_name(Path("/spool/node123.prom"), ["node1", "node12"]) is None


def test_node_exporter_text_gets_the_node_its_context_names(tmp_path):
    path = DATA / "prometheus/node_exporter_infiniband.prom"
    fmt = detect(path)
    (item,) = [i for i in plan_inputs([path], host="gpu7") if isinstance(i, Input)]
    records = list(fmt.read(path, item.context))
    tables = list(fmt.columns(path, item.context))
    assert records and all(r.labels.get("node") == "gpu7" for r in records)
    rows = [r for t in tables for r in t.to_pylist()]
    assert len(rows) == len(records) and {r["host"] for r in rows} == {"gpu7"}
    assert all('"node":"gpu7"' in r["labels"] for r in rows)


def test_the_projects_own_outputs_are_recognised(tmp_path):
    from hpcwatch.twin.threats import THREAT_SCENARIOS, write_threat_fixtures

    for scenario in THREAT_SCENARIOS:
        out = tmp_path / scenario
        write_threat_fixtures(out, scenario)
        skipped = [i for i in plan_inputs([out]) if isinstance(i, Skipped)]
        assert all("shard" in s.reason for s in skipped), (scenario, skipped)
