"""The SkyPilot task of a launch: `RUN/launch/task.yaml`, checked with SkyPilot's own parser and
submitted as a managed job through SkyPilot's Python API.

The task asks for the plan's hosts (`num_nodes`, `accelerators: GPU:N`, spot or on-demand, a
disk for the corpus and checkpoints), mounts the run folder's bucket (MOUNT_CACHED, SkyPilot's
mode for checkpoints) so that a recovered job finds the checkpoints a lost host committed, and
installs hanlm in `setup`. Its `run` starts `hanlm run` on every host under `hanlm torchrun`
(whose stages begin with preflight, before any data stage or training), from SkyPilot's
environment (SKYPILOT_NODE_RANK,
SKYPILOT_NODE_IPS, SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE). Recovery: EAGER_NEXT_REGION
(every recovery on new hosts), `recover_on_exit_codes: [75]` (a stopped run is always resumed),
`max_restarts_on_errors` = launch.max_restarts (a NO-GO host, 69, or a crash).

SkyPilot pins versions of click below what huggingface_hub and wandb need, so it often lives in
an environment of its own (`uv tool install skypilot`): hanlm runs it in a subprocess, with this
Python when `sky` imports here, else with the Python of the `sky` command on PATH
(HANLM_SKYPILOT_PYTHON names one).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hanlm import exit_status
from hanlm.errors import UserError
from hanlm.files import atomic_write_text

# SkyPilot's accelerator names for the plan's catalogue GPUs
ACCELERATORS = {
    "rtx4090": "RTX4090",
    "rtx5090": "RTX5090",
    "l40s": "L40S",
    "a100-40gb": "A100",
    "a100-80gb": "A100-80GB",
    "h100": "H100",
    "h200": "H200",
    "b200": "B200",
}
BUCKET_MOUNT = "/hanlm-runs"  # where every host mounts launch.bucket
LAUNCH = "/hanlm-launch"  # RUN/launch on the hosts: the recipe and launch.json
INPUTS = "/hanlm-inputs"  # local corpus inputs, copied to the hosts
STARTED_FILE = "~/.hanlm_host_started_at"  # written by setup: when this host began to cost

SETUP = """\
set -euo pipefail
date +%s > {started}
python -m pip install -q {install}
"""

# The same run section on every host; its status is the ranks': 69 (NO-GO) and 75 (stopped)
# are what SkyPilot's recovery acts on.
RUN = """\
set -uo pipefail
export HANLM_HOST_STARTED_AT="$(cat {started} 2>/dev/null || date +%s)"
# the launch's record goes into the run folder: the report card sets it against what was spent
mkdir -p "$HANLM_RUN/launch" && cp -n "$HANLM_LAUNCH/launch.json" "$HANLM_RUN/launch/" 2>/dev/null
master_addr="$(echo "$SKYPILOT_NODE_IPS" | head -n 1)"
ranks() {{
  hanlm torchrun --nnodes "$SKYPILOT_NUM_NODES" --node-rank "$SKYPILOT_NODE_RANK" \\
    --nproc-per-node "$SKYPILOT_NUM_GPUS_PER_NODE" --master-addr "$master_addr" \\
    --master-port "$HANLM_MASTER_PORT" --max-restarts 0 -m hanlm "$@"
}}
{rehearse}# hanlm run's stages start with preflight: a host set it judges NO-GO exits 69 before any data
# stage or training, is given back, and others are tried; a preempted run exits 75 and the
# recovered job continues from its last checkpoint in the bucket
ranks run --run-dir "$HANLM_RUN" --config "$HANLM_RECIPE" --until "$HANLM_UNTIL"
"""

# [launch] rehearse: preflight, then the rehearsal, before the run, until training has begun
REHEARSE = """\
if [ ! -e "$HANLM_RUN/pretrain/checkpoints/latest" ]; then
  # a host set preflight or the rehearsal finds at fault exits 69, as a NO-GO one
  ranks run --run-dir "$HANLM_RUN" --config "$HANLM_RECIPE" --until preflight || exit $?
  ranks rehearse --run-dir "$HANLM_RUN" --config "$HANLM_RECIPE" || exit $?
