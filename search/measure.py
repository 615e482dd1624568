"""Where a search's measurements come from: the GPU (compiling ahead) or a recording (replay).

Both take specs with ``submit`` and hand back finished evaluations with ``next_done``, so the
runner never knows which it has. The GPU measurer builds candidates in a CPU process pool while
the worker measures, so the GPU does not wait for NVRTC. Both say which source a spec stands for
(``source_hash``), so a result measured with other source is never taken for this one.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from codegen.evaluate import Built, Evaluator, InternalError, blank_result, build
from codegen.problem import Problem
from codegen.render import render, source_hash
from codegen.spec import DeviceLimits, KernelSpec
from codegen.worker import NoGpu, require_gpu  # noqa: F401 - NoGpu: what a measurer raises without a GPU
from search.space import recorded_space
from store.records import recorded_device_name

REPLAY_FORMAT = "gemmscape-replay/1"


@dataclass
class Done:
    tag: object
    spec: KernelSpec
    result: dict
    kernel: dict  # kernel record for the store



class GpuMeasurer:
    """Compiles ahead in a process pool; measures one kernel at a time on the GPU worker."""

    def __init__(self, problem: Problem, arch: str | None = None, timeout_s: float = 30.0,
                 compile_timeout_s: float = 300.0, timing: dict | None = None, baseline: bool = True,
                 compile_workers: int | None = None, ordinal: int = 0) -> None:
        require_gpu()  # before the compile pool starts
        self.problem = problem
        self.ordinal = ordinal
        self.evaluator = Evaluator(arch=arch, timeout_s=timeout_s, baseline=baseline, ordinal=ordinal,
                                   **({"timing": timing} if timing else {}))
        self.device = self.evaluator.device()
        self.arch = self.evaluator.target_arch
        self.limits = self.evaluator.limits()
        self.compile_timeout_s = compile_timeout_s
        self.workers = compile_workers or max(1, (os.cpu_count() or 2) - 1)
        self.pool = self._new_pool()
        self.pending: deque[tuple[object, KernelSpec, cf.Future, float]] = deque()
        self.compile_seconds = 0.0
        self.gpu_wait_seconds = 0.0

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"), initializer=ignore_sigint)

    def switch(self, problem: Problem) -> None:
        """Measure ``problem`` from now on with the same GPU worker and compile processes (tuning a
        layer or a model searches many GEMMs, and starting a worker costs a short search much of its
        time). Builds still pending for the last problem (a search that stopped early) are dropped,
        and the time counters start again."""
        for _, _, future, _ in self.pending:
            future.cancel()
        self.pending.clear()
        self.problem = problem
        self.compile_seconds = self.gpu_wait_seconds = 0.0

    def baselines(self) -> dict:
        return self.evaluator.baselines(self.problem)

    def source_hash(self, spec: KernelSpec) -> str | None:
        """Hash of the source the templates give ``spec`` now (rendered here: cheap, no compile);
        None for a spec that cannot be rendered."""
        try:
            return source_hash(render(spec))
        except ValueError:
            return None

    def submit(self, tag: object, spec: KernelSpec) -> None:
        future = self.pool.submit(build, spec, self.problem, self.arch, self.limits)
        self.pending.append((tag, spec, future, time.monotonic()))

    def __len__(self) -> int:
        return len(self.pending)

    def next_done(self) -> Done:
        """Measure a candidate whose build has finished (the oldest such), waiting if none has."""
        waited = time.monotonic()
        built = None
        while built is None:
            ready = next((i for i, entry in enumerate(self.pending) if entry[2].done()), None)
            if ready is not None:
                tag, spec, future, _ = self.pending[ready]
                del self.pending[ready]
                try:
                    built = future.result()
                except BrokenProcessPool as e:  # a compiler process died (NVRTC crashed on a source)
                    self._restart_pool()
                    built = Built(spec, failure=blank_result("compile_error", f"compiler process died: {e!r}"))
                except Exception as e:  # render, plan or compile driver code raised: ours, not the kernel's
                    raise InternalError(f"building {spec.name} failed in gemmscape's own code: {e!r}") from e
                continue
            tag, spec, _, submitted = self.pending[0]
            remaining = submitted + self.compile_timeout_s - time.monotonic()
            if remaining <= 0:
                self.pending.popleft()
                self._restart_pool()
                built = Built(spec, failure=blank_result("compile_timeout", f"no cubin after {self.compile_timeout_s:.0f} s"))
                continue
            cf.wait([entry[2] for entry in self.pending], timeout=remaining, return_when=cf.FIRST_COMPLETED)
        self.gpu_wait_seconds += time.monotonic() - waited
        if built.compiled is not None:
            self.compile_seconds += built.compiled.seconds
        result = self.evaluator.run(built, self.problem)
        kernel = built.kernel_record()
        kernel.setdefault("arch", self.arch)  # a build that failed before compiling still names its target
        return Done(tag, spec, result, kernel)

    def _restart_pool(self) -> None:
        """Drop a stuck pool: resubmit what was still waiting to a fresh one."""
        old = self.pool
        for proc in list(getattr(old, "_processes", {}).values()):
            proc.kill()
        old.shutdown(wait=False, cancel_futures=True)
        self.pool = self._new_pool()
        waiting = list(self.pending)
        self.pending.clear()
        for tag, spec, _, submitted in waiting:
            self.pending.append((tag, spec, self.pool.submit(build, spec, self.problem, self.arch, self.limits), submitted))

    def close(self) -> None:
        """Stop the compiler processes (a build in progress is abandoned) and the GPU worker."""
        for proc in list((getattr(self.pool, "_processes", None) or {}).values()):
            if proc.is_alive():
                proc.kill()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pending.clear()
        self.evaluator.close()


def ignore_sigint() -> None:
    """Compiler processes leave Ctrl-C to the orchestrator, which ends them (no tracebacks)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class ReplayError(ValueError):
    """A replay file that cannot be used; the message names the file and says why."""


