"""The command line: output of each command and one-line errors with exit code 2."""

from __future__ import annotations

import subprocess
import sys


def bytecomp(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bytecomp", *args], capture_output=True,
                          text=True, cwd=cwd, env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"})


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_compressors_lists_every_compressor_with_payload_and_ratio():
    result = bytecomp("compressors")
    assert result.returncode == 0, result.stderr
    for name in ("none", "fp16", "topk", "powersgd", "acpsgd", "exdyna", "signsgd"):
        assert f" {name} " in result.stdout
    assert "4,194,304" in result.stdout  # fp32 payload of 1M elements
    assert "32.0x" in result.stdout      # one bit per element


def test_compressors_accepts_specs():
    result = bytecomp("compressors", "topk:ratio=0.001")
    assert result.returncode == 0 and "ratio=0.001" in result.stdout


def test_bad_spec_is_one_line_and_exit_code_2():
    assert_one_line_error(bytecomp("compressors", "topk:ratio=2"), "ratio=2", "0 < ratio <= 1")
    assert_one_line_error(bytecomp("compressors", "zip"), "unknown compressor 'zip'", "topk")
