"""Output paths: hanlm replaces only its own earlier output and never loses anything else."""

from __future__ import annotations

import json

import pytest

from hanlm.errors import UserError
from hanlm.files import (
    IN_PROGRESS_TAG,
    OUTPUT_FILES_KEY,
    STAGE_MARKER,
    atomic_output_dir,
    check_folder_path,
    claim_output_dir,
    claim_output_file,
)
from hanlm.stages.markers import write_stage_marker
from user_files import snapshot, user_file, user_folder


def write_output(final, text="v1", **kwargs):
    with atomic_output_dir(final, **kwargs) as tmp:
        (tmp / "result.txt").write_text(text)
        write_stage_marker(tmp, "test", "fp")
    return final


def test_new_empty_and_earlier_output_are_written(tmp_path):
    out = write_output(tmp_path / "new")
    assert (out / "result.txt").read_text() == "v1"
    assert not (out / IN_PROGRESS_TAG).exists()
    marker = json.loads((out / STAGE_MARKER).read_text())
    assert marker[OUTPUT_FILES_KEY] == ["result.txt", STAGE_MARKER]
    (tmp_path / "empty").mkdir()
    assert (write_output(tmp_path / "empty") / "result.txt").is_file()
    write_output(out, "v2")  # hanlm's own earlier output is replaced
    assert (out / "result.txt").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "new"]  # no leftovers


def test_a_users_folder_is_never_replaced(tmp_path):
    folder = user_folder(tmp_path / "mine")
    before = snapshot(tmp_path)
    for replace_earlier in (True, False):
        with pytest.raises(UserError, match=r"hanlm did not write \(README\.md, notes\)"):
            write_output(folder, replace_earlier=replace_earlier)
    assert snapshot(tmp_path) == before


def test_a_file_where_the_folder_belongs_is_kept(tmp_path):
    path = user_file(tmp_path / "model")
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match="is a file, not a folder"):
        write_output(path)
    with pytest.raises(UserError, match=r"cannot be created: .*model is a file"):
        write_output(path / "inside")
    with pytest.raises(UserError, match="is a file, not a folder"):
        check_folder_path(path, "--run")
    assert snapshot(tmp_path) == before


def test_files_added_to_an_earlier_output_are_kept(tmp_path):
    out = write_output(tmp_path / "out")
    (out / "README.md").write_text("added by the user")
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match=r"also files hanlm did not write there \(README\.md\)"):
        write_output(out, "v2")
    assert snapshot(tmp_path) == before


def test_an_earlier_output_needs_replace_earlier(tmp_path):
    out = write_output(tmp_path / "out")
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match="--force"):
        write_output(out, "v2", replace_earlier=False)
    assert snapshot(tmp_path) == before


def test_a_marker_must_be_hanlms_own(tmp_path):
    folder = user_folder(tmp_path / "mine")
    (folder / STAGE_MARKER).write_text('{"my": "own stage.json"}')
    with pytest.raises(UserError, match="hanlm did not write"):
        claim_output_dir(folder)


def test_temporary_and_old_names_next_to_the_output_are_not_taken(tmp_path):
    out = write_output(tmp_path / "out")
    users_old = user_folder(tmp_path / "out.old")
    before = snapshot(users_old)
    write_output(out, "v2")  # the earlier folder is moved aside under a fresh name
    assert snapshot(users_old) == before
    users_incomplete = user_folder(tmp_path / "other.incomplete")
    before = snapshot(users_incomplete)
    with pytest.raises(UserError, match="is in the way"):
        write_output(tmp_path / "other")
    assert snapshot(users_incomplete) == before


def test_an_interrupted_write_is_cleaned_up_next_time(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt), atomic_output_dir(final) as tmp:
        (tmp / "partial").write_text("x")
        raise KeyboardInterrupt
    assert not final.exists() and not tmp.exists()
    # a crash that left the temporary folder behind (with hanlm's tag): removed, then written
    tmp.mkdir()
    (tmp / IN_PROGRESS_TAG).touch()
    (tmp / "partial").write_text("x")
    assert (write_output(final) / "result.txt").read_text() == "v1"
    assert not tmp.exists()


def test_output_files_follow_the_same_rule(tmp_path):
    def is_mine(path):
        return path.read_text() == "earlier output\n"

    path = user_file(tmp_path / "results.jsonl")
    before = snapshot(tmp_path)
    for force in (False, True):
        with pytest.raises(UserError, match="not hanlm's output, so it is kept"):
            claim_output_file(path, is_earlier_output=is_mine, replace_earlier=force)
    with pytest.raises(UserError, match="is a folder, not a file"):
        claim_output_file(tmp_path, is_earlier_output=is_mine, replace_earlier=True)
    with pytest.raises(UserError, match="cannot be created"):
        claim_output_file(path / "x.jsonl", is_earlier_output=is_mine, replace_earlier=True)
    assert snapshot(tmp_path) == before
    path.write_text("earlier output\n")
    with pytest.raises(UserError, match="--force"):
        claim_output_file(path, is_earlier_output=is_mine, replace_earlier=False)
    claim_output_file(path, is_earlier_output=is_mine, replace_earlier=True)
    claim_output_file(tmp_path / "new.jsonl", is_earlier_output=is_mine, replace_earlier=False)
