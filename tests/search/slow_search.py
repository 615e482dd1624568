"""Test driver: ``codegen search`` (the real CLI, store and runner) with the GPU measurer replaced
by a replay of the recorded H200 sweep that takes ``GEMMSCAPE_TEST_DELAY`` seconds a kernel.

    python -m tests.search.slow_search --m 4096 --n 4096 --k 4096 --restricted --db URL --budget N

Only the measurements are stand-ins: the process, its signals, the store and Optuna are real.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from search import measure

RECORDING = Path(__file__).resolve().parents[2] / "search" / "recordings" / "replay-simt-4096x4096x4096-fp32.json"


class SlowReplay(measure.ReplayMeasurer):
    def __init__(self, problem, **_kw) -> None:
        super().__init__(RECORDING, problem)
        self.delay = float(os.environ.get("GEMMSCAPE_TEST_DELAY", "0.05"))

    def next_done(self):
        time.sleep(self.delay)
        return super().next_done()


def main() -> int:
    measure.GpuMeasurer = SlowReplay  # what `codegen search` builds when it is not replaying
    from codegen.cli import main as cli

    return cli(["search", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
