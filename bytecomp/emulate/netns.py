"""An emulated cluster on one machine: a network namespace per node.

Each node is a namespace whose ``eth0`` is one end of a veth pair; the other
ends join a bridge in the root namespace. A token bucket (tc tbf) shapes both
directions of every node's link: egress of ``eth0`` inside the node, and
egress of the bridge-side end towards it. Ranks of one node share its
namespace, so their traffic to each other stays on loopback. Addresses are
private (10.x.y.0/24, chosen per run) and exist only inside the namespaces;
the bridge has none. Names carry a random run id, so runs do not collide, and
everything is removed on exit, error or interrupt. A run killed outright
(SIGKILL) cannot clean up: its janitor (:mod:`bytecomp.emulate.janitor`, a process
started with the cluster that waits for the run to end) removes what it left, and
should the janitor be killed too, the run's owner file in ``OWNERS`` lets the next
run remove it (``reap_abandoned``).

Needs root (CAP_NET_ADMIN) and iproute2 (``ip``, ``tc``).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bytecomp.errors import BytecompError
from bytecomp.files import read_text_file

PREFIX = "bc"
NODE_INTERFACE = "eth0"
OWNERS = Path("/run/bytecomp-emulate")  # one file per live run: its id, holding its pid
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}


def parse_rate(text: str) -> float:
    """Bits per second from a tc-style rate: ``100mbit``, ``1gbit``, ``2.5gbit``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)bit\s*", text.lower())
    if not match:
        raise BytecompError(f"bandwidth {text!r} is not a rate like 100mbit, 1gbit or 10gbit")
    rate = float(match.group(1)) * _UNITS[match.group(2)]
    if rate <= 0:
        raise BytecompError("bandwidth must be positive")
    return rate


def parse_latency(text: str) -> float:
    """Seconds from ``100us``, ``2ms``, ``0``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(us|ms|s)?\s*", text.lower())
    if not match:
        raise BytecompError(f"latency {text!r} is not a time like 100us or 2ms")
    value = float(match.group(1))
    return value * {"us": 1e-6, "ms": 1e-3, "s": 1.0, None: 1e-6}[match.group(2)]


def tbf_burst_bytes(rate_bps: float) -> int:
    """The token bucket's depth: one millisecond at the line rate, at least 16 KiB.

    A real link has no bucket: a message takes size / rate however long the link
    was idle. A token bucket lets a sender that was idle send its depth at once,
    so a deep bucket makes small messages after a pause nearly free: with 256 KiB
    at 100 Mbit/s, a 160 KB allreduce after 30 ms idle took 0.7-4.2 ms instead of
    12.8. tbf segments GSO packets larger than the bucket and keeps the rate with
    a high-resolution timer, so a shallow bucket still carries most of the rate
    (``benchmarks/emulated_link.py`` here: 88.6% of 100 Mbit/s with 16 KiB, the
    160 KB allreduce after a pause 13.2 ms; 95.6% of 1 Gbit/s with 122 KiB, where
    32 KiB gave 64-70%).
    """
    return int(max(16 * 1024, rate_bps / 8 / 1000))


def parse_size(text: str) -> int:
    """Bytes from a tc-style size: ``32kb``, ``256k``, ``1mb``, ``65536``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(k|kb|m|mb|b)?\s*", text.lower())
    if not match:
        raise BytecompError(f"size {text!r} is not a size like 32kb, 256k or 65536")
    size = int(float(match.group(1)) * {"k": 1024, "kb": 1024, "m": 1 << 20, "mb": 1 << 20,
                                       "b": 1, None: 1}[match.group(2)])
    if size < 2048:
        raise BytecompError(f"a token bucket of {size} bytes cannot pass a packet; give at "
                            f"least 2kb")
    return size


def _run(*command: str, namespace: str | None = None, check: bool = True) -> str:
    full = (["ip", "netns", "exec", namespace] if namespace else []) + list(command)
    result = subprocess.run(full, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise BytecompError(f"`{' '.join(full)}` failed: {result.stderr.strip() or result.stdout}")
    return result.stdout


def check_support(latency_s: float = 0.0) -> None:
    """One clear error when this machine cannot emulate a cluster."""
    if os.geteuid() != 0:
        raise BytecompError("bytecomp emulate needs root (CAP_NET_ADMIN) to create network "
                            "namespaces and shape links")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise BytecompError(f"bytecomp emulate needs `{tool}` (iproute2)")
    probe = f"{PREFIX}probe{secrets.token_hex(3)}"
    result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if result.returncode != 0:
        raise BytecompError(f"this machine cannot create network namespaces: "
                            f"{result.stderr.strip()}")
    try:
        if latency_s > 0:
            netem = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev",
                                    "lo", "root", "netem", "delay", "1ms"],
                                   capture_output=True, text=True)
            if netem.returncode != 0:
                raise BytecompError("--latency needs the netem qdisc, which this kernel does "
                                    "not have; leave --latency out")
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)


