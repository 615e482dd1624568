"""Several GPUs behind one measurer: one worker per GPU, all serving one study.

``ParallelMeasurer`` takes one measurer per GPU (``GpuMeasurer(ordinal=i)``, or any measurer with
the same interface: the tests use replays) and gives the runner the one interface it knows. Each
measurer is driven by its own thread, which keeps what it was given submitted (so its compile pool
works ahead) and hands finished evaluations to one queue. A study is one GPU model: measurers of
different devices are refused. Processes and hosts share a study through the store instead (see
search.runner); this is the same idea inside one process.
"""

from __future__ import annotations

import queue
import shutil
import subprocess
import threading

__all__ = ["ParallelMeasurer", "gpu_measurer", "gpu_ordinals"]


def gpu_ordinals(spec: str, listing: str | None = None) -> list[int]:
    """``"all"`` (every GPU ``nvidia-smi -L`` lists) or ``"0,2"``: the ordinals to measure on.
    ``listing`` stands in for nvidia-smi's output (tests). Raises ValueError saying what is wrong."""
    if spec.strip() == "all":
        if listing is None:
            smi = shutil.which("nvidia-smi")
            if not smi:
                raise ValueError("--gpus all: no NVIDIA driver here (nvidia-smi not found)")
            listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
        count = sum(1 for line in listing.splitlines() if line.startswith("GPU "))
        if count == 0:
            raise ValueError("--gpus all: nvidia-smi lists no GPU")
        return list(range(count))
    try:
        ordinals = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--gpus takes 'all' or ordinals like 0,1 (got {spec!r})") from None
    if not ordinals or len(set(ordinals)) != len(ordinals) or min(ordinals) < 0:
        raise ValueError(f"--gpus takes 'all' or distinct ordinals like 0,1 (got {spec!r})")
    return ordinals


class ParallelMeasurer:
    """One measurer per GPU behind the runner's interface (submit, __len__, next_done)."""

    def __init__(self, measurers: list, ahead: int = 2) -> None:
        if not measurers:
            raise ValueError("ParallelMeasurer needs at least one measurer")
        names = {m.device.get("name") for m in measurers}
        if len(names) > 1:
            raise ValueError(f"one study measures on one GPU model; these are {', '.join(sorted(map(str, names)))}: "
                             f"pick GPUs of one model with --gpus")
        self.measurers = measurers
        first = measurers[0]
        self.device, self.arch, self.limits = first.device, first.arch, first.limits
        self.problem = getattr(first, "problem", None)
        #: Lookahead the runner needs to keep every GPU busy (``ahead`` candidates each).
        self.lookahead = ahead * len(measurers)
        self._inbox = [queue.Queue() for _ in measurers]
        self._load = [0] * len(measurers)
        self._done: queue.Queue = queue.Queue()
        self._count = 0
        self._lock = threading.Lock()
        #: Which GPU each worker measures on (its ordinal), what each measured, and which worker
        #: (index into ``measurers``) measured each kernel, by kernel name.
        self.ordinals = [getattr(m, "ordinal", i) for i, m in enumerate(measurers)]
        self.measured_by = [0] * len(measurers)
        self.measured_on: dict[str, int] = {}
        self._threads = [threading.Thread(target=self._drive, args=(i,), name=f"gemmscape-gpu{i}", daemon=True)
                         for i in range(len(measurers))]
        for t in self._threads:
            t.start()

    def _drive(self, i: int) -> None:
        m, inbox = self.measurers[i], self._inbox[i]
        while True:
            item = inbox.get() if len(m) == 0 else self._poll(inbox)
            if item is StopIteration:
                return
            if item is not None:
                m.submit(*item)
                continue
            try:
                done = m.next_done()
            except BaseException as e:  # handed to the runner, which stops (our bug) or is interrupted
                self._done.put((i, e))
                return
            self._done.put((i, done))

    @staticmethod
    def _poll(inbox: queue.Queue):
        try:
            return inbox.get_nowait()
        except queue.Empty:
            return None

    def source_hash(self, spec):
        return self.measurers[0].source_hash(spec)

    def baselines(self) -> dict:
        return self.measurers[0].baselines()

    def submit(self, tag: object, spec) -> None:
        with self._lock:
            i = min(range(len(self._load)), key=self._load.__getitem__)
            self._load[i] += 1
            self._count += 1
        self._inbox[i].put((tag, spec))

    def __len__(self) -> int:
        return self._count

    def next_done(self):
        i, done = self._done.get()
        with self._lock:
            self._load[i] -= 1
            self._count -= 1
        if isinstance(done, BaseException):
            raise done
        self.measured_by[i] += 1
        self.measured_on[done.spec.name] = i
        return done

    @property
    def gpu_wait_seconds(self) -> float:
        return sum(getattr(m, "gpu_wait_seconds", 0.0) for m in self.measurers)

    def worker_report(self) -> dict:
        """Who measured what: each worker's GPU ordinal and count, and the worker of each kernel."""
        return {"gpus": list(self.ordinals), "measured": list(self.measured_by), "kernels": dict(self.measured_on)}

    def close(self) -> None:
        for inbox in self._inbox:
            inbox.put(StopIteration)
        for m in self.measurers:
            m.close()
        for t in self._threads:
            t.join(5)


def gpu_measurer(problem, gpus: str | None = None, **kw):
    """What ``codegen search --gpus`` measures with: one ``GpuMeasurer`` (GPU 0, or the one
    ordinal given), or a ``ParallelMeasurer`` over one per GPU, the compile processes shared out
    among them. ``kw`` are GpuMeasurer's options. Raises NoGpu or ValueError saying what is wrong."""
    import os

    from search.measure import GpuMeasurer

    ordinals = gpu_ordinals(gpus) if gpus else [0]
    if len(ordinals) == 1:
        return GpuMeasurer(problem, ordinal=ordinals[0], **kw)
    kw.setdefault("compile_workers", max(1, ((os.cpu_count() or 2) - 1) // len(ordinals)))
    measurers = []
    try:
        for i in ordinals:
            measurers.append(GpuMeasurer(problem, ordinal=i, **kw))
        return ParallelMeasurer(measurers)
    except BaseException:
        for m in measurers:
            m.close()
        raise
