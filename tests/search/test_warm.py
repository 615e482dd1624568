"""Warm start (search.warm): a new search first tries the best stored kernels of the nearest problems.

Stores are built through the store's own API (ok trials of chosen kernels on chosen problems and
devices), or by replaying search/recordings/replay-simt-4096x4096x4096-fp32.json (recorded on the
H200, see tests/search/test_replay.py). The command-line tests replay that recording.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from codegen.problem import DType, Problem
from codegen.spec import DeviceLimits
from search import DEFAULT_SAMPLER, warm
from search.measure import ReplayMeasurer
from search.space import point_of, seeds, space_for
from store import Store
from tests.test_cli_errors import run

RECORDING = Path(__file__).resolve().parents[2] / "search" / "recordings" / "replay-simt-4096x4096x4096-fp32.json"
BIG = ["--m", "4096", "--n", "4096", "--k", "4096"]
H200 = {"name": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "nvrtc": "13.0"}
A100 = {"name": "NVIDIA A100-SXM4-80GB", "sm": "sm_80", "driver": "580.159.04", "nvrtc": "13.0"}
RECORDED_H200 = {**H200, "name": "NVIDIA H200 (recorded 2026-11-30, replay-simt-4096x4096x4096-fp32.json)"}

#: Tiles of the SIMT space valid for every problem used here (split_k 1), by name in the tests.
TILES = {
    "square": dict(bm=128, bn=128, bk=16, tm=8, tn=8, lanes_m=4, pad=4, vec=4, pipeline="s2", group_m=8,
                   split="k1"),
    "wide": dict(bm=64, bn=128, bk=16, tm=8, tn=8, lanes_m=2, pad=4, vec=4, pipeline="s2", group_m=1,
                 split="k1"),
    "tall": dict(bm=128, bn=64, bk=32, tm=8, tn=4, lanes_m=4, pad=0, vec=4, pipeline="s2", group_m=8,
                 split="k1"),
    "small": dict(bm=64, bn=64, bk=8, tm=4, tn=4, lanes_m=4, pad=4, vec=4, pipeline="s2", group_m=1,
                  split="k1"),
    "async": dict(bm=128, bn=128, bk=32, tm=8, tn=8, lanes_m=4, pad=4, vec=4, pipeline="s2c", group_m=8,
                  split="k1"),
    "splitk": dict(bm=32, bn=128, bk=32, tm=4, tn=8, lanes_m=4, pad=4, vec=4, pipeline="s3c", group_m=1,
                   split="k8a"),
}


def spec_of(tile: str, problem: Problem, family: str = "simt", point: dict | None = None):
    return space_for(family, problem.dtype, block=problem.block).spec(point or TILES[tile], problem)


def add_ok(store: Store, problem: Problem, device: dict, tile: str | dict, tflops: float, family: str = "simt",
           ratio: float | None = None) -> str:
    """An ok trial of a tile on a problem and device at ``tflops``; returns the kernel's name."""
    spec = spec_of(tile, problem, family) if isinstance(tile, str) else spec_of("", problem, family, point=tile)
    assert not spec.check(problem), spec.check(problem)
    ms = problem.flops / tflops / 1e9
    result = {"status": "ok", "evidence": "", "median_ms": ms, "p20_ms": ms, "p80_ms": ms, "times_ms": [ms],
              "tflops": tflops, "gbps": 1.0, "rel_error": 1e-7, "baselines": {},
              "ratio": {"cublas": ratio} if ratio else {}}
    store.add_trial(None, spec.name, device["sm"], problem, store.device(device), None, result, spec.to_dict(),
                    source_hash=f"hash-{spec.name}")
    return spec.name


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'warm.db'}")
    yield s
    s.close()


def full(problem: Problem):
    return space_for("simt", problem.dtype, block=problem.block)


# ---- distance ------------------------------------------------------------------------------------
def test_distance_is_over_log_shapes():
    a = Problem(4096, 4096, 4096)
    assert warm.distance(a, Problem(2048, 4096, 4096)) == pytest.approx(math.log(2))
    assert warm.distance(a, Problem(2048, 2048, 2048)) == pytest.approx(math.log(2) * math.sqrt(3))
    # scale-free: halving every side is as far at 64 as at 4096, and it is symmetric
    assert warm.distance(Problem(64, 64, 64), Problem(128, 128, 128)) == pytest.approx(warm.distance(
        Problem(4096, 4096, 4096), Problem(2048, 2048, 2048)))
    assert warm.distance(Problem(32, 4096, 1024), a) == pytest.approx(warm.distance(a, Problem(32, 4096, 1024)))
    # bias and dtype are not part of the shape
    assert warm.distance(a, Problem(4096, 4096, 4096, DType.bf16, bias=True)) == 0


