"""``hpcwatch scan``: security findings over files or a store, as a table, JSON or SARIF."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from hpcwatch.cli.common import (
    PATH,
    app,
    argument,
    console,
    db_option,
    emit_json,
    json_option,
    open_store,
    repeatable,
    safe_text,
)
from hpcwatch.cli.defaults import DATASET_PREFIXES
from hpcwatch.errors import ConfigError

if TYPE_CHECKING:  # the detectors and the store are imported when the command runs, not for --help
    from hpcwatch.records import Finding
    from hpcwatch.security.container_escape import AllowedShell

__all__ = ["scan", "sarif_document", "finding_json"]

_SARIF_LEVEL = {"critical": "error", "high": "error", "medium": "warning", "low": "note", "info": "note"}
_STYLE = {"critical": "bold red", "high": "red", "medium": "yellow", "low": "cyan", "info": "dim"}


def finding_json(f: Finding) -> dict:
    return {
        "vector": f.vector,
        "severity": f.severity,
        "target": f.target,
        "title": f.title,
        "evidence": dict(f.evidence),
        "rule": f.rule,
        "t": f.t,
    }


def sarif_document(findings: list[Finding]) -> dict:
    """SARIF 2.1.0 (https://docs.oasis-open.org/sarif/sarif/v2.1.0/sarif-v2.1.0.html): one run, one result each."""
    rules = sorted({f.rule for f in findings})
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "hpcwatch",
                        "informationUri": "https://github.com/hpcwatch/hpcwatch",
                        "rules": [{"id": r, "shortDescription": {"text": r}} for r in rules],
                    }
                },
                "results": [
                    {
                        "ruleId": f.rule,
                        "level": _SARIF_LEVEL[f.severity],
                        "message": {"text": f.title},
                        "locations": [{"logicalLocations": [{"name": f.target, "kind": f.vector}]}],
                        "properties": {
                            "vector": f.vector,
                            "severity": f.severity,
                            "t": f.t,
                            "evidence": dict(f.evidence),
                        },
                    }
                    for f in findings
                ],
            }
        ],
    }


def _allowed_shell(text: str) -> AllowedShell:
    from hpcwatch.security.container_escape import AllowedShell

    user, _, image = text.partition("@")
    return AllowedShell(user=user or None, image_prefix=image or None)


@app.command()
@argument(
    "paths",
    nargs=-1,
    type=PATH,
    help="Files or folders to scan (pip lists, OSV dumps, manifests, perfquery / "
    "node-exporter / dcgm-exporter text, nvidia-smi, Falco / Tetragon JSON "
    "lines, Slurm JSON, partitions.conf).",
)
@db_option()
@json_option("json_out")
@click.option("--sarif", type=PATH, help="Also write the findings as SARIF 2.1.0 to this file.")
@click.option("--cluster", "cluster_file", type=PATH, help="Cluster model YAML (default: the reference).")
@repeatable("--storage-host", help="A storage server whose IB traffic is expected.")
@click.option("--key-file", type=PATH, help="HMAC key the shard manifests are signed with.")
@repeatable("--allow-shell", help="An expected debug shell: USER, or USER@IMAGE_PREFIX (repeatable).")
@repeatable("--owner", help="A user allowed to read the weights.")
@repeatable("--dataset-prefix", default=DATASET_PREFIXES, help="A folder of training data.")
def scan(
    paths: list[Path],
    db: str | None,
    json_out: bool,
    sarif: Path | None,
    cluster_file: Path | None,
    storage_host: list[str],
    key_file: Path | None,
    allow_shell: list[str],
    owner: list[str],
    dataset_prefix: list[str],
) -> None:
    """Security findings: supply chain, data poisoning, RDMA, gradients, GPU memory, container escape, weights."""
    from hpcwatch.ingest import ingest_paths
    from hpcwatch.model import load_cluster, reference_cluster
    from hpcwatch.reports.findings import scan_report
    from hpcwatch.security.container_escape import ContainerEscapeConfig
    from hpcwatch.security.data_poisoning import DataPoisoningConfig
    from hpcwatch.security.scan import ScanConfig, ScanExtras
    from hpcwatch.security.weights_access import WeightsConfig
    from hpcwatch.store import Store

    cluster = load_cluster(cluster_file) if cluster_file else reference_cluster()
    key = _read_key(key_file)
    base = ScanConfig.for_cluster(cluster, storage_hosts=storage_host)
    config = dataclasses.replace(
        base,
        rdma=dataclasses.replace(base.rdma, storage_hosts=frozenset(storage_host)),
        data_poisoning=DataPoisoningConfig(dataset_prefixes=tuple(dataset_prefix)),
        container_escape=ContainerEscapeConfig(allowed_shells=tuple(_allowed_shell(a) for a in allow_shell)),
        weights=WeightsConfig(weights_path=cluster.weights.path, owner_users=frozenset(owner)),
    )
    store = Store(db if db else ":memory:") if paths else open_store(db)
    with store:
        if paths:  # the same way in as `hpcwatch ingest` (into --db when given, else a store of this run)
            ingest_paths(store, paths, hosts=[n.name for n in cluster.nodes] + storage_host)
        report = scan_report(store, config=config, extras=ScanExtras(manifest_key=key))
    findings, reads, inputs = list(report.findings), list(report.weights_reads), report.inputs
    if sarif:
        _write(sarif, orjson.dumps(sarif_document(findings), option=orjson.OPT_INDENT_2))
    if json_out:
        emit_json(
            {
                "findings": [finding_json(f) for f in findings],
                "weights_reads": [dataclasses.asdict(r) for r in reads],
                "inputs": inputs,
            }
        )
        return
    if not any(inputs.values()) and not findings:
        console.print("[yellow]The store holds nothing to scan[/]: no samples, events or jobs.")
        return
    _table(findings)
    _reads_table(reads)


def _read_key(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes().strip()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the key: {err.strerror}") from err


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)  # rename(2) is atomic on one filesystem
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot write: {err.strerror}") from err


def _table(findings: list[Finding]) -> None:
    from rich.table import Table

    if not findings:
        console.print("No findings.")
        return
    table = Table(title=f"{len(findings)} findings", expand=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("rule", no_wrap=True, overflow="ellipsis", max_width=34)
    table.add_column("target", overflow="fold", ratio=1)
    table.add_column("title", overflow="fold", ratio=3)
    for f in findings:
        table.add_row(
            f"[{_STYLE[f.severity]}]{f.severity}[/]", safe_text(f.rule), safe_text(f.target), safe_text(f.title)
        )
    console.print(table)


def _reads_table(reads: list) -> None:
    from rich.table import Table

    if not reads:
        return
    table = Table(title="who touched the weights", expand=True)
    for column in ("time (UTC s)", "host", "access", "binary", "user", "job", "path"):
        table.add_column(column, overflow="fold")
    for r in reads:
        table.add_row(
            f"{r.t:.0f}",
            safe_text(r.host, "?"),
            safe_text(r.access),
            safe_text(r.binary, "?"),
            safe_text(r.user, f"uid {safe_text(r.uid)}"),
            safe_text(r.job),
            safe_text(r.path),
        )
    console.print(table)
