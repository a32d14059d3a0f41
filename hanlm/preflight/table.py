"""The preflight table on the terminal: one row per check, then each finding with its fix."""

from __future__ import annotations

from rich.table import Table

from hanlm.console import console
from hanlm.preflight.verdict import (
    CHECKS,
    FAIL,
    NOTE,
    WARN,
    all_devices,
    shared_probes,
    storage_reports,
)


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3g} GB"


def _summaries(report: dict) -> dict[str, str]:
    proj = report.get("projection", {})
    lines: dict[str, str] = {}
    if report.get("rendezvous"):
        joined = report["world_size"] if report["world_size"] > 1 else "not all"
        lines["rendezvous"] = (
            f"{joined} of {report['expected_world_size']} ranks joined at {report['rendezvous']}"
        )
    devices = all_devices(report)
    if devices and devices[0]["type"] == "cpu":
        device = devices[0]
        lines["devices"] = (
            f"{len(devices)} x CPU {device['name']} ({device['threads']} threads), "
            f"matmul {min(x['matmul_flops'] for x in devices) / 1e9:.3g} GFLOP/s"
        )
    elif devices:
        lines["devices"] = "\n".join(
            f"{device['name']} {device['memory_gb']:.0f} GB "
            f"cc {'.'.join(map(str, device['compute_capability']))}"
            f" fp8 {'yes' if device['fp8'] else 'no'} driver {device['driver']}: "
            f"{device['matmul_flops'] / 1e12:.0f} TFLOPS"
            + (f" ({device['matmul_fraction']:.0%} of peak)" if device["matmul_fraction"] else "")
            for device in devices
        )
    collectives = report["ranks"][0].get("collectives") or {}
    if "all_reduce" in collectives:
        lines["collectives"] = ", ".join(
            f"{op.replace('_', '-')} {r['busbw_gbs']:.3g} GB/s" for op, r in collectives.items()
        )
    if "comm_s" in proj:
        lines["communication"] = (
            f"{proj['comm_s']:.3g} s per step vs {proj['compute_s']:.3g} s compute "
            f"({proj['mode']}, {proj['comm_ratio']:.0%})"
        )
    for disk in storage_reports(report):
        text = f"{disk['probe_dir']}: "
        if "write_mb_s" in disk:
            text += (
                f"write {disk['write_mb_s']:.3g} MB/s, fsync {disk['fsync_ms_median']:.3g} ms, "
                f"read-back {'ok' if disk['read_back_ok'] else 'BAD'}, "
            )
        if disk.get("free_bytes") is not None:
            text += f"free {_gb(disk['free_bytes'])}"
        if proj.get("free_bytes_needed"):
            text += f" (needs {_gb(proj['free_bytes_needed'])})"
        if proj.get("save_s") is not None:
            interval = proj.get("checkpoint_interval_s")
            text += f", save {proj['save_s']:.3g} s" + (
                f" every {interval:.3g} s" if interval else ""
            )
        lines["storage"] = (lines.get("storage", "") + "\n" + text).strip()
    probes = shared_probes(report)
    if probes:
        nodes = probes[0].get("nodes") or [p["node"] for p in probes]
        sees_all = sum(1 for p in probes if len(p.get("seen", [])) == len(nodes))
        lines["shared"] = (
            f"{sees_all} of {len(probes)} hosts see every host's files in the checkpoint folder"
        )
    rates = [r["data"]["tokens_per_s"] for r in report["ranks"] if "tokens_per_s" in r["data"]]
    if rates:
        needed = proj.get("tokens_per_s_needed")
        lines["data"] = f"{min(rates):,.0f} tokens/s per rank" + (
            f" (a step needs {needed / report['world_size']:,.0f})" if needed else ""
        )
    ready = report["ranks"][0].get("trackers") or {}
    if "trackers" in ready:
        lines["trackers"] = ", ".join(ready["trackers"]) or "none: metrics.jsonl only"
    return lines


def print_report(report: dict) -> None:
    table = Table(
        title=f"preflight: {report['world_size']} rank(s) on {len(report['hosts'])} host(s)"
    )
    table.add_column("check")
    table.add_column("measured")
    table.add_column("status")
    summaries = _summaries(report)
    by_check: dict[str, list[str]] = {}
    for finding in report["findings"]:
        by_check.setdefault(finding["check"], []).append(finding["severity"])
    checks = [c for c in CHECKS if c in summaries or c in by_check]
    checks += [c for c in by_check if c not in checks]
    for check in checks:
        severities = by_check.get(check, [])
        status = next((s for s in (FAIL, WARN, NOTE) if s in severities), "ok")
        style = {FAIL: "bold red", WARN: "yellow", NOTE: "dim", "ok": "green"}[status]
        label = {FAIL: "NO-GO", WARN: "warn", NOTE: "note", "ok": "ok"}[status]
        table.add_row(check, summaries.get(check, ""), f"[{style}]{label}[/{style}]")
    console.print(table)
    for finding in report["findings"]:
        marker = {FAIL: "[bold red]✗[/bold red]", WARN: "[yellow]![/yellow]", NOTE: "·"}
        console.print(f"{marker[finding['severity']]} {finding['check']}: {finding['reason']}")
        if finding["fix"]:
            console.print(f"    fix: {finding['fix']}")
    colour = "green" if report["verdict"] == "GO" else "red"
    console.print(f"[bold {colour}]{report['verdict']}[/bold {colour}]")
