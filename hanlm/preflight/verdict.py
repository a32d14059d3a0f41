"""From measurements to GO / NO-GO: projections for the planned run, then findings.

A finding is {"check", "severity", "reason", "fix"}: severity "fail" makes the verdict NO-GO,
"warn" and "note" are shown but do not. Projections use the planned model
(`recipe.step_profile`) at the slowest device's peak for the precision (GPUs: the catalogue via
`time_model.peak_flops`, at the plan's usual MFU for that GPU unless plan.mfu is set; CPUs: the
measured matmul):
communication per optimizer step = the bytes each rank moves / the measured bus bandwidth (the
all-reduce's for DDP, the slower of all-gather and reduce-scatter for FSDP); save time = the
whole checkpoint / the slowest checkpoint disk's throughput (conservative: one host writing it
all, as on a single machine); the interval between saves uses the planned compute time per step,
so a run that is slower in practice only has more room.
"""

from __future__ import annotations

import math

from hanlm.config import Config
from hanlm.errors import UserError
from hanlm.plan import recipe, time_model

FAIL, WARN, NOTE = "fail", "warn", "note"
CHECKS = (
    "rendezvous",
    "devices",
    "collectives",
    "communication",
    "storage",
    "shared",
    "data",
    "trackers",
)
P2P_FIX = (
    "on consumer GPUs set NCCL_P2P_DISABLE=1 (peer-to-peer through a broken PCIe path returns "
    "zeros); check the IOMMU / ACS settings and the driver, or rent another host"
)


def finding(check: str, severity: str, reason: str, fix: str | None = None) -> dict:
    return {"check": check, "severity": severity, "reason": reason, "fix": fix}


def parallel_mode(cfg: Config, world_size: int) -> str:
    mode = cfg.parallel.mode
    if world_size == 1:
        return "single"
    return "fsdp" if mode == "auto" else mode


# -- projections ----------------------------------------------------------------------------


def all_devices(report: dict) -> list[dict]:
    return [dev for r in report["ranks"] for dev in r.get("devices", {}).get("devices", [])]


def storage_reports(report: dict) -> list[dict]:
    return [r["storage"] for r in report["ranks"] if r.get("storage")]


def planned_peak(report: dict, precision: str) -> tuple[float, float | None, str]:
    """The slowest device's peak FLOP/s for the planned precision, the plan's usual MFU for it
    (None: the plan's default), and where the figures come from."""
    devices = all_devices(report)
    if not devices:
        return math.nan, None, "no device measured"
    if devices[0]["type"] == "cpu":
        return min(d["matmul_flops"] for d in devices), None, "measured CPU float32 matmul"
    if precision == "fp8-emulate":
        precision = "bf16"  # emulation runs on the BF16 path
    if not all(d.get("catalogue") for d in devices):  # an unknown GPU: what it measured
        return min(d["matmul_flops"] for d in devices), None, "measured matmul (unknown GPU)"
    figures = []
    for d in devices:
        try:
            figures.append((time_model.peak_flops(d["catalogue"], precision), d["catalogue"]))
        except UserError:  # no FP8 on this GPU: a device finding says so; plan with BF16
            figures.append((time_model.peak_flops(d["catalogue"], "bf16"), d["catalogue"]))
    peak, key = min(figures)
    try:
        mfu = time_model.default_mfu(key, precision)[0]
    except (UserError, KeyError):
        mfu = None
    return peak, mfu, f"catalogue {key}, {precision}"


