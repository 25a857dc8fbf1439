"""``bytecomp emulate``: run a command's ranks on an emulated cluster, like torchrun.

>>> run_emulated(["python", "train.py"], nodes=2, ranks_per_node=2, bandwidth="1gbit")

Every rank gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR = node 0's address, MASTER_PORT) and
GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME set to its node's interface. If a rank
fails, the others are stopped; the exit code is the first failing rank's. Ranks
die with ``bytecomp emulate`` even when it is killed outright (the kernel's
parent-death signal), and the next run kills whatever still runs in the
namespaces such a run left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from bytecomp.emulate.netns import (
    NODE_INTERFACE,
    EmulatedCluster,
    check_support,
    parse_latency,
    parse_rate,
    parse_size,
    reap_abandoned,
)
from bytecomp.errors import BytecompError
from bytecomp.lifetime import die_with_parent

MASTER_PORT = 29400


def _rank_environment(cluster: EmulatedCluster, node: int, local: int, ranks_per_node: int,
                      extra: dict | None) -> dict:
    world = cluster.nodes * ranks_per_node
    threads = max(1, (os.cpu_count() or 1) // world)
    return {
        **os.environ,
        "RANK": str(node * ranks_per_node + local), "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(ranks_per_node),
        "GROUP_RANK": str(node), "NODE_RANK": str(node),
        "MASTER_ADDR": cluster.address(0), "MASTER_PORT": str(MASTER_PORT),
        "GLOO_SOCKET_IFNAME": NODE_INTERFACE, "NCCL_SOCKET_IFNAME": NODE_INTERFACE,
        "NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads)),
        "BYTECOMP_EMULATED": f"{cluster.nodes}x{ranks_per_node}@{cluster.rate_bps:.0f}bps",
        **(extra or {}),
    }


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


def run_emulated(command: list[str], nodes: int, ranks_per_node: int, bandwidth: str,
                 latency: str = "0", env: dict | None = None, quiet: bool = False,
                 burst: str | None = None) -> int:
    """Run ``command`` as every rank of an emulated cluster; return the exit code.
    ``burst`` is the links' token-bucket depth (``32kb``; default: one millisecond at
    the rate, at least 16 KiB)."""
    if not command:
        raise BytecompError("give the command to run after --, e.g. "
                            "bytecomp emulate --nodes 2 -- python train.py")
    if nodes < 1 or ranks_per_node < 1:
        raise BytecompError("--nodes and --ranks-per-node must be at least 1")
    rate, latency_s = parse_rate(bandwidth), parse_latency(latency)
    burst_bytes = parse_size(burst) if burst else None
    check_support(latency_s)
    for run_id, names in reap_abandoned().items():
        if not quiet and names:
            print(f"bytecomp emulate: removed what run {run_id} left behind when it was "
                  f"killed: {', '.join(names)}", file=sys.stderr, flush=True)

    def terminate(_signum, _frame):
        raise KeyboardInterrupt

    # Every stop signal, also where the shell started us with SIGINT ignored (a background
    # job); a closed terminal (SIGHUP) stops the ranks as Ctrl-C does.
    previous = {sig: signal.signal(sig, terminate)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    processes: list[subprocess.Popen] = []
    parent = os.getpid()
    try:
        with EmulatedCluster(nodes, rate, latency_s, burst_bytes) as cluster:
            if not quiet:
                print(f"bytecomp emulate: run {cluster.run_id}, {nodes} node(s) x "
                      f"{ranks_per_node} rank(s), {bandwidth} links"
                      + (f", {latency} latency" if latency_s else ""), file=sys.stderr,
                      flush=True)
            for node in range(nodes):
                for local in range(ranks_per_node):
                    processes.append(subprocess.Popen(
                        ["ip", "netns", "exec", cluster.namespace(node), *command],
                        env=_rank_environment(cluster, node, local, ranks_per_node, env),
                        start_new_session=True, preexec_fn=partial(die_with_parent, parent)))
            return _wait(processes)
    finally:
        _stop(processes)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait(processes: list[subprocess.Popen]) -> int:
    while True:
        codes = [p.poll() for p in processes]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            _stop(processes)
            return failed[0]
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.1)


def check_bandwidth(bandwidth: str, size_mb: float = 16.0, repeats: int = 5,
                    burst: str | None = None) -> dict:
    """A 2-node allreduce of ``size_mb`` over links of ``bandwidth``: achieved vs configured."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "check.json"
        os.chmod(scratch, 0o755)
        command = [sys.executable, "-m", "bytecomp.emulate.check", "--size-mb", str(size_mb),
                   "--repeats", str(repeats), "--report", str(report)]
        code = run_emulated(command, 2, 1, bandwidth, quiet=True, burst=burst)
        if code != 0 or not report.exists():
            raise BytecompError(f"the bandwidth check failed (exit code {code})")
        result = json.loads(report.read_text())
    configured = parse_rate(bandwidth) / 1e9
    result.update(configured_gbps=configured, share=result["achieved_gbps"] / configured)
    return result
