"""What a user already has on disk, to check that a refused command left it exactly as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path


def snapshot(*paths: Path) -> dict[str, str]:
    """sha256 of every file under `paths` (each a file or a folder) by path; folders and
    missing paths are listed too, so that a removed or added entry shows as a difference."""
    state: dict[str, str] = {}
    for path in map(Path, paths):
        entries = sorted(path.rglob("*")) if path.is_dir() else []
        for entry in (path, *entries):
            if entry.is_file():
                state[str(entry)] = hashlib.sha256(entry.read_bytes()).hexdigest()
            else:
                state[str(entry)] = "folder" if entry.is_dir() else "missing"
    return state


def user_folder(path: Path) -> Path:
    """A folder holding a user's own files (one of them in a subfolder)."""
    (path / "notes").mkdir(parents=True)
    (path / "README.md").write_text("my model card\n", encoding="utf-8")
    (path / "notes" / "ideas.txt").write_text("아이디어\n", encoding="utf-8")
    return path


def user_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"a user's own file\n")
    return path
