"""The machine's load, for the benchmarks to print before and after a measurement."""

from __future__ import annotations

from pathlib import Path


def load() -> str:
    """The load average and the machine's steal time so far (s)."""
    average = Path("/proc/loadavg").read_text().split()[:3]
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()
    return f"load average {' '.join(average)}, steal {int(cpu[8]) / 100:.1f} s since boot"


def snapshot() -> dict:
    """The one-minute load average and the steal time so far (s), as numbers."""
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()
    return {"load1": float(Path("/proc/loadavg").read_text().split()[0]),
            "steal_s": int(cpu[8]) / 100}
