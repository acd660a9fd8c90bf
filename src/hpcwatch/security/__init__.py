"""Security: one detector per threat vector, each turning records into ``Finding``s with evidence.

    module               vector                 reads
    supply_chain         supply_chain           pip_package / pth_file events, an OSV dump
    data_poisoning       data_poisoning         shard_check events (instrument/dataset.py), Tetragon writes
    rdma                 rdma_blind_spot        IB port counters, partitions.conf
    gradients            gradient_injection     the hook's train_grad_* samples, XID / ECC
    remanence            gpu_memory_remanence   DCGM FB / utilisation, nvidia-smi processes, driver params
    container_escape     container_escape       Falco alerts, Tetragon exec / kprobe events
    weights_access       weights_access         Tetragon reads of the checkpoint folder

``scan.scan_store`` runs them all (``scan.LiveScan``: incrementally, over a window, for the live demo);
``scan.RULES`` lists every rule id they emit; ``context.JobIndex`` ties a node and a time to Slurm jobs.
Detectors are pure: records in, findings out; only ``scan_store`` touches a store.
"""

from hpcwatch.security.scan import (
    RULES,
    LiveScan,
    ScanConfig,
    ScanExtras,
    rescan,
    scan_records,
    scan_store,
    sort_findings,
)

__all__ = ["RULES", "LiveScan", "ScanConfig", "ScanExtras", "rescan", "scan_records", "scan_store", "sort_findings"]
