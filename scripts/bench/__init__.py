"""The throughput bench by suite (scripts/bench_throughput.py is its command line): one module per
suite, and core.py, the timing and the isolated runs they share.

Importing the package puts the checkout's src/ first on the path (the bench measures this checkout),
so its modules import normbench after it."""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
