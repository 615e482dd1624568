"""The larger narrowings that sweeps record (search/spaces/*.py NARROWINGS): each is a narrowing of its
family's full space, holds thousands of valid kernels for its intended problem (the issue of a replay
too easy to tell samplers apart), and spans the dimensions that matter."""

from __future__ import annotations

import pytest

from codegen.problem import DType, Problem
from codegen.render import render, source_hash
from codegen.spec import DeviceLimits
from search.space import narrowings, space_for


def valid_kernels(family: str, problem: Problem, name: str) -> dict:
    space = space_for(family, problem.dtype, restricted=name)
    specs = {}
    for point in space.points():
        spec = space.spec(point, problem)
        specs.setdefault(spec.name, spec)
    return {n: s for n, s in specs.items() if not s.check(problem, DeviceLimits())}


@pytest.mark.parametrize("family, problem, name, varied", [
    ("simt", Problem(32, 4096, 4096, DType.fp32), "skinny", ("copy", "stages", "split_k", "reduce")),  # Spec fields
    ("tensorcore", Problem(4096, 4096, 4096, DType.bf16), "large", ("stages", "split_k", "warps_k", "epilogue")),
])
def test_a_recorded_narrowing_holds_thousands_of_valid_kernels(family, problem, name, varied):
    assert name in narrowings(family)
    full = space_for(family, problem.dtype)
    narrow = space_for(family, problem.dtype, restricted=name)
    assert all(set(v) <= set(full.dims[k]) for k, v in narrow.dims.items())
    valid = valid_kernels(family, problem, name)
    assert 2000 <= len(valid) <= 4000, len(valid)  # enough to separate samplers, small enough to sweep in minutes
    for dim in varied:
        assert len({getattr(s, dim) for s in valid.values()}) > 1, dim


def test_an_unknown_narrowing_is_refused_by_name():
    with pytest.raises(ValueError, match="no narrowing 'huge'"):
        space_for("simt", DType.fp32, restricted="huge")
    assert space_for("simt", DType.fp32, restricted=True).dims == space_for("simt", DType.fp32, "restricted").dims


def test_a_sweep_replayed_from_a_recording_reproduces_it_and_a_deadline_marks_it_partial():
    from search.measure import ReplayMeasurer
    from search.sweep import sweep

    path = "search/recordings/replay-simt-4096x4096x4096-fp32.json"
    measurer = ReplayMeasurer(path)
    space = space_for("simt", DType.fp32, restricted=True)
    doc = sweep(measurer.problem, space, measurer, progress=False)
    assert set(doc["results"]) == set(measurer.results)
    assert all(doc["results"][n]["median_ms"] == r["median_ms"] for n, r in measurer.results.items())
    assert doc["recorded"]["what"].startswith("every valid point of the restricted simt space")
    partial = sweep(measurer.problem, space, ReplayMeasurer(path), progress=False, max_seconds=0.0)
    assert 0 < len(partial["results"]) < len(doc["results"])
    assert partial["recorded"]["what"].startswith(f"PARTIAL (stopped after 0 s): {len(partial['results'])} of the "
                                                  f"{len(doc['results'])} valid points")


def test_a_resumed_sweep_keeps_what_was_measured_and_measures_only_the_rest():
    from search.measure import ReplayMeasurer
    from search.sweep import sweep

    path = "search/recordings/replay-simt-4096x4096x4096-fp32.json"
    space = space_for("simt", DType.fp32, restricted=True)
    first = ReplayMeasurer(path)
    partial = sweep(first.problem, space, first, progress=False, max_seconds=0.0)
    # the recording's hashes are of the templates it was measured with: as if swept with today's
    specs = {s.name: s for s in map(lambda p: space.spec(p, first.problem), space.points())}
    for name, result in partial["results"].items():
        result["source_hash"] = source_hash(render(specs[name]))
    stale = next(iter(partial["results"]))
    partial["results"][stale] = dict(partial["results"][stale], source_hash="0" * 64, median_ms=-1.0)

    class Counting(ReplayMeasurer):
        asked: list = []

        def submit(self, tag, spec):
            self.asked.append(spec.name)
            super().submit(tag, spec)

    second = Counting(path)
    whole = sweep(second.problem, space, second, progress=False, resume=partial)
    assert set(whole["results"]) == set(second.results)
    assert all(whole["results"][n]["median_ms"] == r["median_ms"] for n, r in second.results.items())
    kept = len(partial["results"]) - 1  # the one whose source changed is measured again
    assert sorted(Counting.asked) == sorted(set(second.results) - set(partial["results"]) | {stale})
    assert whole["recorded"]["what"].startswith("every valid point")
    assert whole["recorded"]["resumed"]["kept"] == kept
    assert whole["recorded"]["resumed"]["what"].startswith("PARTIAL")
    with pytest.raises(ValueError, match="another problem or space"):
        sweep(second.problem, space_for("simt", DType.fp32), Counting(path), progress=False, resume=partial)
    # a partial recording written before copy/stages and split_k/reduce were tied dimensions resumes too
    import json
    from pathlib import Path

    older = dict(partial, space=json.loads(Path(path).read_text())["space"])
    assert "stages" in older["space"]["dims"] and "pipeline" not in older["space"]["dims"]
    again = sweep(second.problem, space, Counting(path), progress=False, resume=older)
    assert again["recorded"]["resumed"]["kept"] == kept and set(again["results"]) == set(second.results)
    with pytest.raises(ValueError, match="another problem or space"):  # its kernels are not all points of this one
        sweep(second.problem, space.restrict(bm=(256,)), Counting(path), progress=False, resume=older)
