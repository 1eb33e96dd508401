"""What /proc/cpuinfo says about this machine's CPU: its model name and its feature words.

One reader for the two questions the code asks of it: which CPU the estimate's calibration belongs to
(:mod:`normbench.reproduce.estimate`) and whether bf16 products are native (:mod:`.precision`).
"""

from __future__ import annotations

import platform
from pathlib import Path


def _field(*names: str) -> str | None:
    """The value of the first line of /proc/cpuinfo whose key is one of ``names``; None where there is none."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in names:
            return value.strip()
    return None


def cpu_flags() -> set[str]:
    """The CPU's feature words (``flags`` on x86, ``Features`` on Arm); empty where /proc/cpuinfo is absent."""
    return set((_field("flags", "features") or "").split())


def cpu_model() -> str:
    """The CPU's model name, or what ``platform`` knows where /proc/cpuinfo has none."""
    return _field("model name") or platform.processor() or platform.machine()
