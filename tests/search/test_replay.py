"""Search through replay of a sweep recorded on the H200 (see the file's "recorded" block).

Recorded data, not a measurement of this run: search/recordings/replay-simt-4096x4096x4096-fp32.json
was recorded on 2026-11-30 on the lent NVIDIA H200 (driver 580.159.04, NVRTC 13.0) with
`codegen sweep --m 4096 --n 4096 --k 4096`: every valid point of the restricted SIMT space, once.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.problem import Problem
from search import SAMPLERS
from search.measure import ReplayMeasurer
from search.runner import run_search
from search.space import space_for

RECORDING = Path(__file__).resolve().parents[2] / "search" / "recordings" / "replay-simt-4096x4096x4096-fp32.json"


def replay(sampler: str, seed: int, budget: int, **kw):
    measurer = ReplayMeasurer(RECORDING)
    return run_search(measurer.problem, measurer.space, measurer, sampler=sampler, seed=seed, budget=budget,
                      progress=False, **kw), measurer


def test_recording_is_labelled_and_complete():
    m = ReplayMeasurer(RECORDING)
    assert "H200" in m.recorded["where"] and m.recorded["when"].startswith("2026-") and m.recorded["how"]
    valid = {m.space.spec(p, m.problem).name for p in m.space.points()
             if not m.space.spec(p, m.problem).check(m.problem, m.limits)}
    assert valid == set(m.results), "the sweep must hold every valid point of its space"
    assert m.baselines()["cublas"]["median_ms"] > 0


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_runs_through_replay(sampler):
    if sampler == "gp":
        pytest.importorskip("torch", reason="Optuna's GP sampler needs torch")
        pytest.importorskip("scipy", reason="Optuna's GP sampler needs scipy")
    budget = 16 if sampler == "gp" else 30  # GP: about 3 s per proposal with trials in flight, past 10 random ones
    summary, m = replay(sampler, seed=1, budget=budget)
    assert summary.evaluated == budget and summary.stopped == "budget reached"
    assert summary.best["tflops"] > 0 and summary.best["kernel"] in m.results
    assert summary.history == sorted(summary.history)  # best-so-far never drops


def random_can_only_rarely_beat(m: ReplayMeasurer, fraction: float, seeds: int, alpha: float = 0.05) -> int:
    """The largest B such that random sampling's median trials-to-``fraction`` over ``seeds`` (odd)
    seeds is <= B with probability <= ``alpha``, from the recording's exact random distribution."""
    from benchmarks.search_quality import median_at_most_probability, random_trials_cdf

    best = m.best["tflops"]
    good = sum(r["tflops"] >= fraction * best * (1 - 1e-9) for r in m.results.values() if r["status"] == "ok")
    p = lambda b: median_at_most_probability(random_trials_cdf(len(m.results), good, b), seeds)  # noqa: E731
    return max(b for b in range(1, len(m.results)) if p(b) <= alpha)


def median_trials_to(sampler: str, fraction: float, seeds: int, budget: int) -> float:
    """Median over sampler seeds 0..seeds-1 of the evaluated trials until ``fraction`` of the
    recorded best is found, unseeded; a seed that does not get there within ``budget`` counts as
    more than any number (``math.inf``)."""
    from benchmarks.search_quality import trials_to

    found = []
    for seed in range(seeds):
        summary, m = replay(sampler, seed, budget)
        t = trials_to(summary.history, m.best["tflops"], fraction)
        found.append(math.inf if t is None else t)
    return statistics.median(found)


@pytest.mark.parametrize(("fraction", "seeds", "bound"), [(0.995, 9, 61), (0.97, 31, 28)])
def test_tpe_finds_the_best_kernels_sooner_than_random_sampling_can(fraction, seeds, bound):
    """TPE's median trials to ``fraction`` of the recorded best, over ``seeds`` seeds, is at most
    ``bound``: a bound that random sampling meets with probability <= 5%, so a TPE that is no
    better than random (e.g. one replaced by the random sampler) fails this test with probability
    >= 95%; with these fixed seeds, random in TPE's place fails it (checked when it was written).

    Derivation (exact, from the recording; no tuning to TPE's results). The recording holds the
    672 valid points of its space; 10 are within 97% of the best and 3 within 99.5%. The runner's
    random sampler evaluates each valid point at most once and invalid or repeated proposals cost
    nothing, so its evaluated sequence is a uniformly random order of the 672 points and its
    trials-to-threshold T has P(T <= t) = 1 - C(672-k, t) / C(672, t), k the points above the
    threshold: a median of 45 trials to 97% (95th percentile 173) and 139 to 99.5%. 200 measured
    random searches agree (median 47.5 to 97%; benchmarks/results/search-quality-*.json). The
    median of n (odd) independent seeds is <= B exactly when at least (n+1)/2 of them are, a
    binomial tail; the bound is the largest B where that tail is <= 5%:
    97%, 31 seeds -> B = 28 (P = 0.041); 99.5%, 9 seeds -> B = 61 (P = 0.048).

    Why these: at 97% the recording separates samplers weakly (TPE's measured median is 23-24 trials
    against random's 45), so it takes 31 seeds for a 5% bound TPE clears; at 99.5% (3 points) the
    gap is wide (TPE about 31, random 139) and 9 seeds suffice. Searches stop at the bound: a seed
    that needs more counts as "more", which is all the median needs.
    """
    m = ReplayMeasurer(RECORDING)
    assert random_can_only_rarely_beat(m, fraction, seeds) == bound  # the docstring's numbers
    median = median_trials_to("tpe", fraction, seeds, budget=bound)
    assert median <= bound, (f"TPE's median trials to {fraction:.1%} of the recorded best over {seeds} seeds is "
                             f"{f'more than {bound}' if math.isinf(median) else median}: no better than random "
                             f"sampling, which gets <= {bound} with p <= 5%")


