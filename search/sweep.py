"""Exhaustive sweep of a (restricted) space on the GPU, written as a replay recording."""

from __future__ import annotations

import datetime as dt
import time

from tqdm import tqdm

from codegen.problem import Problem
from codegen.render import render, source_hash
from search.measure import REPLAY_FORMAT
from search.space import Space, recorded_space

KEPT = ("status", "evidence", "median_ms", "p20_ms", "p80_ms", "tflops", "gbps", "rel_error", "ratio")


def _same_space(recording: dict, problem: Problem, space: Space) -> bool:
    """Whether a recording to resume is of ``space``: the same dimensions and choices, or, for one
    written with the family's older dimensions, kernels that are all points of ``space`` (its
    kernels are all it says of the space in the current dimensions, and a partial one has few)."""
    try:
        rec = recording["space"]
        if set(rec["dims"]) == set(space.dims):
            return rec == space.to_dict()
        older = recorded_space(rec["family"], rec["dims"], recording.get("results") or {}, problem)
    except (KeyError, TypeError, ValueError):
        return False
    return older.family == space.family and all(set(v) <= set(space.dims[k]) for k, v in older.dims.items())


def sweep(problem: Problem, space: Space, measurer, *, store=None, lookahead: int = 16, progress: bool = True,
          command: str = "", space_name: str = "restricted", max_seconds: float | None = None,
          resume: dict | None = None) -> dict:
    """Measure every valid point once; return the replay document (results keyed by kernel name).
    With ``max_seconds`` no kernel is started after that long, and the document says it is partial.
    ``resume`` is an earlier partial recording of the same problem and space: its results whose
    source is still the one rendered now are kept, the rest measured, and the document says so."""
    if resume is not None and (resume.get("problem") != problem.to_dict() or not _same_space(resume, problem, space)):
        raise ValueError("the recording to resume is of another problem or space")
    specs = {}
    for point in space.points():
        spec = space.spec(point, problem)
        specs.setdefault(spec.name, spec)
    valid = [s for s in specs.values() if not s.check(problem, measurer.limits)]
    kept: dict[str, dict] = {}
    if resume is not None:
        now = {s.name: s for s in valid}
        kept = {n: r for n, r in resume["results"].items()
                if n in now and r.get("source_hash") == source_hash(render(now[n]))}
        valid = [s for s in valid if s.name not in kept]
    device_id = store.device(measurer.device) if store is not None else None
    run_id = None
    if store is not None:
        run_id = store.start_run(problem, device_id, space.family, "sweep", None, len(valid),
                                 f"sweep:{problem.key}:{space_name}", {}, command)
    results: dict[str, dict] = dict(kept)
    started = time.monotonic()
    todo = iter(valid)
    with tqdm(total=len(valid) + len(kept), initial=len(kept), desc=f"sweep {problem.key}", unit="kernel", disable=not progress) as bar:
        for spec in todo:
            measurer.submit(spec.name, spec)
            if len(measurer) >= lookahead:
                break
        while len(measurer):
            done = measurer.next_done()
            results[done.spec.name] = {k: done.result.get(k) for k in KEPT}
            results[done.spec.name]["evidence"] = (done.result.get("evidence") or "")[-300:]
            results[done.spec.name]["source_hash"] = done.kernel.get("source_hash")  # the source measured
            if store is not None:
                store.kernel(done.kernel)
                store.add_trial(run_id, done.spec.name, done.kernel.get("arch", measurer.arch), problem, device_id,
                                len(results) - len(kept) - 1, done.result, done.spec.to_dict(),
                                source_hash=done.kernel.get("source_hash"))
            bar.update(1)
            late = max_seconds is not None and time.monotonic() - started > max_seconds
            nxt = None if late else next(todo, None)
            if nxt is not None:
                measurer.submit(nxt.name, nxt)
    if store is not None and run_id is not None:
        store.end_run(run_id)
    device = measurer.device
    total = len(valid) + len(kept)
    whole = "every valid point" if len(results) == total else \
        f"PARTIAL (stopped after {max_seconds:.0f} s): {len(results)} of the {total} valid points"
    measured = len(results) - len(kept)
    doc = {
        "format": REPLAY_FORMAT,
        "recorded": {
            "where": f"{device.get('name')} ({device.get('sm')}, driver {device.get('driver')}, NVRTC {device.get('nvrtc')})",
            "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "how": command or "search.sweep.sweep",
            "what": f"{whole} of the {space_name} {space.family} space measured once "
                    f"({total} kernels of {len(specs)} distinct points); {measured} measured in this run, "
                    f"{time.monotonic() - started:.0f} s" + (f", {len(kept)} kept from the earlier run below" if resume else ""),
            "source_hashes": "each result's source_hash is the sha256 of the source rendered and measured in this sweep",
        },
        "device": device,
        "problem": problem.to_dict(),
        "space": space.to_dict(),
        "baselines": measurer.baselines(),
        "results": results,
    }
    if resume is not None:
        earlier = resume["recorded"]
        doc["recorded"]["resumed"] = {**{k: earlier.get(k) for k in ("where", "when", "how", "what")},
                                      "kept": len(kept), "baselines": resume.get("baselines", {}),
                                      "device": resume.get("device", {})}
    return doc