def test_distance_of_block_sparse_problems_takes_the_density():
    from codegen.sparse import Pattern, problem_for

    p1 = problem_for(256, Pattern.random(1024, 1024, 32, 0.1, 0))
    p2 = problem_for(256, Pattern.random(1024, 1024, 32, 0.4, 0))
    assert warm.distance(p1, p2) == pytest.approx(math.log(p2.density / p1.density))
    empty = {"m": 256, "n": 1024, "k": 1024, "block": 32, "density": 0.0}
    assert math.isfinite(warm.distance(p1, empty))


# ---- which stored kernels ------------------------------------------------------------------------------
def test_the_nearest_problems_in_log_space_come_first(store):
    # 3000 is nearer 4096 than 2048 in log space (ratio 1.37 against 1.46), the other way round linearly
    new = Problem(3000, 3000, 3000)
    best = {}
    for side, tile in ((4096, "square"), (2048, "wide"), (1024, "tall"), (512, "small")):
        p = Problem(side, side, side)
        best[side] = add_ok(store, p, H200, tile, 40.0)
        for other in ("square", "wide", "tall", "small"):
            if other != tile:
                add_ok(store, p, H200, other, 10.0)
    got = warm.warm_seeds(store, new, full(new), H200, problems=3, per_problem=1)
    history = [s for s in got.seeds if s.origin == "history"]
    assert [s.problem for s in history] == ["4096x4096x4096_fp32_forward", "2048x2048x2048_fp32_forward",
                                            "1024x1024x1024_fp32_forward"]
    assert [s.measured for s in history] == [best[4096], best[2048], best[1024]]  # each one's fastest
    assert [s.distance for s in history] == sorted(s.distance for s in history)
    assert history[0].tflops == pytest.approx(40.0) and got.source == "history"
    # every seed is a point of the space giving that kernel for the new problem
    for s in got.seeds:
        assert full(new).spec(s.point, new).name == s.kernel


def test_top_kernels_per_problem_distinct_and_capped(store):
    new = Problem(4096, 4096, 2048)
    p = Problem(4096, 4096, 4096)
    names = [add_ok(store, p, H200, tile, rate) for tile, rate in (("square", 40), ("wide", 30), ("tall", 20))]
    add_ok(store, p, RECORDED_H200, "square", 39)  # the same kernel on a second device of that GPU: once
    got = warm.warm_seeds(store, new, full(new), H200, per_problem=2)
    history = [s.measured for s in got.seeds if s.origin == "history"]
    assert history == names[:2]
    assert len({s.kernel for s in got.seeds}) == len(got.seeds)
    capped = warm.warm_seeds(store, new, full(new), H200, k=1)
    assert [s.measured for s in capped.seeds] == names[:1]
    # places left are filled with built-in seeds, never the same kernel twice
    builtin = [s for s in got.seeds if s.origin == "built-in"]
    assert builtin and all(s.kernel not in names for s in builtin)


def test_other_family_dtype_device_and_w_are_never_used(store):
    from codegen.sparse import Pattern, problem_for

    new = Problem(1024, 1024, 1024, DType.bf16)
    same_shape = dict(m=1024, n=1024, k=1024)
    fp16 = Problem(**same_shape, dtype=DType.fp16)
    add_ok(store, fp16, H200, "square", 99.0)  # other dtype
    add_ok(store, new, A100, "square", 99.0)  # other GPU
    tc = space_for("tensorcore", DType.bf16).spec(seeds("tensorcore")[0], new)
    add_ok(store, new, H200, point_of(tc), 99.0, family="tensorcore")  # other family
    sparse = problem_for(1024, Pattern.random(1024, 1024, 32, 0.5, 0), DType.bf16)
    add_ok(store, sparse, H200, "small", 99.0)  # a block-sparse W
    far = Problem(64, 8192, 8192, DType.bf16)
    used = add_ok(store, far, H200, "wide", 5.0)  # the only one that may be used
    got = warm.warm_seeds(store, new, full(new), H200)
    history = [s for s in got.seeds if s.origin == "history"]
    assert [(s.problem, s.measured) for s in history] == [(far.key, used)]
    assert all(s.kernel.startswith("simt_bf16") for s in got.seeds)


