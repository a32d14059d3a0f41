"""The report card's plan section: the planned memory and time beside the field report's, the host checks and the launch's cost."""

from __future__ import annotations

from dataclasses import replace

from hanlm.launch.cost import LaunchRecord, spent
from hanlm.plan import estimate, inputs, memory_model, time_model
from hanlm.preflight.report import PreflightReport
from hanlm.report.markdown import GIB, missing, table, usd
from hanlm.report.rehearsal_section import rehearsal_part
from hanlm.report.run_files import RunFiles


def plan_section(files: RunFiles) -> str:
    from hanlm.report import plots as report_plots  # deferred: matplotlib

    out: list[str] = []
    field = inputs.FIELD_REPORT
    shapes = inputs.model_shapes(field.model, vocab_size=field.vocab_size, seq_len=field.seq_len)
    one = memory_model.memory(field, shapes)
    eight_setup = replace(field, gpus=8, parallel="fsdp")
    eight = memory_model.memory(eight_setup, shapes)
    timing = time_model.throughput(eight_setup, shapes)
    rows = [
        [item, f"{one.items[item] / GIB:.2f}", f"{eight.items[item] / GIB:.2f}"]
        for item in one.items
    ]
    rows.append(["**total**", f"**{one.total / GIB:.2f}**", f"**{eight.total / GIB:.2f}**"])
    rows.append(["fits in 32 GB?", "yes" if one.fits else "no", "yes" if eight.fits else "no"])
    out.append(
        "**This planner on the field setup** (`1.3b`, seq 2,048, micro-batch 2, bf16, AdamW; "
        "GiB per GPU):\n\n"
    )
    out.append(table(["item", "1 x RTX 5090", "8 x RTX 5090, FSDP"], rows))
    out.append(
        f"\n22B tokens on 8 RTX 5090s at 40% MFU, counting 6·N·D: **{timing.gpu_hours:,.0f} "
        f"GPU-hours, {timing.wall_hours:,.1f} h, {timing.cost:,.0f} USD**; counting attention FLOPs "
        f"too adds {timing.attention_adds:.0%} ({timing.cost_with_attention:,.0f} USD).\n"
    )
    path = report_plots.memory_bars(
        {"1 x RTX 5090": one.items, "8 x RTX 5090 (FSDP)": eight.items},
        one.capacity,
        files.plots / "plan_memory.png",
    )
    out.append(f"\n![per-GPU memory of the field setup]({path.relative_to(files.root)})\n")

    plan = estimate.Plan.read_if_present(files.plan)
    if plan is None or plan.memory is None or plan.time is None:
        out.append("\n" + missing("plan"))
        return "".join(out)
    mem, tt = plan.memory, plan.time
    setup = plan.setup
    out.append(
        f"\n**This run's plan** ({setup.model}, {plan.model.parameters:,} parameters, "
        f"on {setup.gpus} x {setup.gpu}): {mem.total / GIB:.2f} GiB per device of "
        f"{mem.capacity / GIB:.1f} ({'fits' if mem.fits else 'does not fit'}); "
        f"planned {tt.tokens_per_s:,.0f} tokens/s at MFU {tt.mfu:.0%} ({tt.mfu_source}).\n"
    )
    return "".join(out)


def preflight_section(files: RunFiles) -> str:
    report = PreflightReport.read_if_present(files.preflight)
    if report is None:
        return missing("preflight") + rehearsal_part(files.rehearsal)
    out: list[str] = []
    out.append(
        f"**Verdict: {report.verdict}** ({report.world_size} process(es) on "
        f"{len(report.hosts)} host(s)).\n\n"
    )
    rank0 = report.ranks[0]
    rows = []
    for device in rank0.device_list():
        flops = device.get("matmul_flops")
        rows.append(
            [
                "device",
                f"{device.get('name')}: matmul {flops / 1e9:,.1f} GFLOP/s"
                if flops
                else device.get("name"),
            ]
        )
    storage = rank0.storage or {}
    if storage:
        rows.append(
            [
                "storage",
                f"write {storage.get('write_mb_s', 0):,.0f} MB/s with fsync, fsync "
                f"{storage.get('fsync_ms_median', 0):.1f} ms, read-back "
                f"{'ok' if storage.get('read_back_ok') else 'FAILED'}",
            ]
        )
    collectives = rank0.collectives or {}
    if "all_reduce" in collectives:  # measured under torchrun: the field report's failed hosts
        size = collectives["all_reduce"].get("bytes", 0) / 1e6
        rows.append(
            [
                "collectives",
                ", ".join(
                    f"{op.replace('_', '-')} {r['busbw_gbs']:.3g} GB/s"
                    for op, r in collectives.items()
                )
                + f" (bus bandwidth over {report.world_size} ranks, {size:,.0f} MB messages)",
            ]
        )
    elif "error" in collectives:
        rows.append(["collectives", f"FAILED: {collectives['error']}"])
    projection = report.projection or {}
    if "comm_s" in projection:
        rows.append(
            [
                "communication",
                f"{projection['comm_s']:.3g} s per step against {projection['compute_s']:.3g} s "
                f"of compute ({projection['mode']}, {projection['comm_ratio']:.0%})",
            ]
        )
    for finding in report.findings:
        rows.append([finding.check, f"{finding.severity}: {finding.reason}"])
    out.append(table(["check", "measured"], rows))
    out.append(_launch_part(files))
    out.append(rehearsal_part(files.rehearsal))
    return "".join(out)


def _launch_part(files: RunFiles) -> str:
    """A launched run: every host set tried with its verdict and hours, and the cost planned
    before the launch against what the hosts cost."""
    record = LaunchRecord.read_if_present(files.launch) if files.launch else None
    if record is None:
        return ""
    c = record.cost
    paid = spent(
        files.preflight.parent,
        price_per_gpu_hour=c.price_per_gpu_hour,
        minutes_per_rejected_host=c.minutes_per_rejected_host,
    )
    out = [
        f"\n**Launched** with {record.engine} on {record.nodes} x {record.gpus_per_node} x "
        f"{record.accelerator or 'GPU'} ({c.market}, "
        f"{usd(c.price_per_gpu_hour)} per GPU-hour: {c.price_source}).\n\n"
    ]
    rows = [
        [
            r["verdict"],
            ", ".join(r["hosts"]),
            r["gpus"],
            f"{r['gpu_hours']:,.2f}",
            "; ".join(r["reasons"]) or "-",
        ]
        for r in paid["host_sets"]
    ]
    if rows:
        out.append(table(["verdict", "hosts", "GPUs", "GPU-hours paid", "why rejected"], rows))
    out.append(
        "\n"
        + table(
            ["", "GPU-hours", "cost"],
            [
                [
                    "planned (training and data stages)",
                    f"{c.planned_gpu_hours:,.1f}",
                    usd(c.planned_cost),
                ],
                [
                    "expected, with the allowances for rejected hosts and preemptions",
                    f"{c.expected_gpu_hours:,.1f}",
                    usd(c.expected_cost),
                ],
                [
                    "spent so far (all host sets)",
                    f"{paid['gpu_hours']:,.2f}",
                    usd(paid.get("cost")),
                ],
                [
                    "of which on rejected hosts",
                    f"{paid['rejected_gpu_hours']:,.2f}",
                    usd(paid.get("rejected_cost")),
                ],
            ],
        )
    )
    out.append(
        "\nSpent: each host set from its start (its setup) to its verdict when rejected, or "
        "to the next set or now when accepted. Assumed for the plan: "
        + "; ".join(c.assumptions)
        + ".\n"
    )
    return "".join(out)
