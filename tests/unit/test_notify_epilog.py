"""deploy/slurm/epilog-slurmctld-notify with stand-in squeue/scontrol (the real Slurm 22.05 squeue --json
capture, tests/data/slurm/squeue.json) and a real SMTP server (aiosmtpd, port 0): the report reaches the
job's MailUser once, and a job id that is not one is not passed on. The script against the real
slurmctld is tests/integration/test_notify_slurm.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA
from tests.unit.notify_servers import MailHandler, PortZeroController

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "slurm" / "epilog-slurmctld-notify"


@pytest.fixture
def mailbox():
    handler = MailHandler()
    controller = PortZeroController(handler, hostname="127.0.0.1", port=0)
    controller.start()
    yield controller.port, handler
    controller.stop()


@pytest.fixture
def bin_dir(tmp_path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    stubs = {
        "squeue": f'#!/bin/sh\ncat "{DATA / "slurm/squeue.json"}"\n',
        "scontrol": "#!/bin/sh\necho 'JobId=3 JobName=b1 UserId=bob(1002) MailUser=bob@lab.example.org MailType=END'\n",
        "hpcwatch": f'#!/bin/sh\nPYTHONPATH="{REPO / "src"}" exec "{sys.executable}" -m hpcwatch "$@"\n',
    }
    for name, text in stubs.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def _run(bin_dir: Path, tmp_path: Path, port: int, job: str) -> subprocess.CompletedProcess:
    config = tmp_path / "hpcwatch.toml"
    config.write_text(
        f'[notify]\nkinds = ["job_end"]\n[[notify.channel]]\ntype = "smtp"\nhost = "127.0.0.1"\nport = {port}\n'
        'security = "none"\nsender = "hpcwatch@example.org"\n'
    )
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": job,
        "HPCWATCH": str(bin_dir / "hpcwatch"),
        "HPCWATCH_CONFIG": str(config),
        "HPCWATCH_DB": str(tmp_path / "store"),
        "TMPDIR": str(tmp_path),
    }
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)


def test_the_epilog_mails_the_report_to_the_jobs_mail_user_once(bin_dir, tmp_path, mailbox):
    port, handler = mailbox
    first = _run(bin_dir, tmp_path, port, "3")
    assert first.returncode == 0 and first.stderr == "", first.stderr
    (mail,) = handler.received
    assert mail.rcpt_tos == ["bob@lab.example.org"]
    assert mail.message["Subject"] == "[hpcwatch] job 3 (b1) ended: COMPLETED"
    again = _run(bin_dir, tmp_path, port, "3")
    assert again.returncode == 0 and len(handler.received) == 1  # the delivery was kept in the store
    assert not list(tmp_path.glob("hpcwatch-notify.*"))  # its temp folder removed


def test_a_job_id_that_is_not_one_is_not_passed_on(bin_dir, tmp_path, mailbox):
    port, handler = mailbox
    ran = _run(bin_dir, tmp_path, port, "3; touch /tmp/owned")
    assert ran.returncode == 0 and "no usable SLURM_JOB_ID" in ran.stderr
    assert handler.received == [] and not (tmp_path / "store").exists()