def test_block_sparse_seeds_come_from_the_same_block_only(store):
    from codegen.sparse import Pattern, problem_for

    new = problem_for(512, Pattern.random(2048, 2048, 32, 0.2, 3))
    same = problem_for(256, Pattern.random(2048, 2048, 32, 0.1, 1))
    other = problem_for(512, Pattern.random(2048, 2048, 64, 0.2, 1))  # same shape and density, block 64
    add_ok(store, Problem(512, 2048, 2048), H200, "square", 50.0)  # dense, same shape
    sparse_tile = dict(TILES["small"], bn=64)
    add_ok(store, other, H200, sparse_tile, 50.0)
    kept = add_ok(store, same, H200, dict(TILES["async"], bn=32, bk=16, tn=4, lanes_m=8), 10.0)
    got = warm.warm_seeds(store, new, full(new), H200)
    history = [s for s in got.seeds if s.origin == "history"]
    assert [s.measured for s in history] == [kept]
    assert history[0].distance == pytest.approx(math.hypot(math.log(2), math.log(new.density / same.density)), abs=1e-4)
    for s in got.seeds:
        spec = full(new).spec(s.point, new)
        assert spec.block == 32 and not spec.check(new)


def test_a_recorded_gpu_counts_as_that_gpu(store):
    new = Problem(2048, 2048, 2048)
    kernel = add_ok(store, Problem(4096, 4096, 4096), RECORDED_H200, "square", 45.0)
    assert [s.measured for s in warm.warm_seeds(store, new, full(new), H200).seeds if s.origin == "history"] == [kernel]
    assert not [s for s in warm.warm_seeds(store, new, full(new), A100).seeds if s.origin == "history"]


def test_the_problem_itself_comes_first_then_the_same_bias(store):
    new = Problem(4096, 4096, 4096, bias=True)
    own = add_ok(store, new, H200, "wide", 20.0)
    nobias = add_ok(store, Problem(4096, 4096, 4096), H200, "tall", 45.0)
    add_ok(store, Problem(2048, 2048, 2048, bias=True), H200, "small", 45.0)
    got = warm.warm_seeds(store, new, full(new), H200, per_problem=1)
    history = [s for s in got.seeds if s.origin == "history"]
    assert [s.measured for s in history][:2] == [own, nobias]
    assert history[0].distance == history[1].distance == 0
    # a kernel measured without bias is tried as its variant with bias
    seed = history[1]
    assert "_nobias_" in seed.measured and seed.kernel == seed.measured.replace("_nobias_", "_bias_")
    assert full(new).spec(seed.point, new).bias is True
    assert "measured as" in seed.describe()


def test_kernels_invalid_for_the_new_problem_or_outside_the_space_are_dropped(store):
    big = Problem(4096, 4096, 4096)
    splitk = add_ok(store, big, H200, "splitk", 50.0)  # 8 splits: K=64 has 2 k-tiles of 32
    asynchronous = add_ok(store, big, H200, "async", 45.0)  # the recording's space has register copies only
    plain = add_ok(store, big, H200, "square", 40.0)
    small_k = Problem(4096, 4096, 64)
    got = warm.warm_seeds(store, small_k, full(small_k), H200)
    assert splitk not in {s.measured for s in got.seeds}
    assert any(d["kernel"] == splitk and "split_k 8 >" in d["why"] for d in got.dropped), got.dropped
    assert [s.measured for s in got.seeds if s.origin == "history"] == [asynchronous, plain]
    for s in got.seeds:
        assert not full(small_k).spec(s.point, small_k).check(small_k)


    replay = ReplayMeasurer(RECORDING)
    got = warm.warm_seeds(store, big, replay.space, H200, limits=replay.limits)
    history = [s.measured for s in got.seeds if s.origin == "history"]
    assert history == [plain], got.dropped
    why = {d["kernel"]: d["why"] for d in got.dropped}
    assert "not one of" in why[splitk]
    assert "pipeline='s2c' is not one of ['s2']" in why[asynchronous]  # recorded before copy was a dimension


def test_the_device_limits_decide_validity(store):
    p = Problem(4096, 4096, 4096)
    tile = dict(bm=128, bn=32, bk=64, tm=4, tn=2, lanes_m=4, pad=4, vec=4, pipeline="s4c", group_m=8,
                split="k1")  # 174080 B of shared memory
    sm80 = DeviceLimits.for_arch("sm_80")
    spec = spec_of("", p, point=tile)
    assert not spec.check(p) and spec.check(p, sm80)  # fits the H200's 227 KB, not the A100's 163 KB
    kernel = add_ok(store, p, H200, tile, 40.0)
    assert [s.measured for s in warm.warm_seeds(store, p, full(p), H200).seeds][:1] == [kernel]
    got = warm.warm_seeds(store, p, full(p), H200, limits=sm80)
    assert kernel not in {s.measured for s in got.seeds}
    assert any("shared memory" in d["why"] for d in got.dropped if d["kernel"] == kernel)


