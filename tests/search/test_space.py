"""Rules built into the spaces' dimensions (search/space.py, search/spaces/*.py): a sampler cannot
propose a copy mode with stages it does not allow, a reduction without split-K, or atomics into a
16-bit output; points and specs map onto each other exactly; recordings written with the older
dimensions replay the same kernels."""

from __future__ import annotations

import random

import pytest

from codegen.problem import DType, Problem
from codegen.spec import DeviceLimits
from search.measure import ReplayMeasurer
from search.space import point_of, recorded_space, space_for, split_of, split_value
from search.spaces import simt

RECORDINGS = ("search/recordings/replay-simt-4096x4096x4096-fp32.json",
              "search/recordings/replay-simt-skinny-32x4096x4096-fp32.json",
              "search/recordings/replay-tensorcore-large-4096x4096x4096-bf16.json")
RULES = ("stages must be", "reduce is 'none' exactly", "atomic split-K")


def test_split_and_pipeline_choices_read_back():
    assert [split_of(v) for v in ("k1", "k4a", "k16r")] == [(1, "none"), (4, "atomic"), (16, "two_pass")]
    assert [split_value(*split_of(v)) for v in ("k1", "k4a", "k16r")] == ["k1", "k4a", "k16r"]
    assert [simt.pipeline_of(v) for v in simt.PIPELINES] == [(1, "reg"), (2, "reg"), (2, "async"), (3, "async"),
                                                            (4, "async")]
    for bad in ("k4", "k4x", "4a", "kxa"):
        with pytest.raises(ValueError, match="not a split choice"):
            split_of(bad)
    with pytest.raises(ValueError, match="not a pipeline choice"):
        simt.pipeline_of("3c")


@pytest.mark.parametrize("family, dtype", [("simt", DType.fp32), ("simt", DType.bf16), ("tensorcore", DType.bf16),
                                           ("tensorcore", DType.tf32)])
def test_no_point_breaks_a_rule_built_into_the_dimensions(family, dtype):
    """Every combination of the tied dimensions passes the rules they carry, and points and specs
    map onto each other both ways."""
    problem = Problem(256, 512, 1024, dtype)
    space = space_for(family, dtype)
    rng = random.Random(0)
    for _ in range(300):
        point = {k: rng.choice(v) for k, v in space.dims.items()}
        spec = space.spec(point, problem)
        assert not [w for w in spec.check(problem, DeviceLimits()) if w.startswith(RULES)], (point, spec.check(problem))
        assert space.spec(point_of(spec), problem) == spec
        if family == "simt":  # the tensor-core space still derives some choices (wmma, slice-K)
            assert point_of(spec) == point


@pytest.mark.parametrize("path", RECORDINGS)
def test_a_recording_in_older_dimensions_replays_the_same_kernels(path):
    m = ReplayMeasurer(path)
    assert set(m.space.dims) == set(space_for(m.space.family, m.problem.dtype).dims)
    names = set()
    for point in m.space.points():
        spec = m.space.spec(point, m.problem)
        if not spec.check(m.problem, m.limits):
            names.add(spec.name)
    assert names == set(m.results)  # every recorded kernel reachable, and nothing unrecorded valid
    # a recording already in the current dimensions is read as it is
    again = recorded_space(m.space.family, m.space.to_dict()["dims"], m.results, m.problem)
    assert again == m.space and again.dims == m.space.dims


def test_more_uniform_points_of_the_simt_space_are_valid_than_before_the_tied_dimensions():
    from benchmarks.valid_share import valid_share

    share, reasons = valid_share("simt", Problem(4096, 4096, 4096, DType.fp32), 2000)
    assert share > 0.17  # 13.5% with copy, stages, split_k and reduce sampled apart (20000 draws); 21.2% now
    assert not [w for w in reasons if w.startswith(RULES)]


def test_a_block_sparse_hopper_grid_is_one_dimension_the_rules_accept():
    """hopper's ``grid`` (plain, ranges, grouped) over a block-sparse W: every choice gives a spec the
    grouped rule accepts (grouped order only on a persistent grid), and points and specs map both ways."""
    from codegen import sparse

    problem = sparse.problem_for(256, sparse.Pattern.random(512, 1024, 64, 0.25, seed=1), DType.bf16)
    space = space_for("hopper", DType.bf16, block=64)
    assert space.dims["grid"] == ("plain", "ranges", "grouped") and "persistent" not in space.dims
    rng = random.Random(0)
    seen = set()
    for _ in range(200):
        point = {k: rng.choice(v) for k, v in space.dims.items()}
        spec = space.spec(point, problem)
        assert spec.persistent == (point["grid"] != "plain") and spec.grouped == (point["grid"] == "grouped")
        assert not [w for w in spec.check(problem, DeviceLimits()) if "grouped" in w], (point, spec.check(problem))
        assert point_of(spec) == point
        seen.add(point["grid"])
    assert seen == {"plain", "ranges", "grouped"}
