"""A plan of ``codegen search`` processes run in order under a deadline, resumable across device calls.

Each step is one real command line with its own store file. ``run_steps`` records every run of a step
in ``DIR/steps.jsonl`` (its command, exit code, wall time, the ``--json`` summary it printed, the tail of
its stderr); a step that ended (exit 0) is not run again, so a plan carried from one device call to the
next goes on where it stopped. At the deadline the running search gets SIGTERM: it stores what it
measured and marks its run ended, and resumes next time.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["EXIT_INTERRUPTED", "Planned", "load_steps", "run_steps"]

#: What a search interrupted by SIGTERM exits with (and run_steps, when the deadline stops the plan).
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Planned:
    """One step: its name, its command line (after the Python executable) and what it records besides."""

    name: str
    args: tuple[str, ...]
    fields: dict


def load_steps(d: Path) -> list[dict]:
    path = d / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _communicate(proc: subprocess.Popen, deadline: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the search stores what it measured and marks its run ended
        try:
            return proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.communicate()


def run_steps(d: Path, plan: list[Planned], deadline_s: float, tag: str, before=None) -> int:
    """Run the steps of ``plan`` not yet ended, in order, until ``deadline_s`` seconds have passed:
    0 when all have ended, EXIT_INTERRUPTED when the deadline stopped the plan, else the failing
    step's exit code. ``before(step)`` runs before each step is started (e.g. to copy a store)."""
    d.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + deadline_s
    done = {s["step"] for s in load_steps(d) if s["rc"] == 0}
    for step in plan:
        if step.name in done:
            continue
        left = deadline - time.monotonic()
        if left < 20:
            print(f"{tag}: deadline: {step.name} and what follows wait for the next run", flush=True)
            return EXIT_INTERRUPTED
        if before is not None:
            before(step)
        cmd = [sys.executable, *step.args]
        print(f"{tag}: {step.name}: {' '.join(step.args)} ({left:.0f} s left)", flush=True)
        started = datetime.now(UTC).isoformat(timespec="seconds")
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = _communicate(proc, deadline)
        wall = time.monotonic() - t0
        summary = next((json.loads(line) for line in out.splitlines() if line.startswith("{")), None)
        record = {"step": step.name, **step.fields, "rc": proc.returncode, "started": started,
                  "wall_s": round(wall, 2), "command": " ".join(["python3", *step.args]), "summary": summary,
                  "stderr_tail": err[-3000:]}
        with (d / "steps.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"{tag}: {step.name}: rc {proc.returncode} in {wall:.0f} s; "
              + (err.strip().splitlines() or [""])[-1][:300], flush=True)
        if proc.returncode not in (0, EXIT_INTERRUPTED):
            print(err[-2000:], file=sys.stderr)
            return proc.returncode or 1
        if proc.returncode == EXIT_INTERRUPTED:
            return EXIT_INTERRUPTED
    return 0