def project(cfg: Config, report: dict) -> dict:
    """Step, communication and checkpoint figures of the planned run on these hosts."""
    world_size = report["world_size"]
    peak, usual_mfu, source = planned_peak(report, cfg.precision.mode)
    mfu = cfg.plan.mfu or usual_mfu
    out: dict = {"peak_flops": peak, "peak_source": source, "mfu": mfu}
    if not math.isfinite(peak):
        return out
    profile = recipe.step_profile(cfg, world_size=world_size, peak_flops=peak, mfu=mfu)
    out.update(profile)
    mode = parallel_mode(cfg, world_size)
    out["mode"] = mode
    collectives = report["ranks"][0].get("collectives") or {}
    if mode in ("ddp", "fsdp") and "all_reduce" in collectives:
        ops = ("all_reduce",) if mode == "ddp" else ("all_gather", "reduce_scatter")
        busbw = min(collectives[op]["busbw_gbs"] for op in ops) * 1e9
        out["busbw_gbs"] = busbw / 1e9
        out["comm_s"] = profile["comm_bytes_per_gpu"] / busbw
        out["comm_ratio"] = out["comm_s"] / profile["compute_s"]

    ckpt_cfg = cfg.checkpoint
    intervals = []
    if ckpt_cfg.every > 0:
        intervals.append(ckpt_cfg.every * profile["compute_s"])
    if ckpt_cfg.every_minutes > 0:
        intervals.append(ckpt_cfg.every_minutes * 60)
    out["checkpoint_interval_s"] = min(intervals) if intervals else None
    # the kept checkpoints and one in flight
    out["free_bytes_needed"] = profile["checkpoint_bytes"] * (ckpt_cfg.keep_last + 1)
    speeds = [s["write_mb_s"] for s in storage_reports(report) if s.get("write_mb_s")]
    if speeds:
        out["save_s"] = profile["checkpoint_bytes"] / (min(speeds) * 1e6)
    return out


# -- findings -------------------------------------------------------------------------------


def _device_findings(cfg: Config, report: dict) -> list[dict]:
    found = []
    preflight_cfg, precision = cfg.preflight, cfg.precision.mode
    for rank_report in report["ranks"]:
        if "error" in rank_report.get("devices", {}):
            found.append(
                finding(
                    "devices",
                    FAIL,
                    f"rank {rank_report['rank']}: {rank_report['devices']['error']}",
                )
            )
    devices = all_devices(report)
    for device in (device for device in devices if device["type"] == "cuda"):
        label = f"{device['name']} (cuda:{device['index']})"
        cc = ".".join(map(str, device["compute_capability"]))
        if precision == "fp8" and not device["fp8"]:
            found.append(
                finding(
                    "devices",
                    FAIL,
                    f"{label} has compute capability {cc}: no FP8 tensor cores (needs 8.9)",
                    "use --precision bf16, or GPUs of compute capability 8.9 or newer",
                )
            )
        if precision == "bf16" and not device["bf16"]:
            found.append(
                finding(
                    "devices",
                    FAIL,
                    f"{label} ({cc}) has no BF16",
                    "use --precision fp32 or newer GPUs",
                )
            )
        if device["matmul_fraction"] is None:
            found.append(finding("devices", WARN, f"{label} is not in the GPU catalogue"))
        elif device["matmul_fraction"] < preflight_cfg.min_matmul_fraction:
            found.append(
                finding(
                    "devices",
                    FAIL,
                    f"{label} reached {device['matmul_flops'] / 1e12:.0f} of "
                    f"{device['peak_bf16_flops'] / 1e12:.0f} dense BF16 TFLOPS "
                    f"({device['matmul_fraction']:.0%} < {preflight_cfg.min_matmul_fraction:.0%})",
                    "check for other processes on the GPU, power limits and clocks "
                    "(nvidia-smi -q -d PERFORMANCE,POWER), cooling; or rent another host",
                )
            )
    if len({device["name"] for device in devices}) > 1:
        names = ", ".join(sorted({device["name"] for device in devices}))
        found.append(
            finding("devices", WARN, f"mixed devices ({names}): the slowest sets the pace")
        )
    return found


def _collective_findings(report: dict) -> list[dict]:
    found = []
    if report["world_size"] == 1:
        if report.get("expected_world_size", 1) > 1:
            return []  # the rendezvous failure says it all
        return [
            finding(
                "collectives",
                NOTE,
                "one process: collectives not measured",
                "run under torchrun on the real hosts to measure them",
            )
        ]
    for rank_report in report["ranks"]:
        results = rank_report.get("collectives") or {}
        if "error" in results:
            found.append(
                finding(
                    "collectives",
                    FAIL,
                    f"rank {rank_report['rank']} ({rank_report['host']}): "
                    f"collectives failed: {results['error']}",
                    "check that every rank can reach every other (firewall, NCCL_SOCKET_IFNAME); "
                    + P2P_FIX,
                )
            )
            continue
        wrong = {op: res for op, res in results.items() if not res["correct"]}
        if wrong:
            how = "zeros" if all(res["all_zero"] for res in wrong.values()) else "wrong values"
            names = ", ".join(op.replace("_", "-") for op in wrong)
            found.append(
                finding(
                    "collectives",
                    FAIL,
                    f"{names} returned {how} on rank {rank_report['rank']} ({rank_report['host']})",
                    P2P_FIX,
                )
            )
    return found


