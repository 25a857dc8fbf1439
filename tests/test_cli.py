"""The command line: output of each command and one-line errors with exit code 2.

The commands run in this process (the ``cli`` fixture); one test runs a real process.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from refusal import one_line_error

from bytecomp.errors import BytecompError
from bytecomp.files import check_output_file, read_text_file, write_text_atomic

PROFILE = str(Path(__file__).resolve().parents[1] / "profiles" / "cnn")




def test_compressors_lists_every_compressor_with_payload_and_ratio(cli):
    result = cli("compressors")
    assert result.returncode == 0, result.stderr
    for name in ("none", "fp16", "topk", "powersgd", "acpsgd", "exdyna", "signsgd"):
        assert f" {name} " in result.stdout
    assert "4,194,304" in result.stdout  # fp32 payload of 1M elements
    assert "32.0x" in result.stdout      # one bit per element


def test_compressors_accepts_specs(cli):
    result = cli("compressors", "topk:ratio=0.001")
    assert result.returncode == 0 and "ratio=0.001" in result.stdout


def test_bad_spec_is_one_line_and_exit_code_2(cli):
    one_line_error(cli("compressors", "topk:ratio=2"), "ratio=2", "0 < ratio <= 1")
    one_line_error(cli("compressors", "zip"), "unknown compressor 'zip'", "topk")


def test_parse_errors_are_one_line_with_a_pointer_to_help(cli):
    one_line_error(cli("compressors", "--numel", "0"), "--numel",
                          "bytecomp compressors --help")
    one_line_error(cli("plan", "--no-verify", PROFILE, "--bogus"), "No such option: --bogus")
    one_line_error(cli("plan"), "Missing argument")


@pytest.mark.slow
def test_a_real_process_prints_a_parse_error_as_one_line():
    """The ``cli`` fixture's path, once as a process: ``python -m bytecomp``."""
    result = subprocess.run([sys.executable, "-m", "bytecomp", "compressors", "--numel", "0"],
                            capture_output=True, text=True,
                            env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"}, timeout=120)
    one_line_error(result, "--numel", "bytecomp compressors --help")


def test_bad_values_and_unusable_paths_fail_before_any_work(cli, tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))
    under_a_file = str(a_file / "sub")
    cases = [
        (("plan", PROFILE, "--bucket-cap-mb", "nan"), "--bucket-cap-mb must be a finite number"),
        (("plan", PROFILE, "--evaluations", "-1"), "--evaluations must be an integer from 0"),
        (("plan", PROFILE, "--budget", "-1"), "--budget must be a non-negative"),
        (("plan", PROFILE, "--stop-gap", "100"), "--stop-gap is a percentage in [0, 100)"),
        (("plan", PROFILE, "--out", str(tmp_path)), "is a directory; give a file name"),
        (("plan", PROFILE, "--out", under_a_file), "is a file, not a directory"),
        (("plan", PROFILE, "--cluster", str(tmp_path)), "is a directory, not a file"),
        (("plan", PROFILE, "--cluster", str(binary)), "is not a text file"),
        (("plan", str(a_file)), "is not a directory"),
        (("simulate", PROFILE, str(binary)), "is not a text file"),
        (("simulate", PROFILE, str(tmp_path)), "is a directory, not a file"),
        (("profile", "--batch-size", "0"), "--batch-size"),
        (("profile", "--bucket-cap-mb", "-1"), "--bucket-cap-mb must be a positive"),
        (("profile", "--timeout", "0"), "--timeout must be a positive"),
        (("profile", "--max-mb", "-1"), "--max-mb must be at least"),
        (("profile", "--out", under_a_file), "is a file, not a directory"),
        (("profile", "--out", "/proc/bytecomp-test"), "cannot write in /proc"),
        (("bench", PROFILE, "--plan", str(binary), "--out", str(tmp_path / "b")),
         "is not a text file"),
        (("bench", PROFILE, "--plan", "plan.yaml", "--train-steps", "10",
          "--target-fraction", "1.5"), "--target-fraction must be in (0, 1]"),
    ]
    for args, fragment in cases:
        one_line_error(cli(*args, cwd=tmp_path), fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["binary.yaml", "file.txt"]


def test_simulate_checks_every_output_before_writing_any(cli, tmp_path):
    trace = tmp_path / "trace.json"
    (tmp_path / "file.txt").write_text("x")
    result = cli("simulate", PROFILE, "plan.yaml", "--trace", str(trace), "--png",
                 str(tmp_path / "file.txt" / "gantt.png"), cwd=tmp_path)
    one_line_error(result, "--png", "is a file, not a directory")
    assert not trace.exists()


def test_read_text_file_names_what_is_wrong(tmp_path):
    with pytest.raises(BytecompError, match="does not exist"):
        read_text_file(tmp_path / "missing.yaml", "plan file")
    with pytest.raises(BytecompError, match="is a directory"):
        read_text_file(tmp_path, "plan file")
    with pytest.raises(BytecompError, match="not a regular file"):
        read_text_file("/dev/null", "plan file")
    (tmp_path / "latin1.yaml").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(BytecompError, match="not a text file"):
        read_text_file(tmp_path / "latin1.yaml", "plan file")


def test_atomic_writes_use_the_usual_permissions_and_leave_nothing_behind(tmp_path):
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "new" / "plan.yaml", "a: 1\n")
    finally:
        os.umask(old)
    written = tmp_path / "new" / "plan.yaml"
    assert written.read_text() == "a: 1\n"
    assert stat.S_IMODE(written.stat().st_mode) == 0o644
    assert [p.name for p in written.parent.iterdir()] == ["plan.yaml"]
    with pytest.raises(BytecompError, match="is a directory"):
        check_output_file(tmp_path, "--out")


def test_plan_help_lists_the_bucket_caps_the_search_tries(cli):
    from bytecomp.buckets import SEARCHED_CAPS_MB

    result = cli("plan", "--no-verify", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.replace("│", " ").split())
    listed = ", ".join(f"{cap:g}" for cap in SEARCHED_CAPS_MB)
    assert listed == "0, 1, 2, 5, 10, 25, 50, 100"
    assert f"the profiled cap, {listed}" in text
    assert "0: one bucket per tensor" in text
