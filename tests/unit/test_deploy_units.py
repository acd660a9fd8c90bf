"""The install files of deploy/: systemd units that systemd-analyze accepts, hardened; manifests that parse."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
HARDENING = (
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "CapabilityBoundingSet=",
)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing: apt-get install systemd")
def test_units_pass_systemd_analyze_verify(tmp_path):
    # A scratch root holding the units, the system's own units and the binaries they run: verify checks
    # that ExecStart's program exists, and /usr/bin/hpcwatch is where docs/deploy.md links it.
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "sbin").mkdir(parents=True)
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    shutil.copytree("/lib/systemd/system", root / "lib" / "systemd" / "system", symlinks=True)
    for program in ("usr/bin/hpcwatch", "usr/sbin/slurmrestd"):
        (root / program).write_text("#!/bin/sh\n")
        (root / program).chmod(0o755)
    for unit in UNITS:
        shutil.copy(unit, root / "etc" / "systemd" / "system" / unit.name)
    done = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            f"--root={root}",
            *(str(root / "etc" / "systemd" / "system" / u.name) for u in UNITS),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stderr.strip() == "", done.stderr  # warnings (unknown keys) count too


@pytest.mark.parametrize("unit", [u for u in UNITS if u.name.startswith("hpcwatch-")], ids=lambda u: u.name)
def test_hpcwatch_units_run_as_their_user_hardened(unit):
    text = unit.read_text()
    assert "User=hpcwatch" in text
    for line in HARDENING:
        assert f"\n{line}\n" in text, f"{unit.name} lacks {line}"


def test_units_run_what_the_docs_install():
    doc = (ROOT / "docs" / "deploy.md").read_text()
    for unit in UNITS:
        assert unit.name in doc, f"docs/deploy.md does not install {unit.name}"


def test_kubernetes_manifests_parse_and_embed_valid_configs():
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "hpcwatch-collect.yaml").read_text()))
    kinds = [d["kind"] for d in docs]
    assert "Deployment" in kinds and "DaemonSet" in kinds
    from hpcwatch.collect.config import parse_config

    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    for name, text in config_map["data"].items():
        assert parse_config(text, path=name).collectors


def test_prometheus_scrape_config_targets_the_exporter_port():
    from hpcwatch.exporter import DEFAULT_PORT

    doc = yaml.safe_load((ROOT / "deploy" / "prometheus" / "hpcwatch-scrape.yml").read_text())
    targets = doc["scrape_configs"][0]["static_configs"][0]["targets"]
    assert all(t.endswith(f":{DEFAULT_PORT}") for t in targets)
    assert tomllib  # the sample config is parsed by test_collect_config


def test_the_agent_daemonset_is_unprivileged_and_its_config_parses():
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "hpcwatch-agent.yaml").read_text()))
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is False and pod["hostNetwork"] is False and pod["securityContext"]["runAsNonRoot"]
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {
        "/var/lib/hpcwatch-agent",
        "/etc/hpcwatch/agent.token",
        "/sys/class/infiniband",
        "/dev/infiniband",
    }
    from hpcwatch.collect.config import parse_config

    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    cfg = parse_config(config_map["data"]["agent.toml"], path="agent.toml")
    assert cfg.agent is not None and cfg.agent.push_url and cfg.agent.checks