@pytest.mark.parametrize(("sampler", "who"), [("cmaes", "cmaes"), ("local", "the local sampler's cmaes")])
def test_a_converged_cmaes_restarts_and_spends_its_budget(sampler, who):
    """CMA-ES, alone or as the local sampler's fallback, restarts when it converges."""
    m = ReplayMeasurer(RECORDING)
    space = m.space.restrict(bm=(128, 256))  # small enough that CMA-ES converges within 100 trials
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # nothing deprecated reaches the user
        summary = run_search(m.problem, space, m, sampler=sampler, seed=0, budget=100, progress=False)
    assert summary.evaluated == 100 and summary.stopped == "budget reached"
    assert summary.handover.startswith(f"{who} converged ") and "time" in summary.handover
    assert "(16 proposals in a row" in summary.handover
    assert "restarted from the best point" in summary.handover
    assert any("restarted" in line for line in summary.describe())


SKINNY = RECORDING.with_name("replay-simt-skinny-32x4096x4096-fp32.json")
LARGE = RECORDING.with_name("replay-tensorcore-large-4096x4096x4096-bf16.json")


@pytest.mark.parametrize(("recording", "bound"), [(RECORDING, 19), (SKINNY, 83), (LARGE, 55)],
                         ids=["restricted", "skinny", "large"])
def test_the_default_sampler_finds_the_best_sooner_than_random_sampling_can(recording, bound):
    """On each recording, the median of 9 random searches' trials to 97% of the best is <= ``bound``
    with probability <= 5% (exact, hypergeometric: random needs a median of 45 / 197 / 130 trials
    on the restricted / skinny / large recording). The default sampler's median over seeds 0..8
    must be <= ``bound``: a default no better than random fails this with probability >= 95%.
    Measured when written (local, seeds 0..8): 11 / 26 / 34 trials (per seed in the message of a
    failure; the 10-seed numbers are in docs/measurements.md, "Search")."""
    from benchmarks.search_quality import trials_to
    from search import DEFAULT_SAMPLER

    m = ReplayMeasurer(recording)
    assert random_can_only_rarely_beat(m, 0.97, 9) == bound  # the docstring's numbers
    found = []
    for seed in range(9):
        summary = run_search(m.problem, m.space, ReplayMeasurer(recording), sampler=DEFAULT_SAMPLER, seed=seed,
                             budget=bound, progress=False)
        t = trials_to(summary.history, m.best["tflops"], 0.97)
        found.append(math.inf if t is None else t)
    median = statistics.median(found)
    assert median <= bound, (f"{DEFAULT_SAMPLER}'s median trials to 97% on {recording.name} is "
                             f"{'more than ' + str(bound) if math.isinf(median) else median}: per seed {found}")


def test_tpe_beats_random_at_50():
    tpe = statistics.median(replay("tpe", s, 50)[0].best["tflops"] for s in range(5))
    rnd = statistics.median(replay("random", s, 50)[0].best["tflops"] for s in range(5))
    assert tpe > rnd, (tpe, rnd)


def test_a_space_without_valid_points_ends_with_one_line():
    problem = Problem(4096, 4096, 4096)
    m = ReplayMeasurer(RECORDING)
    big = space_for("simt", problem.dtype).restrict(bm=(16,), tm=(8,), lanes_m=(32,))  # warp tile > block tile
    summary = run_search(problem, big, m, budget=10, progress=False)
    assert summary.evaluated == 0 and summary.valid_proposals == 0 and summary.sampler_proposals >= 1
    assert summary.stopped.startswith("stopped: 4000 random draws") and "\n" not in summary.stopped
    small = big.restrict(bn=(32,), bk=(8,), tn=(8,), group_m=(1,), split=("k1",))  # small enough to enumerate
    summary = run_search(problem, small, m, sampler="tpe", budget=10, progress=False)
    assert summary.evaluated == 0
    assert summary.stopped == "space exhausted: no point of the space is valid for this problem on this device"


