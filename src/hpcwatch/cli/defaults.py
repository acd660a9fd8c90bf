"""The option defaults the commands show in ``--help``, as plain literals.

Click needs a default when it builds the help, i.e. before any command runs. The values live in the
modules that use them (analysis, twin, exporter...), which import numpy, pyarrow or duckdb; importing
them for ``hpcwatch --help`` cost most of a second. So each default is copied here, and
tests/unit/test_cli_startup.py asserts each copy equals its home's constant: a change there fails the
test instead of drifting silently. This module imports nothing.
"""

__all__ = [
    "ACTIVE_CHECK_DAYS",
    "COLLECT_CONFIG_PATH",
    "EXPORTER_PORT",
    "EXPORTER_RECENT_STEPS",
    "EXPORTER_ENDED_WITHIN_S",
    "SERVE_MAX_STREAMS",
    "SERVE_MAX_STREAMS_PER_CLIENT",
    "SERVE_KEEP_READ_JOBS",
    "SERVE_KEEP_READ_MAX_JOBS",
    "HEALTH_WINDOW_S",
    "GOODPUT_GPUS",
    "GOODPUT_DAYS",
    "CHECKPOINT_COST_S",
    "RESTART_COST_S",
    "RESTORE_COST_S",
    "GOODPUT_STEP_S",
    "SWEEP_GPUS",
    "DATASET_PREFIXES",
    "TWIN_STEP_S",
    "TWIN_SERVE_PORT",
    "TWIN_SERVE_TICK_S",
    "MFU_GPU",
    "STRAGGLER_SIM_STEPS",
    "DASK_SLURM_MEMORY",
    "DASK_SLURM_WALLTIME",
    "DASK_START_TIMEOUT_S",
]

#: hpcwatch.assess.evidence.DEFAULT_ACTIVE_CHECK_DAYS
ACTIVE_CHECK_DAYS = 7.0
#: hpcwatch.collect.config.DEFAULT_CONFIG_PATH (a string: pathlib is for the command to load)
COLLECT_CONFIG_PATH = "/etc/hpcwatch/hpcwatch.toml"
#: hpcwatch.exporter.DEFAULT_PORT, DEFAULT_RECENT_STEPS, DEFAULT_ENDED_WITHIN_S
EXPORTER_PORT = 9977
EXPORTER_RECENT_STEPS = 50
EXPORTER_ENDED_WITHIN_S = 86_400.0
#: hpcwatch.httpguard.DEFAULT_MAX_STREAMS, DEFAULT_MAX_STREAMS_PER_CLIENT
SERVE_MAX_STREAMS = 64
SERVE_MAX_STREAMS_PER_CLIENT = 8
#: hpcwatch.web.pagewarm.WARM_JOBS, WARM_MAX_JOBS
SERVE_KEEP_READ_JOBS = 3
SERVE_KEEP_READ_MAX_JOBS = 32
#: hpcwatch.reports.health.DEFAULT_HEALTH_WINDOW_S
HEALTH_WINDOW_S = 900.0
#: hpcwatch.analysis.goodputsim: LLAMA3_GPUS, LLAMA3_DAYS, DEFAULT_CHECKPOINT_COST_S, DEFAULT_RESTART_COST_S,
#: DEFAULT_RESTORE_COST_S, DEFAULT_STEP_S, DEFAULT_SWEEP_GPUS
GOODPUT_GPUS = 16_384
GOODPUT_DAYS = 54.0
CHECKPOINT_COST_S = 20.0
RESTART_COST_S = 180.0
RESTORE_COST_S = 60.0
GOODPUT_STEP_S = 10.0
SWEEP_GPUS = (1024, 2048, 4096, 8192, 16_384, 32_768, 65_536, 100_000)
#: hpcwatch.security.data_poisoning.DEFAULT_DATASET_PREFIXES
DATASET_PREFIXES = ("/lustre/datasets",)
#: hpcwatch.twin.run.DEFAULT_STEP_S
TWIN_STEP_S = 10.0
#: hpcwatch.twin.serve.DEFAULT_PORT, DEFAULT_TICK_S
TWIN_SERVE_PORT = 19400
TWIN_SERVE_TICK_S = 1.0
#: hpcwatch.analysis.mfu.DEFAULT_GPU
MFU_GPU = "h100-sxm"
#: hpcwatch.analysis.stragglersim.DEFAULT_STEPS
STRAGGLER_SIM_STEPS = 10_000
#: hpcwatch.distributed.DEFAULT_SLURM_MEMORY, DEFAULT_SLURM_WALLTIME, DEFAULT_START_TIMEOUT_S
DASK_SLURM_MEMORY = "2GiB"
DASK_SLURM_WALLTIME = "01:00:00"
DASK_START_TIMEOUT_S = 300.0
