"""``hpcwatch top``: the twin, live, as a table of GPUs (node, GPU, job, user, util, power, memory).

The twin runs in a background thread (twin/live.py) writing into an in-memory store; this view
reads the store's latest samples every refresh, as it would a real cluster's.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from hpcwatch.cli.common import Number, app, console, emit_json, json_option, repeatable, safe_text
from hpcwatch.errors import ConfigError

if TYPE_CHECKING:  # the twin and the store are imported when the command runs, not for --help
    from rich.table import Table

    from hpcwatch.store import Store

__all__ = ["top", "latest_gpus", "MAX_ROWS"]

#: Rows shown at most (a 128-node cluster has 1,024 GPUs; the busiest and the idle ones come first).
MAX_ROWS = 48


def latest_gpus(store: Store) -> list[dict]:
    """The last scrape of every GPU in the store (``reports.live.gpu_table``)."""
    from hpcwatch.reports.live import gpu_table

    return gpu_table(store)


def _table(gpus: list[dict], twin_now: float, ticks: int) -> Table:
    from rich.table import Table

    shown = gpus if len(gpus) <= MAX_ROWS else gpus[:MAX_ROWS]
    title = (
        f"hpcwatch top — {len(gpus)} GPUs, simulated {time.strftime('%H:%M:%S', time.gmtime(twin_now))} UTC, "
        f"tick {ticks}" + (f" (first {MAX_ROWS} shown)" if len(gpus) > MAX_ROWS else "")
    )
    table = Table(title=title)
    for col in ("node", "GPU", "job", "user", "util", "power", "memory", "temp"):
        table.add_column(col, justify="left" if col in ("node", "job", "user") else "right")
    for g in shown:
        util = g.get("util_pct", 0.0)
        style = "green" if util >= 80 else ("red" if g["job"] and util < 1 else "")
        total = g.get("fb_used_mib", 0.0) + g.get("fb_free_mib", 0.0)
        table.add_row(
            safe_text(g["host"]),
            safe_text(g["gpu"]),
            safe_text(g["job"]),
            safe_text(g["user"]),
            f"[{style}]{util:.0f}%[/]" if style else f"{util:.0f}%",
            f"{g.get('power_w', 0.0):.0f} W",
            f"{g.get('fb_used_mib', 0.0) / 1024:.1f}/{total / 1024:.0f} GiB",
            f"{g.get('temp_c', 0):.0f} C",
        )
    return table


@app.command()
@click.option("--duration", type=Number(min=0.0), help="Stop after this many real seconds (default: Ctrl-C).")
@repeatable("--scenario", help="Scenario to play (repeatable).")
@click.option("--nodes", type=int, help="Nodes of 8 H100 SXM (default: the reference cluster's 2).")
@click.option("--seed", type=int, default=0, help="Random seed of the twin.")
@click.option("--speed", type=Number(min=0.0, min_open=True), default=1.0, help="Simulated seconds per real second.")
@json_option("json_out")
def top(
    duration: float | None, scenario: list[str], nodes: int | None, seed: int, speed: float, json_out: bool
) -> None:
    """Run the twin and watch its GPUs live: node, GPU, job, user, utilisation, power, memory."""
    from rich.live import Live

    from hpcwatch.store import Store
    from hpcwatch.twin.live import LiveTwin
    from hpcwatch.twin.run import sized_reference

    if duration is not None and duration <= 0:
        raise ConfigError(f"--duration must be > 0, got {duration}")
    if speed <= 0:
        raise ConfigError(f"--speed must be > 0, got {speed}")
    store = Store(":memory:")
    live = LiveTwin(store, sized_reference(nodes), seed=seed, scenarios=scenario, speed=speed)
    deadline = None if duration is None else time.monotonic() + duration
    live.start()
    try:
        if json_out:
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.2)
        else:
            with Live(_table([], live.twin.now, 0), console=console.real, refresh_per_second=2) as view:
                while deadline is None or time.monotonic() < deadline:
                    view.update(_table(latest_gpus(store), live.twin.now, live.ticks))
                    time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        live.stop()
    if json_out:
        emit_json({"now": live.twin.now, "ticks": live.ticks, "gpus": latest_gpus(store)})