@pytest.mark.parametrize("sampler", ["local", "cmaes", "tpe", "random", "grid"])
def test_a_small_space_is_measured_through_and_ends_exhausted(sampler):
    """Every sampler spends its budget while unmeasured valid kernels are left, then says so."""
    m = ReplayMeasurer(RECORDING)
    space = m.space.restrict(bm=(128,), bn=(128,), tm=(8,), tn=(8,))  # 3 bk x 3 lanes_m x 2 pad x 2 group_m
    valid = {space.spec(p, m.problem).name for p in space.points()
             if not space.spec(p, m.problem).check(m.problem, m.limits)}
    summary = run_search(m.problem, space, m, sampler=sampler, seed=1, budget=100, progress=False)
    assert summary.evaluated == len(valid) == 36
    assert summary.stopped == f"space exhausted: all {len(valid)} valid kernels of the space are measured"


def test_resume_counts_the_budget_across_runs(tmp_path):
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    first, m = replay("tpe", 3, 20, store=store)
    second, _ = replay("tpe", 3, 35, store=store)
    assert (first.evaluated, second.evaluated, second.evaluated_now) == (20, 35, 15)
    names = [r["kernel"] for r in store.trials() if r["status"] != "invalid"]
    assert len(names) == len(set(names)) == 35  # nothing measured twice
    assert store.count_trials(second.study, evaluated_only=True) == 35


