"""The Slurm job of a launch: `RUN/launch/job.sbatch`, for `sbatch` on a cluster whose nodes see
the run folder and this Python environment (a shared file system, as usual on Slurm).

One `srun` task per node starts `hanlm torchrun` (a torchrun agent) with a c10d rendezvous on
the allocation's first node, running `hanlm run`, whose stages begin with preflight. What the
job does with each exit status:

- 69, preflight said NO-GO: the job requeues itself held, excludes the nodes it had, and is
  released (at most launch.max_restarts times, Slurm's SLURM_RESTART_COUNT);
- 75, stopped: near the time limit Slurm sends SIGUSR1 (`--signal=B:USR1@...`) to this script,
  which passes SIGTERM to srun, which passes it to every rank; they save and exit 75, and the
  job requeues itself (`--requeue`) to continue. A preemption requeues it through Slurm itself.
"""

from __future__ import annotations

import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from hanlm import exit_status
from hanlm.errors import UserError

SCRIPT = """\
#!/bin/bash
# written by `hanlm launch --engine slurm`; submit with: sbatch {script}
#SBATCH --job-name={name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
{gpus}#SBATCH --time={time_limit}
{partition}#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@{signal_seconds}
#SBATCH --output={log}
set -uo pipefail

export HANLM_RUN={run}
export HANLM_RECIPE={recipe}
export HANLM_HOST_STARTED_AT="${{HANLM_HOST_STARTED_AT:-$(date +%s)}}"
hanlm=({python} -m hanlm)
head_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
excluded_file="$HANLM_RUN/launch/slurm-excluded-nodes"

step_pid=""
stop_step() {{  # the time limit is near, or the job is cancelled: the ranks save and stop
  echo "hanlm: stop asked: passing SIGTERM to the ranks" >&2
  [ -n "$step_pid" ] && kill -TERM "$step_pid" 2>/dev/null
}}
trap stop_step USR1 TERM

run_step() {{  # one torchrun agent per node, rendezvous on the first node
  srun --ntasks-per-node=1 --kill-on-bad-exit=0 "${{hanlm[@]}}" torchrun \\
    --nnodes "$SLURM_JOB_NUM_NODES" --nproc-per-node {gpus_per_node} \\
    --rdzv-backend c10d --rdzv-endpoint "$head_node:{port}" --rdzv-id "$SLURM_JOB_ID" \\
    --max-restarts 0 -m hanlm "$@" &
  step_pid=$!
  local status
  while true; do  # a trapped signal ends `wait` early: wait again for srun's own status
    wait "$step_pid"
    status=$?
    kill -0 "$step_pid" 2>/dev/null || break
  done
  step_pid=""
  return "$status"
}}

{rehearse}# hanlm run's stages start with preflight: NO-GO (69) comes before any data stage or training
if [ "$status" -eq 0 ]; then
  run_step run --run-dir "$HANLM_RUN" --config "$HANLM_RECIPE" --until {until}
  status=$?
fi
if [ "$status" -eq {rejected} ]; then
  nodes="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)"
  if [ "${{SLURM_RESTART_COUNT:-0}}" -ge {max_restarts} ]; then
    echo "hanlm: preflight rejected $nodes; {max_restarts} retries spent, giving up" >&2
    exit "$status"
  fi
  excluded="$(cat "$excluded_file" 2>/dev/null)"
  excluded="${{excluded:+$excluded,}}$nodes"
  echo "$excluded" > "$excluded_file"
  echo "hanlm: preflight rejected $nodes: requeued without them (excluded: $excluded)" >&2
  scontrol requeuehold "$SLURM_JOB_ID"
  scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$excluded"
  scontrol release "$SLURM_JOB_ID"
  exit "$status"
fi
if [ "$status" -eq {stopped} ]; then
  echo "hanlm: the run stopped after its checkpoint: requeued to continue" >&2
  scontrol requeue "$SLURM_JOB_ID" || true  # a preemption has requeued it already
fi
exit "$status"
"""


# [launch] rehearse: preflight, then the rehearsal, before the run, until training has begun; a
# node set either finds at fault (69) is excluded and the job requeued, as for a NO-GO
REHEARSE = """\
status=0
if [ ! -e "$HANLM_RUN/pretrain/checkpoints/latest" ]; then
  run_step run --run-dir "$HANLM_RUN" --config "$HANLM_RECIPE" --until preflight
  status=$?
  if [ "$status" -eq 0 ]; then
    run_step rehearse --run-dir "$HANLM_RUN" --config "$HANLM_RECIPE"
    status=$?
  fi
fi
"""


def time_limit(hours: float) -> str:
    """Slurm's D-HH:MM:SS for `hours`, rounded up to the minute."""
    minutes = max(1, math.ceil(hours * 60))
    days, minutes = divmod(minutes, 24 * 60)
    return f"{days}-{minutes // 60:02d}:{minutes % 60:02d}:00"


def script(
    cfg, *, name: str, run: Path, recipe: Path, script_path: Path, hours: float, cpu: bool
) -> str:
    launch, plan = cfg.launch, cfg.plan
    limit = launch.time_limit_hours or max(1.0, hours * 1.25)
    return SCRIPT.format(
        script=shlex.quote(str(script_path)),
        name=name,
        nodes=plan.hosts,
        gpus="" if cpu else f"#SBATCH --gpus-per-node={plan.gpus}\n",
        time_limit=time_limit(limit),
        partition=f"#SBATCH --partition={launch.partition}\n" if launch.partition else "",
        signal_seconds=launch.signal_seconds,
        log=shlex.quote(str(run / "launch" / "slurm-%j.out")),
        run=shlex.quote(str(run)),
        recipe=shlex.quote(str(recipe)),
        python=shlex.quote(sys.executable),
        gpus_per_node=plan.gpus,
        port=launch.master_port,
        rejected=exit_status.HOST_REJECTED,
        stopped=exit_status.STOPPED,
        max_restarts=launch.max_restarts,
        until=shlex.quote(launch.until),
        rehearse=REHEARSE if launch.rehearse else "status=0\n",
    )


def validate(path: Path) -> dict[str, str]:
    """`bash -n` on the script, and `sbatch --test-only` where Slurm is installed."""
    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    if checked.returncode != 0:
        raise UserError(
            f"the Slurm script does not parse: {checked.stderr.strip()}", where=str(path)
        )
    out = {"bash -n": "ok"}
    if shutil.which("sbatch"):
        tested = subprocess.run(
            ["sbatch", "--test-only", str(path)], capture_output=True, text=True, timeout=120
        )
        if tested.returncode != 0:
            raise UserError(
                f"sbatch --test-only refused the job: {tested.stderr.strip()}",
                where=str(path),
                fix="set launch.partition, launch.time_limit_hours or plan.gpus to what the "
                "cluster offers",
            )
        out["sbatch --test-only"] = (tested.stderr or tested.stdout).strip()
    return out


def submit(path: Path, name: str) -> dict[str, str]:
    """`sbatch` the script (its #SBATCH lines name the job `name`)."""
    if not shutil.which("sbatch"):
        raise UserError(
            "sbatch is not on PATH: submit from a Slurm login node",
            fix=f"run `hanlm launch --engine slurm` there, or `sbatch {path}` yourself",
        )
    done = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"sbatch refused the job: {done.stderr.strip()}", where=str(path))
    return {"job_id": done.stdout.strip().split(";")[0]}
