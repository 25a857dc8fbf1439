"""Class 8 of the hostile corpus: the files bytecomp writes beside an output the user
named, and the temporaries of runs killed outright.

* A plan's evidence files (``plan.finalists.csv``, ``plan.curves.csv``,
  ``plan.curves.png``), planted as symbolic links to a file outside the directory, are
  refused in one line before any work, and the outside file is unchanged; a link
  planted after the check is replaced as a directory entry, never written through.
* A user's directory named like one of bytecomp's stale temporaries (``.plan.yaml.<dead
  pid>.keep.old/``, ``.prof.<dead pid>.keep.tmp/``) survives every command, and is never
  "restored" in place of a missing output; bytecomp's own stale temporaries (its marker
  inside, nothing else) are removed, and a directory swap killed between its renames
  puts the old directory back.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from refusal import one_line_error

from bytecomp.errors import BytecompError
from bytecomp.files import (
    MARKER,
    _private_directory,
    atomic_files,
    directory_atomic,
    remove_stale_scratch,
    remove_stale_temporaries,
    scratch_directory,
)
from bytecomp.search.evidence import evidence_paths

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "cnn"
FAST = ["--no-verify", "--compressor", "fp16", "--algorithm", "greedy", "--budget", "0",
        "--bucket-cap-mb", "25"]
OUTSIDE_TEXT = "the user's own file\n"


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize("index", [0, 1, 2], ids=["finalists.csv", "curves.csv", "curves.png"])
def test_a_planted_evidence_link_is_refused_and_its_target_unchanged(cli, tmp_path, index):
    out_dir, outside = tmp_path / "o", tmp_path / "elsewhere" / "precious.txt"
    out_dir.mkdir()
    outside.parent.mkdir()
    outside.write_text(OUTSIDE_TEXT)
    side = evidence_paths(out_dir / "plan.yaml")[index]
    side.symlink_to(outside)
    one_line_error(cli("plan", PROFILE, "--cluster", "gbe1", "--out",
                              out_dir / "plan.yaml", "--verify-steps", "5"),
                          side.name, "symbolic link", "remove the link")
    assert outside.read_text() == OUTSIDE_TEXT
    assert side.is_symlink() and not (out_dir / "plan.yaml").exists()


def test_a_dangling_evidence_link_is_refused_too(cli, tmp_path):
    side = evidence_paths(tmp_path / "plan.yaml")[1]
    side.symlink_to(tmp_path / "not-yet" / "target.csv")
    one_line_error(cli("plan", PROFILE, "--cluster", "gbe1", "--out", tmp_path / "plan.yaml",
                  "--verify-steps", "5"), "symbolic link")
    assert not (tmp_path / "not-yet").exists()


def test_a_link_planted_after_the_check_is_replaced_not_written_through(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text(OUTSIDE_TEXT)
    side = tmp_path / "plan.curves.csv"
    with atomic_files([side], follow_links=False) as (temporary,):
        temporary.write_text("finalist,step\n")
        side.symlink_to(outside)  # the race: planted between the check and the rename
    assert outside.read_text() == OUTSIDE_TEXT
    assert not side.is_symlink() and side.read_text() == "finalist,step\n"
    (tmp_path / "link.csv").symlink_to(outside)
    with pytest.raises(BytecompError, match="symbolic link"), \
            atomic_files([tmp_path / "link.csv"], follow_links=False):
        pass


def test_a_named_output_that_is_a_link_is_still_followed(tmp_path):
    """The user named it: the file it points to is replaced, the link stays."""
    target = tmp_path / "real.yaml"
    target.write_text("old\n")
    (tmp_path / "plan.yaml").symlink_to(target)
    with atomic_files([tmp_path / "plan.yaml"]) as (temporary,):
        temporary.write_text("new\n")
    assert (tmp_path / "plan.yaml").is_symlink() and target.read_text() == "new\n"


def test_a_user_directory_named_like_a_stale_temporary_survives(cli, tmp_path):
    dead = _dead_pid()
    out = tmp_path / "o"
    out.mkdir()
    mine = [out / f".plan.yaml.{dead}.keep.old", out / f".plan.yaml.{dead}.keep.tmp",
            out / f".plan.yaml.{dead}.abc123.tmp"]
    for folder in mine:
        folder.mkdir()
        (folder / "notes.txt").write_text("mine\n")
    faked = out / f".plan.yaml.{dead}.fake12.tmp"  # a marker, and a user's file beside it
    faked.mkdir()
    (faked / MARKER).write_text("bytecomp temporary: writing plan.yaml, process 1\n")
    (faked / "thesis.tex").write_text("mine\n")
    for _ in range(2):  # no plan.yaml the first time: nothing is "restored" in its place
        result = cli("plan", PROFILE, "--cluster", "gbe1", "--out", out / "plan.yaml", *FAST)
        assert result.returncode == 0, result.stderr
        assert (out / "plan.yaml").is_file()
    for folder in mine:
        assert (folder / "notes.txt").read_text() == "mine\n"
    assert (faked / "thesis.tex").read_text() == "mine\n"


def test_a_user_file_named_like_an_old_temporary_survives(tmp_path):
    stale = tmp_path / f".plan.yaml.{_dead_pid()}.abcd1234.tmp"
    stale.write_text("mine\n")
    with atomic_files([tmp_path / "plan.yaml"]) as (temporary,):
        temporary.write_text("a: 1\n")
    assert stale.read_text() == "mine\n"


def _stale_private(parent: Path, name: str, dead: int) -> Path:
    """What a run of process ``dead`` killed while writing ``name`` leaves."""
    made = _private_directory(parent, f".{name}.{os.getpid()}.", f"writing {name}")
    stale = parent / made.name.replace(f".{os.getpid()}.", f".{dead}.", 1)
    made.rename(stale)
    return stale


def test_bytecomp_s_own_stale_temporaries_are_removed(tmp_path):
    dead = _dead_pid()
    file_temporary = _stale_private(tmp_path, "plan.yaml", dead)
    (file_temporary / "plan.yaml").write_text("half a pl")
    directory_temporary = _stale_private(tmp_path, "prof", dead)
    (directory_temporary / "new").mkdir()
    (directory_temporary / "new" / "tensors.csv").write_text("x")
    live = _private_directory(tmp_path, f".plan.yaml.{os.getpid()}.", "writing plan.yaml")
    with atomic_files([tmp_path / "plan.yaml"]) as (temporary,):
        temporary.write_text("a: 1\n")
    assert not file_temporary.exists() and live.exists()
    assert remove_stale_temporaries(tmp_path / "prof") == [directory_temporary]
    assert not (tmp_path / "prof").exists()


def test_a_directory_swap_killed_between_its_renames_puts_the_old_one_back(tmp_path):
    stale = _stale_private(tmp_path, "prof", _dead_pid())
    (stale / "previous").mkdir()
    (stale / "previous" / "profile.yaml").write_text("old")
    with directory_atomic(tmp_path / "other") as folder:  # another output: not touched
        (folder / "x").write_text("x")
    assert stale.exists()
    remove_stale_temporaries(tmp_path / "prof")
    assert (tmp_path / "prof" / "profile.yaml").read_text() == "old" and not stale.exists()


def test_a_directory_swap_leaves_only_the_new_directory(tmp_path):
    target = tmp_path / "prof"
    for text in ("one", "two"):
        with directory_atomic(target, force=True) as folder:
            (folder / "profile.yaml").write_text(text)
    assert (target / "profile.yaml").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prof"]


def test_scratch_of_a_killed_run_is_removed_by_the_next(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    with scratch_directory("finalists") as folder:
        root = folder.parent
        assert root == tmp_path / f"bytecomp-{os.getuid()}"
        assert root.stat().st_mode & 0o777 == 0o700
    assert not folder.exists()
    stale = root / f"finalists.{_dead_pid()}.abcd12.tmp"
    stale.mkdir()
    (stale / MARKER).write_text("bytecomp temporary: finalists\n")
    (stale / "results.json").write_text("{}")
    unmarked = root / f"finalists.{_dead_pid()}.efgh34.tmp"
    unmarked.mkdir()
    assert remove_stale_scratch() == [stale]
    assert unmarked.exists()


def test_a_scratch_root_that_is_not_private_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    elsewhere = tmp_path / "shared"
    elsewhere.mkdir(mode=0o777)
    (tmp_path / f"bytecomp-{os.getuid()}").symlink_to(elsewhere)
    with scratch_directory("finalists") as folder:
        assert folder.parent == tmp_path and elsewhere not in folder.parents
    assert list(elsewhere.iterdir()) == []
