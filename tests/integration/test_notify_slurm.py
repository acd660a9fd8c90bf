"""deploy/slurm/epilog-slurmctld-notify against the real slurmctld: a job that ends gets its report by mail.

A job of alice runs on the test cluster and ends; the script then runs as slurmctld runs
EpilogSlurmctld (SLURM_JOB_ID and SLURM_JOB_USER set, the real squeue and scontrol on PATH): it
stores the job's last state from ``squeue --json`` and calls ``hpcwatch notify --job``, which mails
the report to alice through a real SMTP server (aiosmtpd on 127.0.0.1, port 0, plain: a relay on the
same host). Run twice, it sends one mail: the delivery is kept in the store.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.notify_servers import MailHandler, PortZeroController

from .conftest import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "slurm" / "epilog-slurmctld-notify"
HPCWATCH = Path(sys.executable).with_name("hpcwatch")


@pytest.fixture
def mailbox():
    handler = MailHandler()
    controller = PortZeroController(handler, hostname="127.0.0.1", port=0)
    controller.start()
    yield controller.port, handler
    controller.stop()


def run_epilog(slurm, job: str, config: Path, db: Path) -> subprocess.CompletedProcess:
    env = {
        **slurm.env,
        "SLURM_JOB_ID": job,
        "SLURM_JOB_USER": "alice",
        "HPCWATCH": str(HPCWATCH),
        "HPCWATCH_CONFIG": str(config),
        "HPCWATCH_DB": str(db),
    }
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)


def test_the_epilog_mails_the_job_end_report_once(slurm, mailbox, tmp_path):
    port, handler = mailbox
    config = tmp_path / "hpcwatch.toml"
    config.write_text(
        f"""
[notify]
user_template = "{{user}}@example.org"
kinds = ["job_end"]

[[notify.channel]]
type = "smtp"
host = "127.0.0.1"
port = {port}
security = "none"
sender = "hpcwatch@example.org"
"""
    )
    db = tmp_path / "store"
    job = slurm.sbatch("alice", "--gres=gpu:1", "--job-name=notify-me", wrap="sleep 2")
    wait_until(lambda: slurm.job_states().get(job) in ("COMPLETED", "FAILED"), timeout_s=60, what=f"job {job} to end")
    first = run_epilog(slurm, job, config, db)
    assert first.returncode == 0, first.stderr
    assert "failed" not in first.stderr, first.stderr
    assert len(handler.received) == 1
    mail = handler.received[0]
    assert mail.rcpt_tos == ["alice@example.org"]
    assert mail.message["Subject"].startswith(f"[hpcwatch] job {job} (notify-me) ended")
    again = run_epilog(slurm, job, config, db)
    assert again.returncode == 0 and len(handler.received) == 1
