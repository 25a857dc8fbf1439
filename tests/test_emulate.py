"""The emulated cluster and bytecomp bench (network namespaces: needs root)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from refusal import one_line_error

from bytecomp.emulate import check_bandwidth
from bytecomp.emulate.netns import (
    leftovers,
    parse_latency,
    parse_rate,
    parse_size,
    tbf_burst_bytes,
)
from bytecomp.errors import BytecompError

# every test here spawns ranks (profiles them, or emulates a cluster): make test-all
pytestmark = pytest.mark.multirank


def _netns_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) for network namespaces"
    probe = subprocess.run(["ip", "netns", "add", "bcpytestprobe"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        return f"network namespaces unavailable: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "bcpytestprobe"], capture_output=True)
    return None


REASON = _netns_reason()
netns = pytest.mark.skipif(REASON is not None, reason=REASON or "")
BYTECOMP = [sys.executable, "-m", "bytecomp"]


def test_rates_and_latencies_parse():
    assert parse_rate("1gbit") == 1e9 and parse_rate("100mbit") == 1e8
    assert parse_rate("2.5gbit") == 2.5e9
    assert parse_latency("100us") == pytest.approx(1e-4)
    assert parse_latency("2ms") == pytest.approx(2e-3)
    # one millisecond at the rate, never below 16 KiB
    assert tbf_burst_bytes(1e9) == 125_000 and tbf_burst_bytes(1e8) == 16 * 1024
    assert parse_size("32kb") == parse_size("32k") == 32 * 1024 and parse_size("1mb") == 1 << 20
    assert parse_size("65536") == 65536
    for bad in ("lots", "1kb", "-5k"):
        with pytest.raises(BytecompError, match="size|cannot pass"):
            parse_size(bad)
    with pytest.raises(BytecompError, match="not a rate"):
        parse_rate("fast")


@pytest.mark.clock
@netns
def test_emulated_allreduce_reaches_the_configured_bandwidth():
    result = check_bandwidth("1gbit", size_mb=16)
    assert 0.85 <= result["share"] <= 1.05, result


@netns
def test_interrupting_emulate_leaves_nothing_behind():
    process = subprocess.Popen([*BYTECOMP, "emulate", "--nodes", "2", "--ranks-per-node", "2",
                                "--", "sleep", "59.25"], stderr=subprocess.PIPE, text=True)
    banner = process.stderr.readline()
    run_id = banner.split("run ")[1].split(",")[0]
    deadline = time.monotonic() + 20
    while len(leftovers(run_id)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(leftovers(run_id)) >= 3  # two namespaces and the bridge, at least
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    assert "tbf" in qdiscs
    process.send_signal(signal.SIGINT)
    process.wait(timeout=20)
    assert process.returncode != 0
    assert leftovers(run_id) == []
    assert f"bc{run_id}" not in subprocess.run(["tc", "qdisc", "show"], capture_output=True,
                                               text=True).stdout
    sleepers = subprocess.run(["pgrep", "-f", "sleep 59.25"], capture_output=True, text=True)
    assert sleepers.stdout.strip() == ""


def _sleepers(pattern: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return found.stdout.split()


# A killed emulate and what its janitor removes: tests/hostile/test_leftovers.py


@netns
def test_the_links_token_bucket_has_the_depth_asked_for():
    show = ["tc", "qdisc", "show", "dev", "eth0"]
    result = subprocess.run([*BYTECOMP, "emulate", "--nodes", "2", "--bandwidth", "100mbit",
                             "--burst", "48kb", "--", *show], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stdout.count("burst 48Kb") == 2, result.stdout
    default = subprocess.run([*BYTECOMP, "emulate", "--nodes", "1", "--bandwidth", "1gbit",
                              "--", *show], capture_output=True, text=True, timeout=60)
    assert "rate 1Gbit burst 125000b" in default.stdout, default.stdout


def test_a_bad_burst_is_one_clear_line(cli):
    result = cli("emulate", "--burst", "deep", "--", "true")
    assert result.returncode == 2 and "not a size like 32kb" in result.stderr


@netns
def test_a_failing_rank_ends_emulate_with_its_exit_code():
    result = subprocess.run([*BYTECOMP, "emulate", "--nodes", "2", "--", sys.executable, "-c",
                             "import os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3


# profile -> plan -> bench under `bytecomp emulate` end to end: tests/test_benchmarks.py's
# gpu cell (2 x 1) and convergence matrix (2 x 2, plan's finalists on the emulated ranks)
# smoke runs.


def test_emulate_without_root_is_one_clear_line():
    # The process believes it is not root: the same code path as a real unprivileged user.
    script = ("import os, sys; os.geteuid = lambda: 1000; from bytecomp.cli import main; "
              "sys.argv = ['bytecomp', 'emulate', '--nodes', '2', '--', 'true']; main()")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    one_line_error(result, "needs root")
