"""`hanlm demo --out OUT`: the demo world's files into a folder of the user's, beside whatever
else it holds; a later `--force` replaces them only when they are an earlier demo world's."""

from __future__ import annotations

from pathlib import Path

from hanlm.demo.world import FILE_NAMES, build, write
from hanlm.files import atomic_write_json, check_folder_path, claim_output_file, read_json

MARKER = "demo.json"  # says the files beside it are a demo world's (and which)


def _holds_a_demo_world(folder: Path) -> bool:
    try:
        return read_json(folder / MARKER).get("made_by") == "hanlm demo"
    except (OSError, ValueError, AttributeError):
        return False


def write_folder(
    out: Path, seed: int, size_mb: float, *, force: bool, name: str = "--out"
) -> dict[str, Path]:
    """Write the world for `seed` and `size_mb` into `out` (only the world's files are checked,
    and replaced only with `force` when they are an earlier demo world's); `name` is how errors
    call `out`. The files written, by kind."""
    out = Path(out)
    check_folder_path(out, name)
    for file in (*FILE_NAMES.values(), MARKER):
        claim_output_file(
            out / file,
            is_earlier_output=lambda _: _holds_a_demo_world(out),
            replace_earlier=force,
            name=name,
        )
    paths = write(build(seed=seed, size_mb=size_mb), out)
    atomic_write_json(out / MARKER, {"made_by": "hanlm demo", "seed": seed, "size_mb": size_mb})
    return paths