def _communication_findings(cfg: Config, proj: dict) -> list[dict]:
    if "comm_ratio" not in proj:
        return []
    ratio, limit = proj["comm_ratio"], cfg.preflight.max_comm_ratio
    reason = (
        f"{proj['mode'].upper()} would communicate {proj['comm_s']:.3g} s per optimizer step at "
        f"{proj['busbw_gbs']:.3g} GB/s bus bandwidth, {ratio:.0%} of the {proj['compute_s']:.3g} s "
        "of compute"
    )
    if proj["mode"] == "ddp":
        fix = (
            "more gradient accumulation (raise pretrain.global_batch_tokens): one all-reduce then "
            "serves more tokens"
        )
    else:
        fix = (
            "FSDP communicates every micro-step: raise pretrain.micro_batch, or use DDP when the "
            "model fits (`hanlm plan`)"
        )
    fix += "; a faster interconnect (NVLink, InfiniBand); on consumer GPUs try NCCL_P2P_DISABLE=1"
    if ratio > limit:
        return [finding("communication", FAIL, reason + f" (limit {limit:.0%})", fix)]
    if ratio > limit / 2:
        return [finding("communication", WARN, reason, fix)]
    return []


FASTER_STORAGE = (
    "put checkpoints on a fast local disk (NVMe) with --checkpoint-dir, and set "
    "checkpoint.mirror for the remote copy"
)


def _disk_problems(cfg: Config, proj: dict, disk: dict) -> list[tuple[str, str]]:
    """(reason, fix) of each failed check of one host's checkpoint disk."""
    preflight_cfg, where = cfg.preflight, disk["probe_dir"]
    if not disk.get("writable", False):
        return [
            (
                f"checkpoint folder {disk['folder']} is not writable: {disk.get('error')}",
                f"make {where} writable (chmod / chown) or choose another --checkpoint-dir",
            )
        ]
    problems = []
    if disk.get("error"):
        problems.append(
            (
                f"writing in {where} failed: {disk['error']}",
                "free space or fix the disk, or choose another --checkpoint-dir",
            )
        )
    needed = proj.get("free_bytes_needed")
    if needed is not None and disk.get("free_bytes") is not None and disk["free_bytes"] < needed:
        problems.append(
            (
                f"{where} has {disk['free_bytes'] / 1e9:.3g} GB free; checkpoints need "
                f"{needed / 1e9:.3g} GB ({cfg.checkpoint.keep_last} kept + 1 being written, "
                f"{proj['checkpoint_bytes'] / 1e9:.3g} GB each)",
                "free space, lower checkpoint.keep_last, or choose a larger --checkpoint-dir",
            )
        )
    if "write_mb_s" not in disk:
        return problems
    if not disk["read_back_ok"]:
        problems.append(
            (
                f"{where}: {disk['read_back_bad_blocks']} blocks read back differ from those "
                "written",
                "the disk or file system corrupts data: use another disk",
            )
        )
    if disk["write_mb_s"] < preflight_cfg.min_write_mb_s:
        problems.append(
            (
                f"{where} writes {disk['write_mb_s']:.3g} MB/s with fsync "
                f"(< {preflight_cfg.min_write_mb_s:g} MB/s)",
                FASTER_STORAGE,
            )
        )
    if disk["fsync_ms_max"] > preflight_cfg.max_fsync_ms:
        problems.append(
            (
                f"{where}: an fsync took {disk['fsync_ms_max']:.0f} ms "
                f"(> {preflight_cfg.max_fsync_ms:g} ms)",
                FASTER_STORAGE,
            )
        )
    return problems


def _storage_findings(cfg: Config, proj: dict, report: dict) -> list[dict]:
    found = [
        finding("storage", FAIL, reason, fix)
        for disk in storage_reports(report)
        for reason, fix in _disk_problems(cfg, proj, disk)
    ]
    preflight_cfg = cfg.preflight
    save_s, interval = proj.get("save_s"), proj.get("checkpoint_interval_s")
    if save_s is not None and interval and save_s > preflight_cfg.max_save_fraction * interval:
        found.append(
            finding(
                "storage",
                FAIL,
                f"a checkpoint save would take {save_s:.3g} s, more than "
                f"{preflight_cfg.max_save_fraction:.0%} of the {interval:.3g} s between saves",
                "save less often (raise checkpoint.every or checkpoint.every_minutes), or "
                + FASTER_STORAGE,
            )
        )
    return found