def test_cli_replay_prints_the_best_and_the_recorded_best():
    out = subprocess.run([sys.executable, "-m", "codegen", "search", "--m", "4096", "--n", "4096", "--k", "4096",
                          "--replay", str(RECORDING), "--budget", "40", "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "40 of 40 trials evaluated" in out.stdout and "recorded best" in out.stdout
    assert "recorded on NVIDIA H200" in out.stderr
    assert "% valid" in out.stdout and "  time: sample " in out.stdout and " gpu " in out.stdout


def test_cli_json_summary_says_how_the_proposals_went_and_where_the_time_went(capsys):
    import json

    from tests.test_cli_errors import run

    code, out, err = run(["search", "--m", "4096", "--n", "4096", "--k", "4096", "--replay", str(RECORDING),
                          "--budget", "30", "--no-store", "--no-seeds", "--sampler", "tpe", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    p = doc["proposals"]
    assert doc["evaluated"] == 30 and doc["sampler"] == "tpe" and doc["seeded"] == 0
    assert p["sampler"] >= p["valid"] >= p["new"] > 0 and p["all"] == p["sampler"] + p["replaced"]
    assert p["valid_fraction"] == pytest.approx(p["valid"] / p["sampler"])
    assert set(doc["times_s"]) == {"sample", "check", "store", "compile_wait", "gpu"}
    assert doc["times_s"]["store"] == 0 and doc["times_s"]["sample"] > 0  # --no-store: nothing stored
    assert sum(doc["times_s"].values()) <= doc["wall_s"]
    assert doc["workers"] is None and "measured by" not in err  # one measurer: no per-worker split to tell
    assert "unseeded" in err and "% valid" in err


def test_replay_refuses_another_problem():
    with pytest.raises(ValueError, match="records 4096x4096x4096"):
        ReplayMeasurer(RECORDING, Problem(32, 4096, 4096))


def test_search_without_gpu_fails_fast_with_one_line():
    from tests.conftest import gpu_visible

    if gpu_visible():
        pytest.skip("a GPU is visible here")
    out = subprocess.run([sys.executable, "-m", "codegen", "search", "--m", "64", "--n", "64", "--k", "64"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--replay" in lines[0], out.stderr


def test_seeds_are_tried_first():
    from search.space import point_of

    m = ReplayMeasurer(RECORDING)
    best = m.space.spec(next(p for p in m.space.points() if m.space.spec(p, m.problem).name == m.best["kernel"]), m.problem)
    outside = dict(point_of(best), bm=48)  # not a choice: skipped
    summary = run_search(m.problem, m.space, m, sampler="random", seed=0, budget=3, progress=False,
                         seeds=[outside, point_of(best)])
    assert summary.history[0] == pytest.approx(m.best["tflops"])


def test_point_of_inverts_to_spec():
    from search.space import point_of

    space = space_for("simt", Problem(1, 1, 1).dtype)
    problem = Problem(32, 4096, 4096)
    for i, point in enumerate(space.points()):
        if i % 997:
            continue
        spec = space.spec(point, problem)
        assert space.spec(point_of(spec), problem) == spec
        if i > 200_000:
            break


# ---- which source was measured -------------------------------------------------------------------------
def test_recording_says_which_source_each_result_measured():
    m = ReplayMeasurer(RECORDING)
    assert m.hashes_known and "9ad82c1" in m.recorded["source_hashes"]
    hashes = [r["source_hash"] for r in m.results.values()]
    assert len(set(hashes)) == len(hashes) and all(len(h) == 64 for h in hashes)
    name = next(n for n in m.results)
    from codegen.families import spec_from_name

    spec = spec_from_name(name)
    assert m.source_hash(spec) == m.results[name]["source_hash"]
    m.submit("t", spec)
    done = m.next_done()
    assert done.kernel["source_hash"] == m.results[name]["source_hash"] and "source_hash" not in done.result
    assert "source_hash" not in m.best


def test_replayed_trials_are_stored_with_the_recorded_source(tmp_path):
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 'h.db'}")
    summary, m = replay("random", 0, 8, store=store)
    rows = [r for r in store.trials() if r["status"] != "invalid"]
    assert len(rows) == 8 and all(r["source_hash"] == m.results[r["kernel"]]["source_hash"] for r in rows)


def _rehashed(path: Path, tmp_path: Path, change) -> Path:
    import json

    doc = json.loads(path.read_text())
    for r in doc["results"].values():
        r["source_hash"] = change(r["source_hash"])
        if r["source_hash"] is None:
            del r["source_hash"]
    out = tmp_path / path.name
    out.write_text(json.dumps(doc))
    return out


def test_a_changed_source_is_measured_again_not_reused(tmp_path):
    """Same kernels, same store: results are reused for the source they measured, never for new source."""
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 'c.db'}")
    m = ReplayMeasurer(RECORDING)
    from search.space import point_of

    seeds = [point_of(m.space.spec(p, m.problem)) for p in list(m.space.points())[:40]
             if not m.space.spec(p, m.problem).check(m.problem, m.limits)][:3]
    run = lambda measurer, seed: run_search(measurer.problem, measurer.space, measurer, sampler="random",  # noqa: E731
                                            seed=seed, budget=3, store=store, progress=False, seeds=seeds)
    run(ReplayMeasurer(RECORDING), 0)
    seeded = {m.space.spec(p, m.problem).name for p in seeds}
    again = run(ReplayMeasurer(RECORDING), 1)  # a new study: the seeds are known from the store
    assert again.evaluated_now == 3
    counts = {n: len(store.trials(kernel_name=n)) for n in seeded}
    assert counts == dict.fromkeys(seeded, 1), counts
    changed = ReplayMeasurer(_rehashed(RECORDING, tmp_path, lambda h: "changed-" + h))  # templates changed
    run(changed, 2)
    for name in seeded:
        rows = store.trials(kernel_name=name)
        old = m.results[name]["source_hash"]
        assert [r["source_hash"] for r in rows] == [old, "changed-" + old]
    assert len({(k["name"], k["source_hash"]) for k in store.kernels()}) == len(store.kernels())


def test_a_recording_without_hashes_says_so_and_reuses_nothing(tmp_path):
    from store import Store

    bare = ReplayMeasurer(_rehashed(RECORDING, tmp_path, lambda h: None))
    assert not bare.hashes_known
    name = next(iter(bare.results))
    from codegen.families import spec_from_name

    assert bare.source_hash(spec_from_name(name)) is None
    store = Store(f"sqlite:///{tmp_path / 'u.db'}")
    kw = dict(sampler="tpe", seed=3, store=store, progress=False)
    run_search(bare.problem, bare.space, bare, budget=6, **kw)
    second = run_search(bare.problem, bare.space, ReplayMeasurer(bare_path := tmp_path / RECORDING.name), budget=6,
                        **kw)
    assert bare_path.is_file() and second.evaluated == 6
    rows = [r for r in store.trials() if r["status"] != "invalid"]
    assert all(r["source_hash"] is None for r in rows)
    out = subprocess.run([sys.executable, "-m", "codegen", "search", "--m", "4096", "--n", "4096", "--k", "4096",
                          "--replay", str(bare_path), "--budget", "5", "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "does not say which source each result measured" in out.stderr


def test_a_measurer_whose_workers_is_its_compile_pool_reports_no_split(capsys, monkeypatch):
    """The local GPU measurer's ``workers`` is its compile pool's size: the summary's per-worker split
    comes from ``worker_report()`` (the parallel measurer's) and nothing else."""
    from search.measure import ReplayMeasurer
    from tests.test_cli_errors import run

    monkeypatch.setattr(ReplayMeasurer, "workers", 3, raising=False)
    code, out, err = run(["search", "--m", "4096", "--n", "4096", "--k", "4096", "--replay", str(RECORDING),
                          "--budget", "4", "--no-store", "--json"], capsys)
    assert code == 0, err
    assert "measured by" not in err and '"workers": null' in out
