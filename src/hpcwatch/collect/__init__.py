"""``hpcwatch collect``: the long-running collector (a view-level driver: it imports reports and below).

- ``config.py``   the TOML file: every key, its default, its meaning; errors name the file and line
- ``cursor.py``   positions kept across restarts, committed with the data they cover
- ``slurm.py``    slurmrestd or squeue/sacct/sinfo --json      ``prometheus.py``  PromQL, exporter scrapes
- ``follow.py``   logs followed like tail -F                   ``spool.py``       folders of dropped files
- ``schedule.py`` detectors and health rules on a timer        ``daemon.py``      the threads and the status file
"""

from hpcwatch.collect.config import CollectConfig, load_config, parse_config
from hpcwatch.collect.daemon import Daemon

__all__ = ["CollectConfig", "Daemon", "load_config", "parse_config"]
