"""Peak-memory probes the benchmarks share (Linux /proc)."""

from __future__ import annotations


def status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM, ...)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Reset VmHWM to the current RSS (writing 5 to clear_refs; Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
