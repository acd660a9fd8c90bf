"""``df`` read and judged: a local file system almost out of space or of inodes warns, then drains.

Real captures (tests/data/SOURCES.md): Ohai's ``df -P`` and ``df -iP`` fixtures, Zenoss' ``df -PTk`` of an Ubuntu
16.04 host (ext4, xfs, vfat, tmpfs, nfs), and outputs pasted in issue threads: a root file system 96 % full among
full snap loop devices (``df -h``), a root file system out of inodes (``df -i``), GNU df's ``--output`` with
``--total``. The fill levels between them are the real files edited in memory."""

from __future__ import annotations

import pytest

from hpcwatch import vocab
from hpcwatch.analysis.health import HealthConfig, health_report
from hpcwatch.errors import ConfigError, ParseError
from hpcwatch.sources.df import parse_df, read_df
from hpcwatch.store import Store
from tests.conftest import DATA

D = DATA / "df"
BLOCKS = D / "df_P_ohai_linux.txt"
INODES = D / "df_iP_ohai_linux.txt"
TYPED = D / "df_PTk_zenoss_ubuntu1604_puffer.txt"
HUMAN_96 = D / "df_h_root_96pct_snap_loops_aelve_codesearch_195.txt"
INODES_100 = D / "df_i_root_inodes_100pct_psf_chef_43.txt"
OUTPUT_TOTAL = D / "df_output_inodes_total_gnu_uutils_3355.txt"
ROOT_ROW = "/dev/sda7                                               ext4        19554584  7314944  11223272      40% /"


def _node(samples, config=HealthConfig(), node="gpu07"):
    with Store(":memory:") as store:
        store.add(list(samples))
        table = store.samples()
    return health_report(table, config=config).node(node)


def _fired(node_health) -> dict[str, str]:
    return {c.rule: c.verdict for c in node_health.checks if c.verdict != "ok"}


def _by_mount(samples, metric):
    return {s.labels["mountpoint"]: s.value for s in samples if s.metric == metric}


def test_posix_blocks_are_bytes_per_mount_and_inodes_are_counts():
    samples = list(read_df(BLOCKS, node="gpu07"))
    size = _by_mount(samples, vocab.NODE_FILESYSTEM_SIZE_BYTES)
    avail = _by_mount(samples, vocab.NODE_FILESYSTEM_AVAIL_BYTES)
    assert size["/var"] == 19223252 * 1024 and avail["/var"] == 14810212 * 1024
    assert len(size) == 10 and not _by_mount(samples, vocab.NODE_FILESYSTEM_FILES)
    inodes = list(read_df(INODES, node="gpu07"))
    assert _by_mount(inodes, vocab.NODE_FILESYSTEM_FILES)["/special"] == 124865
    assert _by_mount(inodes, vocab.NODE_FILESYSTEM_FILES_FREE)["/"] == 1203313
    assert {s.labels["device"] for s in inodes} >= {"/dev/xvda1", "tmpfs", "none"}


def test_both_tables_in_one_file_give_space_and_inodes():
    samples = list(parse_df(BLOCKS.read_text() + "$ df -iP\n" + INODES.read_text(), node="gpu07"))
    special = {s.metric for s in samples if s.labels["mountpoint"] == "/special"}
    assert special == {
        vocab.NODE_FILESYSTEM_SIZE_BYTES,
        vocab.NODE_FILESYSTEM_AVAIL_BYTES,
        vocab.NODE_FILESYSTEM_FILES,
        vocab.NODE_FILESYSTEM_FILES_FREE,
    }


def test_the_type_column_labels_each_file_system():
    samples = list(read_df(TYPED, node="gpu07"))
    types = {s.labels["mountpoint"]: s.labels["fstype"] for s in samples}
    assert types["/"] == "ext4" and types["/mnt/test"] == "nfs" and types["/boot/efi"] == "vfat"
    assert types["/exports/serviced_volumes_v2/bgxogiyx1b2gc94i1wh2lm2c2"] == "xfs"


def test_human_sizes_are_read_in_powers_of_1024():
    avail = _by_mount(read_df(HUMAN_96, node="gpu07"), vocab.NODE_FILESYSTEM_AVAIL_BYTES)
    assert avail["/"] == pytest.approx(3.7 * 1024**3) and avail["/run"] == 394 * 1024**2 and avail["/dev"] == 2 << 30


def test_output_form_without_a_mount_column_keys_by_source_and_skips_the_total_row():
    samples = list(read_df(OUTPUT_TOTAL, node="gpu07"))
    devices = [s.labels["device"] for s in samples if s.metric == vocab.NODE_FILESYSTEM_FILES]
    assert "total" not in devices and devices.count("tmpfs") == 3
    # /dev/sda2 prints "-" for its inode use: its counts (0) are read, the rule skips a file system of 0 inodes
    assert _fired(_node(samples)) == {}


def test_a_mount_point_with_spaces_and_a_wrapped_source_are_read():
    text = "Filesystem 1K-blocks Used Available Use% Mounted on\n/dev/mapper/vg01-icprep\n  100 99 1 99% /mnt/my disk\n"
    (size, avail) = parse_df(text, node="gpu07")
    assert size.labels == {"node": "gpu07", "device": "/dev/mapper/vg01-icprep", "mountpoint": "/mnt/my disk"}
    assert (size.value, avail.value) == (102400, 1024)


