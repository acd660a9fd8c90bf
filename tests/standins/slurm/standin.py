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
    sys.stderr.write(f"{command}: error: Requested operation is presently disabled\n")
    sys.exit(1)
busy = [n for n in os.environ.get("HPCWATCH_STANDIN_BUSY", "").split(",") if n]
if command == "scontrol" and args[:2] == ["create", "reservation"] and any(f"nodes={n}" in args for n in busy):
    sys.stderr.write("Error creating the reservation: Requested nodes are busy\n")
    sys.exit(1)
if command == "sbatch":
    if os.environ.get("HPCWATCH_STANDIN_RUN_JOBS") == "1":
        subprocess.run(["sh", args[-1]], check=False)
    print("4242")
elif command == "scontrol" and args == ["-o", "show", "node"]:
    nodes = os.environ.get("HPCWATCH_STANDIN_NODES", "")  # a file of `scontrol -o show node` lines
    if nodes:
        with open(nodes) as f:
            sys.stdout.write(f.read())
elif command == "squeue":
    print(os.environ.get("HPCWATCH_STANDIN_SQUEUE", ""))  # empty: the job has left the queue