NOT_SHARED_FIX = (
    "every rank writes its shards of a checkpoint into one folder and rank 0 commits it, so all "
    "hosts must see the same folder: keep the run folder (or the folder given with "
    "--checkpoint-dir) on storage that every host mounts at the same path (NFS, a cluster or "
    "cloud file system). A folder per host does not work, the mirror included: each would hold "
    "only its own ranks' shards, and checkpoint.mirror (a folder or an s3://, gs:// URL) is a "
    "second copy of what rank 0 committed, restored when the primary is lost, not a way to "
    "share it"
)


def shared_probes(report: dict) -> list[dict]:
    return [r["shared"] for r in report["ranks"] if r.get("shared")]


def _shared_findings(report: dict) -> list[dict]:
    """One finding when some host does not see the others' files in the checkpoint folder."""
    probes = shared_probes(report)
    hosts = {probe["node"]: probe["host"] for probe in probes}
    problems = []
    for probe in probes:
        where = f"host {probe['host']} (node {probe['node']})"
        if "error" in probe:
            problems.append(f"{where}: {probe['error']}")
            continue
        missing = [n for n in probe["nodes"] if n not in probe["seen"]]
        if missing:
            others = ", ".join(f"{hosts.get(n, '?')} (node {n})" for n in missing)
            problems.append(f"{where} does not see what {others} wrote in {probe['probe_dir']}")
    if not problems:
        return []
    reason = "the checkpoint folder is not shared by all hosts: " + "; ".join(problems)
    return [finding("shared", FAIL, reason, NOT_SHARED_FIX)]


def _data_findings(cfg: Config, proj: dict, report: dict) -> list[dict]:
    found = []
    needed = proj.get("tokens_per_s_needed")
    per_rank = needed / report["world_size"] if needed else None
    for rank_report in report["ranks"]:
        data = rank_report.get("data") or {}
        if "skipped" in data:
            if rank_report["rank"] == 0:
                found.append(finding("data", NOTE, data["skipped"]))
        elif "error" in data:
            found.append(finding("data", FAIL, f"rank {rank_report['rank']}: {data['error']}"))
        elif per_rank and data["tokens_per_s"] < cfg.preflight.min_data_headroom * per_rank:
            found.append(
                finding(
                    "data",
                    FAIL,
                    f"rank {rank_report['rank']} reads {data['tokens_per_s']:,.0f} tokens/s "
                    "from the shards; "
                    f"a step needs {per_rank:,.0f} per rank (headroom "
                    f"{data['tokens_per_s'] / per_rank:.2g}x < {cfg.preflight.min_data_headroom:g}x)",
                    "copy the shards to a local disk; check that nothing else reads it",
                )
            )
    return found


def _tracker_findings(report: dict) -> list[dict]:
    found = []
    for rank_report in report["ranks"]:
        ready = rank_report.get("trackers") or {}
        if "refused" in ready:
            found.append(
                finding(
                    "trackers",
                    FAIL,
                    f"rank {rank_report['rank']}: {ready['refused']}",
                    ready["fix"],
                )
            )
        elif "error" in ready:
            found.append(finding("trackers", FAIL, f"rank {rank_report['rank']}: {ready['error']}"))
    return found


def judge(cfg: Config, report: dict) -> None:
    """Fill report["projection"], report["findings"] and report["verdict"]."""
    found = list(report.get("findings", []))
    try:
        proj = project(cfg, report)
    except UserError as e:
        proj = {"error": e.message}
        found.append(finding("plan", FAIL, f"the planned run is invalid: {e.what}", e.fix))
    report["projection"] = proj
    found += _device_findings(cfg, report)
    found += _collective_findings(report)
    found += _communication_findings(cfg, proj)
    found += _storage_findings(cfg, proj, report)
    found += _shared_findings(report)
    found += _data_findings(cfg, proj, report)
    found += _tracker_findings(report)
    report["findings"] = found
    report["verdict"] = "NO-GO" if any(f["severity"] == FAIL for f in found) else "GO"
