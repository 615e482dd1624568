"""One GPU worker process per device, and the orchestrator's handle on it.

The orchestrator never initializes CUDA: it sends plain dicts over a pipe to a spawned process.
A fault that poisons the context ends the worker after it reports; a hang is cut off by a
timeout and the process is killed. Either way the next request starts a fresh worker.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import time
import traceback

READY_TIMEOUT_S = 120.0


def reply_for(e: BaseException) -> dict:
    """The reply for an exception that ended a request. A CUDA error is the kernel's (or the
    device's) doing: a status. Anything else is a bug in gemmscape's worker code: it is reported
    as one (``bug``: the traceback), and the orchestrator stops instead of storing a status."""
    from codegen.cuda import CudaError
    from codegen.engine import Failure

    if isinstance(e, Failure):
        return {"status": e.status, "evidence": e.evidence, "restart": e.restart}
    trace = "".join(traceback.format_exception(e))[-4000:]
    if isinstance(e, CudaError):
        return {"status": "context_lost" if e.sticky else "runtime_error", "evidence": trace[-2000:], "restart": True}
    return {"status": "worker_crash", "evidence": trace[-2000:], "bug": trace, "restart": True}


def process_name(ordinal: int) -> str:
    """The name the worker of GPU ``ordinal`` gives itself in the OS (``/proc/PID/comm``, what
    ``pgrep -x`` and ``ps -o comm`` show), so that it can be told from the compile processes."""
    return f"gemmscape-gpu{ordinal}"[:15]


def name_this_process(name: str) -> None:
    """Set this process's OS name (Linux ``prctl(PR_SET_NAME)``; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _serve(conn, ordinal: int) -> None:
    """Worker process body. Ctrl-C reaches the whole process group: the orchestrator decides,
    so the worker ignores SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    name_this_process(process_name(ordinal))
    try:
        from codegen.engine import Engine
        from codegen.problem import Problem

        engine = Engine(ordinal)
    except Exception as e:  # no driver, no device, bad install
        conn.send({"fatal": f"{type(e).__name__}: {e}"})
        return
    conn.send({"ready": engine.ctx.info.to_dict()})
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        op = msg.get("op")
        if op == "stop":
            return
        try:
            if op == "prepare":
                reply = {"baselines": engine.prepare(Problem.from_dict(msg["problem"]), msg["baseline"], msg["timing"],
                                                      msg.get("patterns"))}
            elif op == "evaluate":
                reply = engine.evaluate(msg)
            else:
                raise ValueError(f"unknown request {op!r}")
        except Exception as e:
            reply = reply_for(e)
        conn.send(reply)
        if reply.get("restart"):
            os._exit(3)  # the context may be poisoned: never reuse it


class WorkerUnavailable(RuntimeError):
    """The worker could not start (no GPU, no driver)."""


class NoGpu(WorkerUnavailable):
    """No GPU to run kernels on (``why_no_gpu``): the message says what is missing."""


def why_no_gpu() -> str | None:
    """None when nvidia-smi lists a GPU (or, without nvidia-smi, the driver library is there), else
    the reason; asked of nvidia-smi, so no CUDA is initialized here (and no driver library is
    loaded where there is none)."""
    smi = shutil.which("nvidia-smi")
    if not smi:  # some containers carry the driver library without the tool: then the worker finds out
        import ctypes.util

        return None if ctypes.util.find_library("cuda") else "no NVIDIA driver here (nvidia-smi not found)"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi failed: {e}"
    if out.returncode != 0 or "GPU" not in out.stdout:
        return "nvidia-smi lists no GPU"
    return None


def require_gpu() -> None:
    """Raise NoGpu saying what is missing unless nvidia-smi lists a GPU: what every user of the GPU
    (the worker's first start, a search's measurer, the commands that measure) asks first."""
    reason = why_no_gpu()
    if reason:
        raise NoGpu(reason)


class GpuWorker:
    """Handle on the worker process of one GPU; restarts it whenever it dies or hangs."""

    def __init__(self, ordinal: int = 0) -> None:
        self.ordinal = ordinal
        self.proc = None
        self.conn = None
        self.info: dict | None = None
        self.starts = 0  # a new number means a fresh process with empty caches

    def start(self) -> dict:
        if not self.starts:  # the first start: no GPU at all is said so, before a process is spawned
            require_gpu()
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, self.ordinal), daemon=True, name=process_name(self.ordinal))
        self.proc.start()
        child.close()
        self.conn = parent
        if not parent.poll(READY_TIMEOUT_S):
            self.kill()
            raise WorkerUnavailable(f"GPU worker {self.ordinal} did not start within {READY_TIMEOUT_S:.0f} s")
        try:
            hello = parent.recv()
        except EOFError:
            code = self.proc.exitcode
            self.kill()
            raise WorkerUnavailable(f"GPU worker {self.ordinal} died while starting (exit code {code})") from None
        if "fatal" in hello:
            self.kill()
            raise WorkerUnavailable(f"GPU worker {self.ordinal} could not use the GPU: {hello['fatal']}")
        self.info = hello["ready"]
        self.starts += 1
        return self.info

    def ensure(self) -> None:
        """Start the worker if it is not running (again after a kill)."""
        if not self.alive:
            self.kill()
            self.start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(10)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    def stop(self) -> None:
        if self.alive:
            try:
                self.conn.send({"op": "stop"})
                self.proc.join(5)
            except (OSError, BrokenPipeError):
                pass
        self.kill()

    def request(self, msg: dict, timeout: float) -> dict:
        """Send one request; any way it can end comes back as a dict with a status."""
        self.ensure()
        started = time.monotonic()
        try:
            self.conn.send(msg)
        except (OSError, BrokenPipeError) as e:
            self.kill()
            return {"status": "worker_crash", "evidence": f"could not reach the worker: {e}"}
        if not self.conn.poll(timeout):
            self.kill()
            return {"status": "timeout", "evidence": f"no answer within {timeout:.1f} s; worker killed"}
        try:
            reply = self.conn.recv()
        except EOFError:
            self.proc.join(5)
            code = self.proc.exitcode
            self.kill()
            return {"status": "worker_crash", "evidence": f"worker exited with code {code} after {time.monotonic() - started:.1f} s"}
        if reply.get("restart"):
            self.kill()
        return reply

    def __enter__(self) -> GpuWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
