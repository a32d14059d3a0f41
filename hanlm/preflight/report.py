"""The preflight report's declared shape: `preflight/preflight.json`, which
`hanlm.preflight.run.check` writes (rank 0) and returns on every rank. Kept apart from the checks
so that what reads it (the report card, the model card, publishing) does not import torch."""

from __future__ import annotations

from typing import Any

from hanlm.results import Part, Result


class Finding(Part):
    """One judgement: severity "fail" makes the verdict NO-GO, "warn" and "note" do not."""

    check: str
    severity: str
    reason: str
    fix: str | None = None


class RankReport(Part):
    """What one rank measured; a check that could not run holds {"error": ...} instead."""

    rank: int
    local_rank: int
    host: str
    devices: dict[str, Any] | None = None  # {count, devices: [{type, name, memory_gb, ...}]}
    collectives: dict[str, Any] | None = None
    shared: dict[str, Any] | None = None
    storage: dict[str, Any] | None = None  # write_mb_s, fsync_ms_median, read_back_ok, ...
    trackers: dict[str, Any] | None = None
    data: dict[str, Any] | None = None

    def device_list(self) -> list[dict[str, Any]]:
        """The devices this rank found (none when the check failed)."""
        return list((self.devices or {}).get("devices") or [])


class PreflightReport(Result):
    """`preflight/preflight.json`: every rank's measurements, the projection for the planned
    run, the findings and the verdict (GO or NO-GO)."""

    FILE = "preflight.json"
    MADE_BY = "preflight"

    created_at: str
    world_size: int
    expected_world_size: int
    hosts: list[str]
    rendezvous: str | None
    checkpoint_dir: str
    findings: list[Finding]
    ranks: list[RankReport]
    projection: dict[str, Any] | None = None
    verdict: str  # GO, NO-GO

    @property
    def go(self) -> bool:
        return self.verdict == "GO"
