"""The preflight report's declared shape: `preflight/preflight.json`, which
`hanlm.preflight.run.check` writes (rank 0) and returns on every rank. Kept apart from the checks
so that what reads it (the report card, the model card, publishing) does not import torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

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
    # when the host was started, from HANLM_HOST_STARTED_AT (set by `hanlm launch`'s scripts):
    # what a rejected host cost is the time from then to this verdict
    host_started_at: str | None = None

    TRIED: ClassVar[str] = (
        "hosts"  # beside the report: a copy of every verdict, one per host (set) tried
    )

    @property
    def go(self) -> bool:
        return self.verdict == "GO"

    def keep_as_tried(self, report_path: Path) -> Path:
        """A copy of this verdict in `hosts/` beside `report_path`, named by time and host, so
        that every host a launch tried keeps its verdict after the next one is measured."""
        stamp = self.created_at.replace(":", "").replace("-", "")[:15]
        host = "+".join(self.hosts)[:80] or "unknown"
        return self.write(Path(report_path).parent / self.TRIED / f"{stamp}Z-{host}.json")