def _read_recording(path: Path) -> dict:
    """The recording's JSON, checked for the parts a replay needs (ReplayError otherwise)."""
    if not path.exists():
        raise ReplayError(f"no replay file {path}")
    if path.is_dir():
        raise ReplayError(f"{path} is a folder, not a replay file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ReplayError(f"cannot read replay file {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReplayError(f"{path} is not JSON ({e.msg} at line {e.lineno}); a replay file is written by "
                          f"`codegen sweep`") from None
    if not isinstance(data, dict) or data.get("format") != REPLAY_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ReplayError(f"{path} is not a gemmscape replay file (format {found!r}, expected {REPLAY_FORMAT!r})")
    missing = [k for k in ("recorded", "device", "problem", "space", "results") if not isinstance(data.get(k), dict)]
    missing += [f"recorded.{k}" for k in ("where", "when") if not (data.get("recorded") or {}).get(k)]
    if not (data.get("device") or {}).get("name"):
        missing.append("device.name")
    if missing:
        raise ReplayError(f"{path} is a damaged replay file: {', '.join(missing)} missing")
    return data


class ReplayMeasurer:
    """Answers from a recorded sweep; no GPU, no compiler.

    Its ``device`` is the recording's device under a name that says it is a recording (where,
    when and which file), so replayed trials stored by a search get a device row of their own,
    never the one of live measurements on that GPU (``store.records.is_recorded``).
    """

    def __init__(self, path: Path | str, problem: Problem | None = None) -> None:
        path = Path(path)
        data = _read_recording(path)
        self.path = path
        self.recorded = data["recorded"]
        try:
            self.problem = Problem.from_dict(data["problem"])
            # in the family's current dimensions (a recording may predate them)
            self.space = recorded_space(data["space"]["family"], data["space"]["dims"], data["results"], self.problem)
        except (KeyError, TypeError, ValueError) as e:
            raise ReplayError(f"{path} is a damaged replay file: its problem or space cannot be read ({e})") from None
        if problem is not None and problem != self.problem:
            raise ReplayError(f"{path} records {self.problem.key}, not {problem.key}")
        self.device = dict(data["device"])
        self.device["name"] = recorded_device_name(self.device["name"], str(self.recorded["when"]), path.name)
        self.arch = self.device.get("sm", "sm_90")
        base = DeviceLimits.for_arch(self.arch)
        self.limits = DeviceLimits(sm=base.sm, max_smem=self.device.get("max_smem_optin", base.max_smem))
        self.results: dict[str, dict] = data["results"]
        self._baselines = data.get("baselines", {})
        #: Whether every recorded result says which source was measured (older recordings do not).
        self.hashes_known = all(r.get("source_hash") for r in self.results.values())
        self.pending: deque[tuple[object, KernelSpec]] = deque()

    def baselines(self) -> dict:
        return self._baselines

    def source_hash(self, spec: KernelSpec) -> str | None:
        """The hash of the source the recording measured for ``spec`` (None: not recorded)."""
        return self.results.get(spec.name, {}).get("source_hash")

    def submit(self, tag: object, spec: KernelSpec) -> None:
        self.pending.append((tag, spec))

    def __len__(self) -> int:
        return len(self.pending)

    def next_done(self) -> Done:
        tag, spec = self.pending.popleft()
        result = dict(self.results.get(spec.name) or blank_result("invalid", "not in the recorded sweep"))
        kernel = {"name": spec.name, "family": spec.family, "spec": spec.to_dict(), "arch": self.arch}
        recorded_hash = result.pop("source_hash", None)
        if recorded_hash:
            kernel["source_hash"] = recorded_hash
            try:  # the templates still render what was measured: store that source with it
                source = render(spec)
            except ValueError:
                source = None
            if source is not None and source_hash(source) == recorded_hash:
                kernel["source"] = source
        return Done(tag, spec, dict(blank_result(result["status"], ""), **result), kernel)

    @property
    def best(self) -> dict | None:
        ok = [(n, r) for n, r in self.results.items() if r["status"] == "ok"]
        if not ok:
            return None
        name, r = min(ok, key=lambda nr: nr[1]["median_ms"])
        return {"kernel": name, **{k: v for k, v in r.items() if k != "source_hash"}}

    def close(self) -> None:
        pass
