"""A search run among others on one store: its heartbeat, Ctrl-C and SIGTERM, and the claims
that keep two processes from measuring one kernel.

Several processes may run one study (or overlapping ones) against one database. Each kernel is
claimed in the store before it is measured (``store.coord``), so none is measured twice for a
problem and device, and the budget is counted from the store, so together they spend no more
than it. A kernel another process is measuring is waited for and its result reused, or its claim
taken over if that process gives it up. A run tells the store it is alive every
``store.coord.HEARTBEAT_S``; a run that stopped beating is reaped (marked ended, its claims
released) by the next run that looks.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["Claims", "Heartbeat", "restore_sigterm", "sigterm_as_interrupt"]

#: Seconds between two reaps of dead runs while this run waits for another's measurement.
REAP_EVERY_S = 5.0


class Heartbeat:
    """Tells the store every HEARTBEAT_S that this run's process is alive (a daemon thread)."""

    def __init__(self, store, run_id: int | None) -> None:
        self._stop = threading.Event()
        self._thread = None
        if store is None or run_id is None:
            return
        from store.coord import HEARTBEAT_S

        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_S):
                try:
                    store.heartbeat(run_id)
                except Exception:  # a missed beat is not worth stopping the search for
                    pass

        self._thread = threading.Thread(target=beat, name="gemmscape-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def sigterm_as_interrupt():
    """SIGTERM ends a search as Ctrl-C does (main thread only); returns what to restore."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)


def restore_sigterm(old) -> None:
    if old is not None:
        signal.signal(signal.SIGTERM, old)


class Claims:
    """This run's claims in the store, and the kernels it waits for because another run holds
    them. ``timer`` is the run's ``search.summary.Timer``: store calls count as store time."""

    def __init__(self, store, run_id: int | None, problem, device_id: int | None, arch: str, study: str,
                 budget: int, timer: Callable) -> None:
        self.store, self.run_id, self.problem, self.device_id = store, run_id, problem, device_id
        self.arch, self.study, self.budget, self.timer = arch, study, budget, timer
        self.claimed: set[str] = set()  # kernels in flight under a claim (counted by the store's budget)
        self.waiting: dict[str, tuple[object, str, object]] = {}  # kernel -> (trial, source, spec)
        self.last_reap = time.monotonic()

    def claim(self, name: str, source: str) -> str:
        """Claim kernel ``name`` (of source ``source``): "budget" when the study's budget is spent,
        "taken" when another run holds it, else it is ours."""
        with self.timer("store"):
            got = self.store.claim(self.run_id, self.problem, self.device_id, name, self.arch, source,
                                   study=self.study, budget=self.budget)
        if got not in ("budget", "taken"):
            self.claimed.add(name)
        return got

    def release(self, name: str) -> None:
        """Kernel ``name`` was measured: its claim is spent."""
        self.claimed.discard(name)

    def known(self, name: str, source: str) -> tuple[str, float] | None:
        """The stored (status, TFLOP/s) of kernel ``name`` measured with ``source`` on this problem
        and device, by any run; None when nothing is stored yet."""
        with self.timer("store"):
            stored = self.store.known_result(self.problem, self.device_id, name, source)
        if stored is None:
            return None
        return stored["status"], stored["tflops"] or 0.0

    def room(self, in_flight) -> bool:
        """Whether the store's count (every process, and our measurements in ``in_flight`` that
        hold no claim) allows one more measurement that takes no claim."""
        unclaimed = sum(1 for name in in_flight if name not in self.claimed)
        with self.timer("store"):
            return self.store.used_budget(self.study) + unclaimed < self.budget

    def wait_for(self, name: str, trial, source: str, spec) -> None:
        """Another run measures kernel ``name``: wait for its result."""
        self.waiting[name] = (trial, source, spec)

    def poll(self) -> Iterator[tuple[str, object, str, object, str, tuple[str, float] | None]]:
        """The kernels waited for that are settled, as (name, trial, source, spec, outcome, known):
        outcome "known" (another run stored its result, ``known``), "budget" (its claim was given
        up but the budget is spent) or "mine" (its claim was given up and is now ours)."""
        if time.monotonic() - self.last_reap > REAP_EVERY_S:
            with self.timer("store"):
                self.store.reap_dead_runs()
            self.last_reap = time.monotonic()
        for name, (trial, source, spec) in list(self.waiting.items()):
            known = self.known(name, source)
            if known is None:
                got = self.claim(name, source)
                if got == "taken":
                    continue
                del self.waiting[name]
                yield name, trial, source, spec, ("budget" if got == "budget" else "mine"), None
                continue
            del self.waiting[name]
            yield name, trial, source, spec, "known", known