def test_real_healthy_hosts_are_ok_and_full_pseudo_and_network_mounts_are_not_judged():
    for path in (BLOCKS, INODES, TYPED, D / "df_k_snap_loops_diladele_websafety_1418.txt"):
        node = _node(read_df(path, node="gpu07"))
        assert node.verdict == "ok", (path.name, node.reason())
    # the snaps' squashfs loop devices are 100 % full by design: only / fires in this file
    node = _node(read_df(HUMAN_96, node="gpu07"))
    assert [c.evidence["mountpoint"] for c in node.checks if c.verdict != "ok"] == ["/"]


def test_real_root_at_4_7_percent_free_warns():
    node = _node(read_df(HUMAN_96, node="gpu07"))
    assert _fired(node) == {"disk_space": "warn"}
    assert "file system / (/dev/vda1): 4.7 % of its space free" in node.reason()


def test_real_root_out_of_inodes_drains():
    node = _node(read_df(INODES_100, node="gpu07"))
    assert _fired(node) == {"disk_inodes": "drain"}
    check = next(c for c in node.checks if c.rule == "disk_inodes")
    assert check.evidence["free"] == 0 and check.evidence["total"] == 588672 and check.evidence["device"] == "/dev/vda3"


def test_root_at_4_percent_free_warns_at_2_drains_and_the_levels_are_the_config_s():
    text = TYPED.read_text()
    four = text.replace(ROOT_ROW, ROOT_ROW.replace("11223272      40%", "  800000      96%"))
    assert _fired(_node(parse_df(four, node="gpu07"))) == {"disk_space": "warn"}
    two = text.replace(ROOT_ROW, ROOT_ROW.replace("11223272      40%", "  400000      98%"))
    assert _fired(_node(parse_df(two, node="gpu07"))) == {"disk_space": "drain"}
    assert _fired(_node(parse_df(four, node="gpu07"), config=HealthConfig(disk_free_warn_pct=3.0))) == {}


def test_a_full_boot_nfs_or_tmpfs_is_left_alone():
    text = TYPED.read_text()
    full = [
        (
            "/dev/sda6                                               ext4          475754   410016     36657      92% /boot",
            "/dev/sda6                                               ext4          475754   475754         0     100% /boot",
        ),
        ("11224064      40% /mnt/test", "       0     100% /mnt/test"),
        (
            "tmpfs        6585696    70236   6515460       2% /run",
            "tmpfs        6585696  6585696         0     100% /run",
        ),
    ]
    for before, after in full:
        assert before in text
        text = text.replace(before, after)
    assert _node(parse_df(text, node="gpu07")).verdict == "ok"


def test_bad_lines_are_one_line_naming_file_and_line(tmp_path):
    path = tmp_path / "df.txt"
    path.write_text(BLOCKS.read_text().replace("  4182924 ", " lots "))
    with pytest.raises(ParseError) as err:
        list(read_df(path))
    assert str(err.value).startswith(f"{path}:2: df avail is not") and "\n" not in str(err.value)
    path.write_text(BLOCKS.read_text() + "/dev/sdz1 12\n")
    with pytest.raises(ParseError, match=r":12: not a df row"):
        list(read_df(path))
    bad: list[ParseError] = []
    assert len(list(read_df(path, on_bad_line=bad.append))) == 20 and len(bad) == 1
    path.write_text("/dev/sda1 100 50 50 50% /\n")
    with pytest.raises(ParseError, match=r":1: no df header"):
        list(read_df(path))


def test_bad_config_names_the_field():
    with pytest.raises(ConfigError, match="disk_free_drain_pct"):
        HealthConfig(disk_free_warn_pct=2.0)
    with pytest.raises(ConfigError, match="inodes_free_drain_pct"):
        HealthConfig(inodes_free_drain_pct=-1.0)


def test_the_agent_s_output_form_gives_space_and_inodes_from_one_table():
    # GNU df 9's header for --output=source,fstype,itotal,iused,iavail,ipcent,size,used,avail,pcent,target (as
    # printed by coreutils 9.1); the row's numbers are Zenoss' root file system with inode counts added
    text = (
        "Filesystem     Type   Inodes  IUsed   IFree IUse% 1K-blocks    Used    Avail Use% Mounted on\n"
        "/dev/sda7      ext4  1220608 301298  919310   25%  19554584 7314944 11223272  40% /\n"
    )
    samples = {s.metric: s for s in parse_df(text, node="gpu07")}
    assert samples[vocab.NODE_FILESYSTEM_SIZE_BYTES].value == 19554584 * 1024
    assert samples[vocab.NODE_FILESYSTEM_FILES_FREE].value == 919310
    assert samples[vocab.NODE_FILESYSTEM_FILES].labels == {
        "node": "gpu07",
        "device": "/dev/sda7",
        "mountpoint": "/",
        "fstype": "ext4",
    }


def test_a_huge_line_is_refused_not_kept_as_a_source(tmp_path):
    path = tmp_path / "df.txt"
    path.write_text(BLOCKS.read_text().replace("/dev/md0 ", "x" * 20_000 + "\n/dev/md0 "))
    bad: list[ParseError] = []
    samples = list(read_df(path, on_bad_line=bad.append))
    assert len(bad) == 1 and "longer than a df row" in str(bad[0]) and len(str(bad[0])) < 600
    assert max(len(s.labels["device"]) for s in samples) < 100 and len(samples) == 20
