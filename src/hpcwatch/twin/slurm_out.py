"""``squeue --json`` and ``sacct --json`` of the twin's Slurm, in the shape Slurm 22.05 prints.

The key sets, their order and the value conventions (``job_state`` a string,
plain numbers, ``end_time`` = start + time limit while running, ``gres_detail``
one ``gpu:N(IDX:a-b)`` per node in nodelist order, ``"None assigned"`` for a
pending job's nodes in sacct) follow the outputs captured on a real Slurm 22.05.8
(data/real/slurm-22.05/squeue.json and sacct.json, meta ``openapi/v0.0.38`` and
``openapi/dbv0.0.38``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson

from hpcwatch.twin.workload import PlannedJob

if TYPE_CHECKING:
    from hpcwatch.twin.core import Twin

__all__ = ["squeue_json", "sacct_json", "squeue_doc", "sacct_doc", "hostlist", "index_ranges", "MIN_JOB_AGE_S"]

#: slurm.conf MinJobAge default: squeue keeps a finished job this long (https://slurm.schedmd.com/slurm.conf.html).
MIN_JOB_AGE_S = 300.0
_VERSION = {"major": 22, "micro": 8, "minor": 5}
_RELEASE = "22.05.8"
#: Slurm's priority/basic counts down from this value, one per submitted job (as in the captured squeue.json).
_PRIORITY_TOP = 4294901760
_GPU_TRES_ID = 1001


def hostlist(names: list[str] | tuple[str, ...]) -> str:
    """Slurm's compressed host list: node1,node2,node3,node5 -> node[1-3,5]."""
    if not names:
        return ""
    parsed = [m for n in names if (m := re.fullmatch(r"(.*?)(\d+)", n)) is not None]
    if len(names) == 1 or len(parsed) != len(names) or len({m.group(1) for m in parsed}) != 1:
        return ",".join(names)
    prefix = parsed[0].group(1)
    return f"{prefix}[{index_ranges(sorted(int(m.group(2)) for m in parsed))}]"


def index_ranges(values: list[int] | tuple[int, ...]) -> str:
    """0,1,2,5 -> 0-2,5 (Slurm's IDX notation)."""
    out: list[str] = []
    values = sorted(values)
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)