def test_an_empty_store_falls_back_to_the_built_in_seeds(store):
    p = Problem(4096, 4096, 4096)
    got = warm.warm_seeds(store, p, full(p), H200)
    assert got.source == "built-in" and "nothing stored" in got.note and "built-in" in got.note
    assert got.points == seeds("simt")  # both are points of the full space, valid at 4096^3
    assert all(s.origin == "built-in" and s.problem is None for s in got.seeds)
    no_store = warm.warm_seeds(None, p, full(p), H200)
    assert no_store.points == got.points and "no store" in no_store.note
    # only other GPUs stored: the same
    add_ok(store, p, A100, "square", 20.0)
    assert warm.warm_seeds(store, p, full(p), H200).points == seeds("simt")


def test_sparse_fallback_takes_the_sparse_seeds(store):
    from codegen.sparse import Pattern, problem_for

    p = problem_for(4096, Pattern.random(4096, 4096, 64, 0.25, 0))
    got = warm.warm_seeds(store, p, full(p), H200)
    assert got.seeds and all(s.origin == "built-in" for s in got.seeds)
    assert {s.kernel for s in got.seeds} <= {full(p).spec(pt, p).name for pt in seeds("simt", block=64)}


def test_replayed_searches_warm_a_search_of_another_shape(tmp_path):
    """A store filled by a replay search (4096^3) seeds a search of 2048x4096x4096 on the same GPU
    with the replay's fastest kernels."""
    from search.runner import run_search

    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    m = ReplayMeasurer(RECORDING)
    summary = run_search(m.problem, m.space, m, sampler="random", seed=0, budget=40, progress=False, store=store)
    new = Problem(2048, 4096, 4096)
    got = warm.warm_seeds(store, new, full(new), H200)
    history = [s for s in got.seeds if s.origin == "history"]
    assert history and history[0].measured == summary.best["kernel"]
    assert history[0].tflops == pytest.approx(summary.best["tflops"])
    assert history[0].device == m.device["name"]
    store.close()


