"""``hpcwatch trace JOB --steps N``: ask a running job's ranks for N steps of Kineto trace (dynolog-style).

The request goes into the job's control file in the live spool folder (``sources.livehook``); each rank's
hook sees it within its flush interval, profiles its next N steps and writes
``trace-<id>-rank-<N>.json`` beside its stream, which ``hpcwatch collect``'s ``[[live]]`` reads. For a job
that streams over HTTP, ``--live-dir`` is the ``[[receive]]``'s ``live_spool`` on the collector's host: the
receiver hands the request to each rank in its answers and takes the traces the ranks POST back.
``--dump`` asks for the ranks' Flight Recorder dumps instead (what a hang asks for by itself);
``--pause`` stops every rank's stream and ``--resume`` starts it again (the hooks keep running, the job
never waits: a paused stream only stops writing and pushing).
"""

from __future__ import annotations

from pathlib import Path

import click

from hpcwatch.cli.common import PATH, app, argument, console, emit_json, json_option, safe_text

__all__ = ["trace"]


@app.command()
@argument("job", required=True, help="The job id (its folder in the live spool).")
@click.option("--steps", type=int, default=5, show_default=True, help="Steps to trace (1-100).")
@click.option(
    "--live-dir",
    type=PATH,
    envvar="HPCWATCH_LIVE_DIR",
    required=True,
    help="The hooks' live spool folder (their HPCWATCH_LIVE_DIR; over HTTP: [[receive]]'s live_spool).",
)
@click.option("--dump", is_flag=True, default=False, help="Ask for a Flight Recorder dump, not a trace.")
@click.option(
    "--pause/--resume",
    "pause",
    default=None,
    help="Stop every rank's live stream, or start it again (nothing is traced).",
)
@json_option()
def trace(job: str, steps: int, live_dir: Path, dump: bool, pause: bool | None, as_json: bool) -> None:
    """Ask a running job for N steps of profiler trace (or a Flight Recorder dump); pause or resume its stream."""
    from hpcwatch.collect.live import request_dump, request_live, request_trace

    if pause is not None:
        if dump:
            raise click.UsageError("--dump and --pause/--resume are separate requests: give one")
        request_live(live_dir, job, on=not pause)
        state = "paused" if pause else "resumed"
        if as_json:
            emit_json({"job": job, "kind": "live", "live": not pause})
        else:
            console.print(f"job {safe_text(job)}'s stream {state} (its ranks see it within 2 s)")
        return
    request = request_dump(live_dir, job) if dump else request_trace(live_dir, job, steps)
    what = "dump" if dump else "trace"
    if as_json:
        emit_json({"job": job, "request": request, "kind": what, "steps": None if dump else steps})
        return
    asked = "a Flight Recorder dump" if dump else f"{steps} step(s) of trace"
    console.print(f"asked job {safe_text(job)} for {asked} (request {request}); files land in {safe_text(live_dir)}")
