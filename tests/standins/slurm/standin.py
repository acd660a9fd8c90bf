"""Stand-in Slurm commands for unit tests: record argv (one JSON line per call), answer as Slurm would."""

import json
import os
import subprocess
import sys

command, args = sys.argv[1], sys.argv[2:]
log = os.environ.get("HPCWATCH_STANDIN_LOG")
if log:
    with open(log, "a") as f:
        f.write(json.dumps([command, *args]) + "\n")
if command in os.environ.get("HPCWATCH_STANDIN_FAIL", "").split(","):
    # a failure that is no refusal of the request: the controller cannot be reached (src/common/slurm_errno.c)
    sys.stderr.write(f"{command}: error: Unable to contact slurm controller (connect failure)\n")
    sys.exit(1)
# A hold Slurm refuses (scontrol's "%s for job %s", src/scontrol/update_job.c; the words of slurm_errno.c):
# "disabled" for a job that may not be requeued (ESLURM_DISABLED), "batch" for one that is not a batch job.
refuse = {"disabled": "Requested operation is presently disabled", "batch": "Only batch jobs are accepted or processed"}
how = os.environ.get("HPCWATCH_STANDIN_REFUSE_REQUEUE", "")
if command == "scontrol" and args[:1] == ["requeuehold"] and how:
    sys.stderr.write(f"{refuse[how]} for job {args[-1]}\n")
    sys.exit(1)
busy = [n for n in os.environ.get("HPCWATCH_STANDIN_BUSY", "").split(",") if n]
if command == "scontrol" and args[:2] == ["create", "reservation"] and any(f"nodes={n}" in args for n in busy):
    sys.stderr.write("Error creating the reservation: Requested nodes are busy\n")
    sys.exit(1)
if command == "sbatch":
    if os.environ.get("HPCWATCH_STANDIN_RUN_JOBS") == "1":
        subprocess.run(["sh", args[-1]], check=False)
    print("4242")
elif command == "scontrol" and args[:3] == ["-o", "show", "node"]:
    nodes = os.environ.get("HPCWATCH_STANDIN_NODES", "")  # a file of `scontrol -o show node` lines
    if nodes:
        with open(nodes) as f:
            lines = f.read().splitlines(keepends=True)
        if len(args) > 3:  # one node: its line, or Slurm's answer for a node it does not know
            lines = [line for line in lines if line.startswith(f"NodeName={args[3]} ")]
            if not lines:  # src/scontrol/info_node.c prints it on stdout, exit status 1
                print(f"Node {args[3]} not found")
                sys.exit(1)
        sys.stdout.write("".join(lines))
elif command == "squeue":
    print(os.environ.get("HPCWATCH_STANDIN_SQUEUE", ""))  # empty: the job has left the queue