# ---- the command line ------------------------------------------------------------------------------
@pytest.fixture
def history(tmp_path):
    """A store holding searches of two other shapes on the H200 (live), and its URL: kernels of the
    recording's space, one of them (at 2048x4096x4096) the recording's slowest valid-looking pick."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    s = Store(url)
    near, far = Problem(2048, 4096, 4096), Problem(32, 4096, 4096)
    tiles = {
        "near1": dict(TILES["small"], group_m=8),
        "near2": dict(TILES["wide"], pad=0),
        "far1": dict(TILES["tall"], bk=8),
    }
    names = {"near1": add_ok(s, near, H200, tiles["near1"], 30.0, ratio=0.8),
             "near2": add_ok(s, near, H200, tiles["near2"], 20.0),
             "far1": add_ok(s, far, H200, tiles["far1"], 3.0)}
    s.close()
    return url, names


def _trials_of_run(url: str, study: str) -> list[dict]:
    s = Store(url, read_only=True)
    try:
        rows = [r for r in s.trials(study=study) if r["status"] != "invalid"]
    finally:
        s.close()
    return sorted(rows, key=lambda r: r["number"])


def test_cli_search_starts_from_the_store_and_lists_its_seeds(history, capsys):
    url, names = history
    code, out, err = run(["search", *BIG, "--replay", str(RECORDING), "--budget", "8", "--db", url], capsys)
    assert code == 0, err
    assert "seeds: 4 seeds (3 from the store, 1 built-in)" in out
    lines = [line for line in out.splitlines() if line.startswith("  seed ")]
    assert lines[0].startswith(f"  seed {names['near1']}  from 2048x4096x4096_fp32_forward: 30.00 TFLOP/s, 0.800x")
    assert lines[1].startswith(f"  seed {names['near2']}  from 2048x4096x4096_fp32_forward: 20.00 TFLOP/s")
    assert lines[2].startswith(f"  seed {names['far1']}  from 32x4096x4096_fp32_forward: 3.00 TFLOP/s")
    assert lines[3].endswith("built-in seed")
    study = next(line for line in out.splitlines() if " trials evaluated " in line).split(": ")[0]
    tried = [r["kernel"] for r in _trials_of_run(url, study)]
    assert tried[:3] == [names["near1"], names["near2"], names["far1"]]  # tried first, in that order


def test_cli_json_carries_the_seeds(history, capsys):
    url, names = history
    code, out, err = run(["search", *BIG, "--replay", str(RECORDING), "--budget", "5", "--db", url, "--json",
                          "--quiet"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["seeds"]["source"] == "history"
    seeds_ = doc["seeds"]["seeds"]
    assert [s["measured"] for s in seeds_ if s["origin"] == "history"] == [names["near1"], names["near2"], names["far1"]]
    assert seeds_[0]["problem"] == "2048x4096x4096_fp32_forward" and seeds_[0]["tflops"] == pytest.approx(30.0)
    assert seeds_[0]["device"] == "NVIDIA H200" and set(seeds_[0]["point"]) == set(
        ReplayMeasurer(RECORDING).space.dims)
    assert "seeds: 4 seeds (3 from the store, 1 built-in)" in err  # --quiet: the count alone
    assert "  seed " not in err


def test_cli_no_warm_start_tries_the_built_in_seeds_only(history, capsys):
    url, names = history
    code, out, err = run(["search", *BIG, "--replay", str(RECORDING), "--budget", "4", "--db", url,
                          "--no-warm-start", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["seeds"]["source"] == "built-in" and "--no-warm-start" in doc["seeds"]["note"]
    kernels = [s["kernel"] for s in doc["seeds"]["seeds"]]
    restricted = space_for("simt", DType.fp32)
    assert kernels == [restricted.spec(seeds("simt")[0], Problem(4096, 4096, 4096)).name]  # the other is outside
    tried = [r["kernel"] for r in _trials_of_run(url, doc["study"])]
    assert tried[0] == kernels[0] and not set(tried) & set(names.values())


def test_cli_no_seeds_tries_none(history, capsys):
    url, _ = history
    for flags in (["--no-seeds"], ["--no-seeds", "--no-warm-start"]):
        code, out, err = run(["search", *BIG, "--replay", str(RECORDING), "--budget", "3", "--db", url, "--json",
                              "--seed", str(len(flags)), *flags], capsys)
        assert code == 0, err
        doc = json.loads(out)
        assert doc["seeds"] == {"source": "none", "note": "no seeds (--no-seeds)", "seeds": [], "dropped": []}
        assert "no seeds (--no-seeds)" in err


def test_cli_resumed_study_lists_no_seeds(history, capsys):
    url, _ = history
    argv = ["search", *BIG, "--replay", str(RECORDING), "--budget", "3", "--db", url, "--quiet"]
    assert run(argv, capsys)[0] == 0
    code, out, err = run([*argv[:-1], "--budget", "5"], capsys)
    assert code == 0, err
    assert f"resuming study gemmscape:4096x4096x4096_fp32_forward:simt-replay:{DEFAULT_SAMPLER}:seed0:" in out
    assert "  seed " not in out


def test_cli_fresh_store_and_no_store_take_the_built_in_seeds(tmp_path, capsys):
    for extra in (["--db", f"sqlite:///{tmp_path / 'fresh.db'}"], ["--no-store"]):
        code, out, err = run(["search", *BIG, "--replay", str(RECORDING), "--budget", "2", "--json", *extra], capsys)
        assert code == 0, err
        doc = json.loads(out)
        assert doc["seeds"]["source"] == "built-in" and len(doc["seeds"]["seeds"]) == 1
        assert ("--no-store" in doc["seeds"]["note"]) == ("--no-store" in extra)


def test_cli_help_says_what_the_seed_flags_do(capsys):
    code, out, _ = run(["search", "--help"], capsys)
    assert code == 0
    assert "--no-warm-start" in out and "--no-seeds" in out and "nearest problems" in out


def test_two_families_searching_one_problem_are_two_studies_each_with_its_own_budget(tmp_path):
    """The study name (its runs share the budget in the store) holds the family: a second family's
    search of a problem already searched gets its budget, not the first's leftovers. The second
    family here is the simt replay space under another family's name (its points still build simt
    kernels the recording answers), since no recording holds one problem in two families."""
    from search.runner import run_search
    from search.space import Space, to_spec

    class Renamed(Space):
        def spec(self, point, problem):
            return to_spec("simt", point, problem)

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    first = ReplayMeasurer(RECORDING)
    a = run_search(first.problem, first.space, first, sampler="random", seed=0, budget=4, store=store,
                   space_name="replay", progress=False)
    second = ReplayMeasurer(RECORDING)
    b = run_search(second.problem, Renamed("tensorcore", first.space.dims), second, sampler="random", seed=0, budget=4,
                   store=store, space_name="replay", progress=False)
    assert ":simt-replay:" in a.study and ":tensorcore-replay:" in b.study
    assert a.evaluated == 4 and b.evaluated == 4, (a.stopped, b.stopped)
    assert store.used_budget(a.study) == 4 and store.used_budget(b.study) == 4
