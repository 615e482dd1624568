"""Test driver: ``codegen search`` with each GPU measurer replaced by a slowed replay of the recorded H200
sweep that owns a stand-in worker process, named in the OS as a GPU worker is (codegen.worker.process_name).
Kill that process and the kernel in flight fails as worker_crash and a new one starts, as with GpuWorker.

    python -m tests.search.worker_search --m 4096 --n 4096 --k 4096 --restricted --gpus 0,1 --db URL --budget N
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

from codegen.evaluate import blank_result
from codegen.worker import name_this_process, process_name
from search import measure
from tests.search.slow_search import RECORDING


def idle_worker(ordinal: int, conn) -> None:
    name_this_process(process_name(ordinal))
    try:
        conn.recv()
    except (EOFError, KeyboardInterrupt):
        pass


class WorkerReplay(measure.ReplayMeasurer):
    def __init__(self, problem, ordinal: int = 0, **_kw) -> None:
        super().__init__(RECORDING, problem)
        self.ordinal = ordinal
        self.delay = float(os.environ.get("GEMMSCAPE_TEST_DELAY", "0.05"))
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=idle_worker, args=(self.ordinal, child), daemon=True)
        self.proc.start()

    def next_done(self):
        time.sleep(self.delay)
        done = super().next_done()
        if not self.proc.is_alive():
            code = self.proc.exitcode
            self.proc.join()
            self._start()
            done.result = blank_result("worker_crash", f"worker exited with code {code}")
        return done

    def close(self) -> None:
        self.proc.kill()
        self.proc.join(5)


def main() -> int:
    measure.GpuMeasurer = WorkerReplay  # what `codegen search` builds when it is not replaying
    from codegen.cli import main as cli

    return cli(["search", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