fi
"""


def accelerator(cfg) -> str:
    if cfg.launch.accelerator:
        return cfg.launch.accelerator
    gpu = cfg.plan.gpu
    if gpu not in ACCELERATORS:
        raise UserError(
            f"plan.gpu is {gpu!r}: a launch needs the GPU to rent",
            where="plan.gpu",
            fix=f"set plan.gpu to one of {', '.join(ACCELERATORS)} (or launch.accelerator to "
            "a SkyPilot accelerator name)",
        )
    return ACCELERATORS[gpu]


def bucket_storage(bucket: str) -> dict[str, Any]:
    """The file_mounts entry of launch.bucket: an existing bucket by URL, or one SkyPilot
    makes by name in the default store."""
    if "://" in bucket:
        return {"source": bucket, "mode": "MOUNT_CACHED"}
    return {"name": bucket, "mode": "MOUNT_CACHED"}


def task(
    cfg,
    *,
    name: str,
    remote_run: str,
    launch_dir: Path,
    disk_gb: int,
    install: str,
    inputs: dict[str, str],
) -> dict[str, Any]:
    """The task as SkyPilot's YAML schema has it. `launch_dir` (RUN/launch, with the recipe)
    is copied to the hosts, and so are `inputs`, the local input folders (remote -> local)."""
    launch, plan = cfg.launch, cfg.plan
    resources: dict[str, Any] = {
        "accelerators": f"{accelerator(cfg)}:{plan.gpus}",
        "use_spot": launch.spot,
        "disk_size": disk_gb,
        "job_recovery": {
            "strategy": "EAGER_NEXT_REGION",
            "max_restarts_on_errors": launch.max_restarts,
            "recover_on_exit_codes": [exit_status.STOPPED],
        },
    }
    if launch.infra:
        resources["infra"] = launch.infra
    file_mounts: dict[str, Any] = {LAUNCH: str(launch_dir), **inputs}
    if launch.bucket:
        file_mounts[BUCKET_MOUNT] = bucket_storage(launch.bucket)
    return {
        "name": name,
        "num_nodes": plan.hosts,
        "resources": resources,
        "envs": {
            "HANLM_RUN": remote_run,
            "HANLM_LAUNCH": LAUNCH,
            "HANLM_RECIPE": f"{LAUNCH}/recipe.toml",
            "HANLM_MASTER_PORT": str(launch.master_port),
            "HANLM_UNTIL": launch.until,
        },
        "file_mounts": file_mounts,
        "setup": SETUP.format(started=STARTED_FILE, install=_quoted(install)),
        "run": RUN.format(started=STARTED_FILE, rehearse=REHEARSE if launch.rehearse else ""),
    }


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def write(task_dict: dict[str, Any], path: Path) -> Path:
    import yaml  # deferred: PyYAML (transformers' dependency) is needed only to write the task

    class Dumper(yaml.SafeDumper):
        """Scripts as literal blocks, as people write them in SkyPilot tasks."""

    def text_block(dumper, value: str):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text_block)
    text = "# written by `hanlm launch`; submit again with: sky jobs launch " + str(path) + "\n"
    text += yaml.dump(task_dict, Dumper=Dumper, sort_keys=False, allow_unicode=True, width=100)
    atomic_write_text(path, text)
    return path


# --- SkyPilot, wherever it is installed ---------------------------------------------------------


def sky_python() -> str:
    """The Python that imports SkyPilot: HANLM_SKYPILOT_PYTHON, this one, or the `sky`
    command's."""
    chosen = os.environ.get("HANLM_SKYPILOT_PYTHON")
    if chosen:
        return chosen
    if importlib.util.find_spec("sky") is not None:
        return sys.executable
    command = shutil.which("sky")
    if command:
        first = Path(command).read_bytes()[:512].split(b"\n", 1)[0].decode(errors="replace")
        if first.startswith("#!") and "python" in first:
            return first[2:].strip().split()[0]
    raise UserError(
        "SkyPilot is not installed: `hanlm launch` writes and submits a SkyPilot task",
        fix="pip install 'hanlm[launch]', or install SkyPilot in its own environment "
        "(uv tool install skypilot) so that `sky` is on PATH; --engine slurm needs neither",
    )


_VALIDATE = """
import json, sys
import sky
checked = []
for path in sys.argv[1:]:
    task = sky.Task.from_yaml(path)
    checked.append({"skypilot": sky.__version__, "num_nodes": task.num_nodes,
                    "resources": [str(r) for r in task.resources]})
print(json.dumps(checked))
"""

_SUBMIT = """
import json, sys
import sky
task = sky.Task.from_yaml(sys.argv[1])
job_ids, _ = sky.stream_and_get(sky.jobs.launch(task, name=sys.argv[2]))
print(json.dumps({"skypilot": sky.__version__, "job_ids": job_ids}))
"""


def _run_sky(script: str, *args: str, timeout: float | None) -> Any:
    python = sky_python()
    try:
        done = subprocess.run(
            [python, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    except FileNotFoundError:
        raise UserError(
            f"the SkyPilot Python {python} does not exist",
            fix="set HANLM_SKYPILOT_PYTHON to the Python that imports sky, or unset it",
        ) from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise UserError(f"SkyPilot refused the task: {last}", where=args[0])
    return json.loads(done.stdout.strip().splitlines()[-1])


def validate(*paths: Path) -> list[dict[str, Any]]:
    """SkyPilot's own parser on each task file (no network, no credentials), in one process."""
    return _run_sky(_VALIDATE, *map(str, paths), timeout=300)


def submit(path: Path, name: str) -> dict[str, Any]:
    """The task as a managed job (its recovery restarts preempted and rejected hosts)."""
    return _run_sky(_SUBMIT, str(path), name, timeout=None)