def _cpus_per_gpu(twin: Twin) -> int:
    node = twin.cluster.nodes[0]
    return max(1, node.cpu_cores // max(1, len(node.gpus)))


def _mem_per_gpu_mb(twin: Twin) -> int:
    node = twin.cluster.nodes[0]
    return max(1000, node.memory_bytes // 1024**2 // max(1, len(node.gpus)))


def _tres_str(twin: Twin, job: PlannedJob) -> str:
    cpus = job.gpus * _cpus_per_gpu(twin)
    return f"cpu={cpus},mem={job.gpus * _mem_per_gpu_mb(twin)}M,node={job.n_nodes},billing={cpus},gres/gpu={job.gpus}"


def _squeue_job(twin: Twin, job: PlannedJob) -> dict[str, Any]:
    running = job.start is not None
    cpus = job.gpus * _cpus_per_gpu(twin)
    limit_s = job.time_limit_min * 60
    start = int(job.start) if job.start is not None else int(twin.now) + 3600
    end = int(job.end) if job.end is not None else start + limit_s
    nodes = hostlist(job.nodes)
    doc: dict[str, Any] = {
        "account": job.account,
        "accrue_time": int(job.submit),
        "admin_comment": "",
        "array_job_id": 0,
        "array_task_id": None,
        "array_max_tasks": 0,
        "array_task_string": "",
        "association_id": 4 + job.uid - 1000,
        "batch_features": "",
        "batch_flag": True,
        "batch_host": job.nodes[0] if running else "",
        "flags": ["JOB_WAS_RUNNING"] if running else [],
        "burst_buffer": "",
        "burst_buffer_state": "",
        "cluster": twin.cluster.name,
        "cluster_features": "",
        "command": f"/home/{job.user}/{job.name}.sbatch",
        "comment": "",
        "container": "",
        "contiguous": False,
        "core_spec": None,
        "thread_spec": None,
        "cores_per_socket": None,
        "billable_tres": float(cpus) if running else None,
        "cpus_per_task": None,
        "cpu_frequency_minimum": None,
        "cpu_frequency_maximum": None,
        "cpu_frequency_governor": None,
        "cpus_per_tres": "",
        "deadline": 0,
        "delay_boot": 0,
        "dependency": "",
        "derived_exit_code": 0,
        "eligible_time": int(job.submit),
        "end_time": end,
        "excluded_nodes": "",
        "exit_code": _exit(job),
        "features": "",
        "federation_origin": "",
        "federation_siblings_active": "",
        "federation_siblings_viable": "",
        "gres_detail": [f"gpu:{len(g)}(IDX:{index_ranges(g)})" for g in job.gpus_by_node.values()],
        "group_id": job.uid,
        "group_name": job.user,
        "job_id": int(job.id),
    }
    if running:
        doc["job_resources"] = {
            "nodes": nodes,
            "allocated_cores": cpus,
            "allocated_hosts": job.n_nodes,
            "allocated_nodes": [
                {
                    "sockets": {"0": {"cores": {str(c): "allocated" for c in range(cpus // job.n_nodes)}}},
                    "nodename": n,
                    "cpus_used": cpus // job.n_nodes,
                    "memory_used": 0,
                    "memory_allocated": len(g) * _mem_per_gpu_mb(twin),
                }
                for n, g in job.gpus_by_node.items()
            ],
        }
    doc.update(
        {
            "job_state": job.state,
            "last_sched_evaluation": int(job.start if job.start is not None else twin.now),
            "licenses": "",
            "max_cpus": 0,
            "max_nodes": 0,
            "mcs_label": "",
            "memory_per_tres": "",
            "name": job.name,
            "nodes": nodes,
            "nice": None,
            "tasks_per_core": None,
            "tasks_per_node": 0,
            "tasks_per_socket": None,
            "tasks_per_board": 0,
            "cpus": cpus,
            "node_count": job.n_nodes,
            "tasks": job.gpus,
            "het_job_id": 0,
            "het_job_id_set": "",
            "het_job_offset": 0,
            "partition": "gpu",
            "prefer": "",
            "memory_per_node": None,
            "memory_per_cpu": None,
            "minimum_cpus_per_node": 1,
            "minimum_tmp_disk_per_node": 0,
            "preempt_time": 0,
            "pre_sus_time": 0,
            "priority": _PRIORITY_TOP - (int(job.id) % 65536),
            "profile": None,
            "qos": "normal",
            "reboot": False,
            "required_nodes": "",
            "requeue": True,
            "resize_time": 0,
            "restart_cnt": job.restart_cnt,
            "resv_name": "",
            "shared": None,
            "show_flags": ["SHOW_ALL", "SHOW_DETAIL", "SHOW_LOCAL"],
            "sockets_per_board": 0,
            "sockets_per_node": None,
            "start_time": start,
            "state_description": "",
            "state_reason": "None" if running else _pending_reason(twin, job),
            "standard_error": "",
            "standard_input": "/dev/null",
            "standard_output": "",
            "submit_time": int(job.submit),
            "suspend_time": 0,
            "system_comment": "",
            "time_limit": job.time_limit_min,
            "time_minimum": 0,
            "threads_per_core": None,
            "tres_bind": "",
            "tres_freq": "",
            "tres_per_job": "",
            "tres_per_node": f"gres:gpu:{job.gpus_per_node}",
            "tres_per_socket": "",
            "tres_per_task": "",
            "tres_req_str": _tres_str(twin, job),
            "tres_alloc_str": _tres_str(twin, job) if running else "",
            "user_id": job.uid,
            "user_name": job.user,
            "wckey": "",
            "current_working_directory": f"/home/{job.user}",
        }
    )
    return doc


def _pending_reason(twin: Twin, job: PlannedJob) -> str:
    """squeue's reason for a pending job: a requeued job waiting for its drained nodes says which, as Slurm
    words it (``ReqNodeNotAvail, UnavailableNodes:node[1-2]``, a compressed host list); else ``Resources``."""
    down = [n for n in job.wants_nodes if n in twin.scheduler.drained]
    return f"ReqNodeNotAvail, UnavailableNodes:{hostlist(down)}" if down else "Resources"


def _exit(job: PlannedJob) -> int:
    return 256 if job.state == "FAILED" else 0


def _meta(plugin: str, name: str) -> dict[str, Any]:
    return {"plugin": {"type": plugin, "name": name}, "Slurm": {"version": dict(_VERSION), "release": _RELEASE}}


def squeue_doc(twin: Twin) -> dict[str, Any]:
    """What ``squeue --json`` returns now: pending, running, and jobs finished less than MinJobAge ago."""
    shown = [j for j in twin.scheduler.jobs if j.end is None or twin.now - j.end <= MIN_JOB_AGE_S]
    return {
        "meta": _meta("openapi/v0.0.38", "Slurm OpenAPI v0.0.38"),
        "errors": [],
        "jobs": [_squeue_job(twin, j) for j in shown],
    }


def _tres(items: list[tuple[str, str | None, int, int | None]]) -> list[dict[str, Any]]:
    return [{"type": t, "name": n, "id": i, "count": c} for t, n, i, c in items]


def _sacct_time(job: PlannedJob, now: float) -> dict[str, Any]:
    start = int(job.start) if job.start is not None else 0
    end = int(job.end) if job.end is not None else 0
    elapsed = (end or int(now)) - start if start else 0
    zero = {"seconds": 0, "microseconds": 0}
    return {
        "elapsed": elapsed,
        "eligible": int(job.submit),
        "end": end,
        "start": start,
        "submission": int(job.submit),
        "suspended": 0,
        "system": dict(zero),
        "limit": job.time_limit_min,
        "total": dict(zero),
        "user": dict(zero),
    }


def _sacct_steps(twin: Twin, job: PlannedJob) -> list[dict[str, Any]]:
    if job.start is None:
        return []
    status = {
        "status": "FAILED" if job.state == "FAILED" else "SUCCESS",
        "return_code": 1 if job.state == "FAILED" else 0,
    }
    zero = {"seconds": 0, "microseconds": 0}
    out = []
    for step_id, name, nodes in (("batch", "batch", job.nodes[:1]), (0, "python", job.nodes)):
        cpus = len(nodes) * job.gpus_per_node * _cpus_per_gpu(twin)
        gpus = len(nodes) * job.gpus_per_node
        t = _sacct_time(job, twin.now)
        out.append(
            {
                "nodes": {"list": list(nodes), "count": len(nodes), "range": hostlist(nodes)},
                "tres": {
                    "requested": {"max": [], "min": [], "average": [], "total": []},
                    "consumed": {"max": [], "min": [], "average": [], "total": []},
                    "allocated": _tres(
                        [
                            ("cpu", None, 1, cpus),
                            ("mem", None, 2, 0),
                            ("node", None, 4, len(nodes)),
                            ("gres", "gpu", _GPU_TRES_ID, gpus),
                        ]
                    ),
                },
                "time": {
                    "elapsed": t["elapsed"],
                    "end": t["end"],
                    "start": t["start"],
                    "suspended": 0,
                    "system": dict(zero),
                    "total": dict(zero),
                    "user": dict(zero),
                },
                "exit_code": dict(status),
                "tasks": {"count": gpus if step_id == 0 else 1},
                "pid": None,
                "CPU": {"requested_frequency": {"min": 0, "max": 0}, "governor": []},
                "kill_request_user": None,
                "state": job.state,
                "statistics": {"CPU": {"actual_frequency": 0}, "energy": {"consumed": 0}},
                "step": {"job_id": int(job.id), "het": {"component": None}, "id": step_id, "name": name},
                "task": {"distribution": "Cyclic" if step_id == 0 else "Unknown"},
            }
        )
    return out


def _sacct_job(twin: Twin, job: PlannedJob) -> dict[str, Any]:
    running = job.start is not None
    cpus = job.gpus * _cpus_per_gpu(twin)
    mem = job.gpus * _mem_per_gpu_mb(twin)
    requested = _tres(
        [
            ("cpu", None, 1, cpus),
            ("mem", None, 2, mem),
            ("node", None, 4, job.n_nodes),
            ("billing", None, 5, cpus),
            ("gres", "gpu", _GPU_TRES_ID, job.gpus),
        ]
    )
    allocated = (
        _tres(
            [
                ("cpu", None, 1, cpus),
                ("energy", None, 3, None),
                ("node", None, 4, job.n_nodes),
                ("billing", None, 5, cpus),
                ("gres", "gpu", _GPU_TRES_ID, job.gpus),
            ]
        )
        if running
        else []
    )
    failed = job.state == "FAILED"
    return {
        "account": job.account,
        "comment": {"administrator": None, "job": None, "system": None},
        "allocation_nodes": job.n_nodes if running else 0,
        "array": {"job_id": 0, "limits": {"max": {"running": {"tasks": 0}}}, "task": None, "task_id": None},
        "association": {"account": job.account, "cluster": twin.cluster.name, "partition": None, "user": job.user},
        "cluster": twin.cluster.name,
        "constraints": "",
        "container": None,
        "derived_exit_code": {"status": "SUCCESS", "return_code": 0},
        "time": _sacct_time(job, twin.now),
        "exit_code": {"status": "FAILED" if failed else "SUCCESS", "return_code": 1 if failed else 0},
        "flags": ["CLEAR_SCHEDULING", "STARTED_ON_SCHEDULE"] if running else [],
        "group": job.user,
        "het": {"job_id": 0, "job_offset": None},
        "job_id": int(job.id),
        "name": job.name,
        "mcs": {"label": ""},
        "nodes": hostlist(job.nodes) if running else "None assigned",
        "partition": "gpu",
        "priority": _PRIORITY_TOP - (int(job.id) % 65536),
        "qos": "normal",
        "required": {"CPUs": cpus, "memory": 0},
        "kill_request_user": None,
        "reservation": {"id": 0, "name": 0},
        "state": {"current": job.state, "reason": "None"},
        "steps": _sacct_steps(twin, job),
        "tres": {"allocated": allocated, "requested": requested},
        "user": job.user,
        "wckey": {"wckey": "", "flags": []},
        "working_directory": f"/home/{job.user}",
    }


def _sacct_requeued(twin: Twin, job: PlannedJob, attempt: tuple[float, float, tuple[str, ...]]) -> dict[str, Any]:
    """One attempt of ``job`` that Slurm requeued, as the real 22.05 ``sacct --json`` lists it before the
    job's current record (tests/data/slurm/sacct_requeued.json): same id, state REQUEUED, that attempt's
    start, end and nodes."""
    start, end, nodes = attempt
    record = _sacct_job(twin, job)
    record["time"] = {**record["time"], "start": int(start), "end": int(end), "elapsed": int(end) - int(start)}
    record["state"] = {"current": "REQUEUED", "reason": "None"}
    record["nodes"], record["allocation_nodes"], record["steps"] = hostlist(nodes), len(nodes), []
    return record


def sacct_doc(twin: Twin) -> dict[str, Any]:
    """What ``sacct --json -a`` returns: every job the accounting database holds, a requeued job's lost
    attempts each a record before its current one."""
    records = [
        r
        for j in twin.scheduler.jobs
        for r in [*(_sacct_requeued(twin, j, a) for a in j.attempts), _sacct_job(twin, j)]
    ]
    return {"meta": _meta("openapi/dbv0.0.38", "Slurm OpenAPI DB v0.0.38"), "errors": [], "jobs": records}


def squeue_json(twin: Twin) -> str:
    return orjson.dumps(squeue_doc(twin), option=orjson.OPT_INDENT_2).decode() + "\n"


def sacct_json(twin: Twin) -> str:
    return orjson.dumps(sacct_doc(twin), option=orjson.OPT_INDENT_2).decode() + "\n"
