"""Which code a run ran: ``git describe --always --dirty`` of the checkout normbench is imported from.

A run's ``summary.json`` keeps it as ``commit`` (docs/contract.md §5), so a report can say which code
made each number (its setup box). ``-dirty`` marks uncommitted changes to tracked files; an installed
package outside a git checkout has no commit (None).
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path


@functools.lru_cache(maxsize=1)
def code_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=here, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
