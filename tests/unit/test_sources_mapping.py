"""The dcgm-exporter hpc_job mapping directory, from the real Slurm prolog's files."""

from __future__ import annotations

import pytest

from hpcwatch.errors import ParseError
from hpcwatch.sources.mapping import (
    parse_job_mapping_file,
    read_job_mapping_dir,
    read_job_mapping_tree,
    scan_job_mapping_dir,
)
from tests.conftest import DATA

MAPPING = DATA / "mapping"


def test_tree_written_by_the_real_prolog_matches_the_capture_listing():
    tree = read_job_mapping_tree(MAPPING / "tree")
    listing = {}
    for line in (MAPPING / "hpc_job_mapping_files.txt").read_text().split("\n"):
        if line.strip():
            where, job = line.split()
            node, gpu = where.split("/")
            listing.setdefault(node, {})[gpu] = [job]
    assert tree == listing
    assert tree["node1"]["6"] == ["9"] and tree["node2"]["1"] == ["9"] and tree["node1"]["3"] == ["8"]


def test_mig_instances_empty_files_and_stray_files():
    scanned = scan_job_mapping_dir(MAPPING / "mig_node")
    assert scanned.jobs == {"0": ["41"], "2.0": ["41", "42"], "2.1": ["43"], "3": []}
    assert dict(scanned.ignored) == {
        "4.tmp": "not a GPU index or MIG gpu.instance name",
        "README": "not a GPU index or MIG gpu.instance name",
    }
    assert read_job_mapping_dir(MAPPING / "mig_node") == scanned.jobs


def test_a_subdirectory_named_like_a_gpu_is_ignored(tmp_path):
    (tmp_path / "1").mkdir()
    (tmp_path / "0").write_text("5\n")
    scanned = scan_job_mapping_dir(tmp_path)
    assert scanned.jobs == {"0": ["5"]} and scanned.ignored == (("1", "not a regular file"),)


@pytest.mark.parametrize(
    "text,line",
    [
        ("7\nrm -rf /\n", 2),  # a command, not a job id
        ("\n\n12 13\n", 3),  # two ids on one line
        ("job7\n", 1),  # a name, not an id
    ],
)
def test_bad_job_ids_name_the_line(text, line):
    with pytest.raises(ParseError) as err:
        parse_job_mapping_file(text, path="map/0")
    assert err.value.line == line and err.value.path == "map/0"


def test_array_and_het_job_ids_are_ids():
    assert parse_job_mapping_file("42_7\n43+1\n\n") == ["42_7", "43+1"]


def test_missing_directory_is_a_parse_error(tmp_path):
    with pytest.raises(ParseError, match="cannot list"):
        read_job_mapping_dir(tmp_path / "absent")