@dataclass
class EmulatedCluster:
    """Namespaces, veth pairs, a bridge and shaping for ``nodes`` nodes (a context manager)."""

    nodes: int
    rate_bps: float
    latency_s: float = 0.0
    burst_bytes: int | None = None  # the token bucket's depth; None: tbf_burst_bytes(rate)
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    created: list[tuple[str, str]] = field(default_factory=list)
    janitor: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.run_id}br"

    def namespace(self, node: int) -> str:
        return f"{PREFIX}{self.run_id}n{node}"

    def host_link(self, node: int) -> str:
        return f"{PREFIX}{self.run_id}v{node}"

    def address(self, node: int) -> str:
        return f"{self.subnet}.{node + 1}"

    def _shape(self, device: str, namespace: str | None) -> None:
        rate = f"{int(self.rate_bps)}bit"
        burst = str(self.burst_bytes or tbf_burst_bytes(self.rate_bps))
        tbf = ["tbf", "rate", rate, "burst", burst, "latency", "100ms"]
        if self.latency_s > 0:
            delay = f"{self.latency_s * 1e6:.0f}us"
            _run("tc", "qdisc", "add", "dev", device, "root", "handle", "1:", "netem", "delay",
                 delay, namespace=namespace)
            _run("tc", "qdisc", "add", "dev", device, "parent", "1:", "handle", "2:", *tbf,
                 namespace=namespace)
        else:
            _run("tc", "qdisc", "add", "dev", device, "root", *tbf, namespace=namespace)

    def __enter__(self) -> EmulatedCluster:
        try:
            OWNERS.mkdir(parents=True, exist_ok=True)
            (OWNERS / self.run_id).write_text(str(os.getpid()))
            self._start_janitor()
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            self.created.append(("link", self.bridge))
            _run("ip", "link", "set", self.bridge, "up")
            for node in range(self.nodes):
                namespace, host = self.namespace(node), self.host_link(node)
                _run("ip", "netns", "add", namespace)
                self.created.append(("netns", namespace))
                _run("ip", "link", "add", host, "type", "veth", "peer", "name", NODE_INTERFACE,
                     "netns", namespace)
                self.created.append(("link", host))
                _run("ip", "link", "set", host, "master", self.bridge)
                _run("ip", "link", "set", host, "up")
                _run("ip", "addr", "add", f"{self.address(node)}/24", "dev", NODE_INTERFACE,
                     namespace=namespace)
                _run("ip", "link", "set", NODE_INTERFACE, "up", namespace=namespace)
                _run("ip", "link", "set", "lo", "up", namespace=namespace)
                self._shape(NODE_INTERFACE, namespace)  # node -> bridge
                self._shape(host, None)                 # bridge -> node
        except BaseException:
            self.teardown()
            raise
        return self

    def _start_janitor(self) -> None:
        """The process that tears this run down if this one dies (see the janitor's
        docstring): its standard input is a pipe only this process holds open."""
        self.janitor = subprocess.Popen(
            [sys.executable, "-m", "bytecomp.emulate.janitor", self.run_id],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True)

    def _stop_janitor(self) -> None:
        janitor, self.janitor = self.janitor, None
        if janitor is None:
            return
        assert janitor.stdin is not None
        janitor.stdin.close()  # its cue: it finds nothing left and exits
        try:
            janitor.wait(timeout=10)
        except subprocess.TimeoutExpired:
            janitor.kill()
            janitor.wait()

    def teardown(self) -> None:
        """Remove everything this run created (deleting a namespace removes its veth pair
        and qdiscs), then let the janitor go; safe to call twice."""
        for kind, name in reversed(self.created):
            if kind == "netns":
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
            else:
                subprocess.run(["ip", "link", "del", name], capture_output=True)
        self.created.clear()
        (OWNERS / self.run_id).unlink(missing_ok=True)
        self._stop_janitor()

    def __exit__(self, *exc) -> None:
        self.teardown()


def leftovers(run_id: str | None = None) -> list[str]:
    """Namespaces and links of bytecomp runs (of ``run_id``, or of any run) still present."""
    prefix = PREFIX + (run_id or "")
    names = [line.split()[0] for line in _run("ip", "netns", "list", check=False).splitlines()
             if line.strip()]
    links = re.findall(r"^\d+: ([^:@]+)", _run("ip", "-o", "link", "show", check=False),
                       flags=re.M)
    return [n for n in names + links if n.startswith(prefix) and "probe" not in n]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_processes_in(namespace: str) -> list[int]:
    """SIGKILL every process inside ``namespace`` (ranks of a run killed outright, and
    their children); returns their pids."""
    listed = _run("ip", "netns", "pids", namespace, check=False)
    pids = [int(pid) for pid in listed.split() if pid.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def reap_abandoned() -> dict[str, list[str]]:
    """Remove what runs whose process is gone (killed outright) left behind.

    Returns ``{run_id: [removed namespaces and links]}``; the processes still running
    in those namespaces are killed first. Runs still alive are never touched."""
    reaped: dict[str, list[str]] = {}
    for owner in sorted(OWNERS.glob("*")) if OWNERS.is_dir() else []:
        try:
            pid = int(read_text_file(owner, "emulate owner file", limit=64).strip())
        except (BytecompError, ValueError):
            pid = -1
        if pid > 0 and _alive(pid):
            continue
        reaped[owner.name] = reap_run(owner.name)
    return reaped


def reap_run(run_id: str) -> list[str]:
    """Remove run ``run_id``'s namespaces (killing what runs in them first), links and
    owner file; returns the names removed (none after a clean teardown)."""
    names = leftovers(run_id)
    namespaces = [n for n in names if n[len(PREFIX) + len(run_id):].startswith("n")]
    for name in namespaces:  # its ranks first: they would run on, unreachable
        kill_processes_in(name)
    for name in namespaces:  # then namespaces: deleting one removes its veth pair
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    for name in names:
        if not name[len(PREFIX) + len(run_id):].startswith("n"):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    (OWNERS / run_id).unlink(missing_ok=True)
    return names
