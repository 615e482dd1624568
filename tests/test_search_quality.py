"""The arithmetic of benchmarks/search_quality.py.

Every history, best and count below is MADE UP for the test (small numbers whose answers can be
checked by hand); none is a measurement. One test runs the script end to end on the recorded
H200 sweep with a tiny budget, to check the plumbing and the labels, not the numbers.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import search_quality as sq

# Made up: best-so-far per evaluated trial of three searches on a space whose best is 100.
REACHES_AT_3 = [50.0, 90.0, 97.0, 97.0, 99.6]  # 97% at trial 3, 99.5% at trial 5
REACHES_AT_1 = [100.0, 100.0, 100.0]
NEVER = [10.0, 20.0, 96.9, 96.9]  # never 97%


def test_trials_to_threshold_is_one_based_and_first_reach():
    assert sq.trials_to(REACHES_AT_3, 100.0, 0.97) == 3
    assert sq.trials_to(REACHES_AT_3, 100.0, 0.995) == 5
    assert sq.trials_to(REACHES_AT_1, 100.0, 0.97) == 1


def test_never_reached_is_none_not_the_budget():
    assert sq.trials_to(NEVER, 100.0, 0.97) is None
    assert sq.trials_to([], 100.0, 0.97) is None


def test_equal_to_the_threshold_counts_despite_float_noise():
    best = 45.33042802806632  # made-up-best-like float
    assert sq.trials_to([0.97 * best * (1 - 1e-12)], best, 0.97) == 1
    assert sq.trials_to([0.97 * best * (1 - 1e-6)], best, 0.97) is None


def test_fraction_at_a_budget_and_after_an_early_stop():
    assert sq.fraction_at(REACHES_AT_3, 100.0, 2) == pytest.approx(0.90)
    assert sq.fraction_at(REACHES_AT_3, 100.0, 5) == pytest.approx(0.996)
    assert sq.fraction_at(NEVER, 100.0, 200) == pytest.approx(0.969)  # ended after 4: what it had then
    assert sq.fraction_at([], 100.0, 25) == 0.0


def test_median_and_worst_over_seeds_with_nevers():
    assert sq.median_trials([3, 1, 7]) == 3
    assert sq.median_trials([3, 1, 7, 9]) == 5  # even count: mean of the middle two
    assert sq.median_trials([3, None, 7]) == 7  # never counts as more than any number
    assert sq.median_trials([3, None, None]) is None  # the median seed never got there
    assert sq.median_trials([3, 4, None, None]) is None  # even: one of the middle two is never
    assert sq.worst_trials([3, 1, 7]) == 7
    assert sq.worst_trials([3, None, 7]) is None
    assert sq.median_trials([]) is None and sq.worst_trials([]) is None


def test_against_random():
    # made up: random's median is 40; the setting's median 10 -> ratio 0.25; 3 of 4 seeds below 40
    got = sq.against_random([5, 10, 10, 60], [20, 40, 40, 90])
    assert got == {"median_ratio": 0.25, "beats_random_median": 0.75}
    never = sq.against_random([None, None, 3], [20, 40, 60])  # its median is never: no ratio
    assert never["median_ratio"] is None and never["beats_random_median"] == pytest.approx(1 / 3)
    random_never = sq.against_random([5, 6, 7], [None, None, 10])  # random's median never: any reach beats it
    assert random_never == {"median_ratio": None, "beats_random_median": 1.0}


def test_summarize_made_up_histories():
    row = sq.summarize([REACHES_AT_3, REACHES_AT_1, NEVER], 100.0, budget=25)
    assert row["seeds"] == 3
    assert row["trials_to_0.97"] == {"median": 3, "median_ci95": None, "worst": None, "never": 1,
                                     "per_seed": [3, 1, None]}  # 3 seeds are too few for a 95% interval
    assert row["trials_to_0.995"]["per_seed"] == [5, 1, None] and row["trials_to_0.995"]["median"] == 5
    assert list(row["fraction_at"]) == ["25"]  # budgets above the run's budget are not reported
    assert row["fraction_at"]["25"]["worst"] == pytest.approx(0.969)
    assert row["fraction_at"]["25"]["median"] == pytest.approx(0.996)


def test_random_sampling_distribution_is_hypergeometric():
    # made up: 10 valid points, 1 good: after t trials the chance to have drawn it is t/10
    assert [sq.random_trials_cdf(10, 1, t) for t in (1, 5, 10)] == pytest.approx([0.1, 0.5, 1.0])
    # 10 points, 2 good: P(neither in the first 2) = (8/10)(7/9)
    assert sq.random_trials_cdf(10, 2, 2) == pytest.approx(1 - 8 / 10 * 7 / 9)
    assert sq.random_trials_cdf(10, 2, 9) == 1.0 and sq.random_trials_cdf(10, 0, 5) == 0.0
    assert sq.random_trials_quantile(10, 1, 0.5) == 5
    assert sq.random_trials_quantile(10, 1, 0.95) == 10


def test_random_distribution_matches_a_simulation():
    import random

    rng = random.Random(0)
    n, k, t, draws = 50, 3, 10, 20000  # made-up space: 50 points, 3 good
    hits = sum(any(x < k for x in rng.sample(range(n), t)) for _ in range(draws))
    assert hits / draws == pytest.approx(sq.random_trials_cdf(n, k, t), abs=0.015)


def test_median_confidence_interval():
    # made up: 20 seeds 1..20; P(Binomial(20, 1/2) <= 5) = 0.021 <= 0.025 < P(<= 6): ranks 6 and 15
    assert sq.median_ci(list(range(1, 21))) == [6, 15]
    assert sq.median_ci([*range(1, 15), None, None, None, None, None, None]) == [6, None]
    assert sq.median_ci([1, 2, 3, 4, 5]) is None  # P(all 5 above the median) = 1/32 > 0.025
    assert sq.median_ci([1, 2, 3, 4, 5, 6]) == [1, 6]  # 1/64 <= 0.025


def test_median_at_most_probability():
    assert sq.median_at_most_probability(0.5, 1) == pytest.approx(0.5)
    assert sq.median_at_most_probability(0.5, 3) == pytest.approx(0.5)  # symmetric
    assert sq.median_at_most_probability(0.2, 3) == pytest.approx(3 * 0.2**2 * 0.8 + 0.2**3)
    with pytest.raises(ValueError):
        sq.median_at_most_probability(0.5, 4)


def test_recording_hardness_made_up():
    results = {f"k{i}": {"status": "ok", "tflops": v} for i, v in enumerate([100, 99.6, 97, 90, 50])}
    results["bad"] = {"status": "compile_error", "tflops": 0}
    h = sq.recording_hardness(results, budget=3)
    assert h["valid_points"] == 5 and h["best_tflops"] == 100
    assert h["within_0.97"]["points"] == 3 and h["within_0.995"]["points"] == 2
    assert h["within_0.97"]["random_median_trials"] == 1  # 3 of 5 good: P(first is good) = 0.6
    assert h["within_0.995"]["random_reaches_within_budget"] == pytest.approx(1 - math.comb(3, 3) / math.comb(5, 3))


def test_markdown_goes_between_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# head\n\n{sq.MARK_BEGIN}\nold table\n{sq.MARK_END}\n\n## tail\n")
    sq.write_markdown("new table\n", readme)
    assert readme.read_text() == f"# head\n\n{sq.MARK_BEGIN}\nnew table\n{sq.MARK_END}\n\n## tail\n"
    other = tmp_path / "t.md"
    sq.write_markdown("just the table\n", other)
    assert other.read_text() == "just the table\n"


def test_unknown_settings_refused_and_tpe_override_reaches_the_sampler():
    from search import samplers
    from search.samplers import make_sampler

    with pytest.raises(SystemExit):
        sq.main(["--samplers", "no-such-sampler"])
    space = sq_space()
    with sq.sampler_setting(sq.CONFIG_BY_NAME["tpe-startup5"]):
        sampler = samplers.make_sampler("tpe", 0, space)
    assert sampler._n_startup_trials == 5
    assert samplers.make_sampler is make_sampler  # put back


def sq_space():
    from search.measure import ReplayMeasurer
    from tests.search.test_replay import RECORDING

    return ReplayMeasurer(RECORDING).space


def test_end_to_end_on_the_recording_is_labelled_a_replay(tmp_path):
    """Plumbing and labels only (budget 12, 2 seeds): the numbers of such a tiny run mean nothing."""
    md = tmp_path / "t.md"
    from tests.search.test_replay import RECORDING

    assert sq.main(["--samplers", "tpe", "random", "--seeds", "2", "--budget", "12", "--random-reference", "3",
                    "--recordings", str(RECORDING), "--workers", "1", "--out", str(tmp_path), "--markdown", str(md), "--quiet"]) == 0
    doc = json.loads(next(tmp_path.glob("search-quality-*.json")).read_text())
    assert doc["suite"] == "search-quality" and doc["measurement"].startswith("REPLAY")
    assert "no GPU" in doc["machine"]["note"] and doc["versions"]["optuna"] and doc["versions"]["numpy"]
    assert doc["command"].startswith("python3 -m benchmarks.search_quality --samplers tpe random")
    (rec,) = doc["records"]
    assert rec["recording"]["file"].endswith("replay-simt-4096x4096x4096-fp32.json")
    assert "H200" in rec["recording"]["recorded"]["where"] and rec["recording"]["recorded"]["when"]
    assert rec["recording"]["recorded"]["source_hashes"]
    assert rec["hardness"]["valid_points"] == 672
    assert set(rec["table"]) == {"unseeded", "seeded"} and set(rec["table"]["unseeded"]) == {"tpe", "random"}
    assert rec["table"]["unseeded"]["tpe"]["evaluated"]["median"] == 12
    assert rec["random_reference"]["seeds"] == 3
    assert doc["settings"]["unseeded_means"]["seeds"] is None
    text = md.read_text()
    assert "| tpe |" in text and "replay-simt-4096x4096x4096-fp32.json" in text
    assert sq.main(["--from", str(next(tmp_path.glob("search-quality-*.json"))), "--markdown", str(md)]) == 0
    assert md.read_text() == text


def test_search_cost_plumbing(tmp_path):
    """Plumbing only (budgets 4 and 8, no store): the figures of such a run mean nothing."""
    from benchmarks import search_cost
    from tests.search.test_replay import RECORDING

    assert search_cost.main(["--recording", str(RECORDING), "--samplers", "random", "--budgets", "4", "8",
                             "--no-store", "--out", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("search-cost-*.json")).read_text())
    assert doc["suite"] == "search-cost" and doc["measurement"].startswith("REPLAY") and doc["target_ratio"] == 2
    assert [r["evaluated"] for r in doc["runs"]] == [4, 8] and doc["wall_ratio"]["random"] > 0
    assert set(doc["runs"][1]["times_s"]) == {"sample", "check", "store", "compile_wait", "gpu"}
    assert "H200" in doc["recording"]["recorded"]["where"]
    with pytest.raises(SystemExit):
        search_cost.main(["--budgets", "8", "4"])


def test_search_cost_synthetic_plumbing(tmp_path):
    """Plumbing only: the synthetic measurer over the full simt space, budgets 12 and 24, a store
    (the first 12 trials of both coincide, so the longer search's best is at least the shorter's)."""
    from benchmarks import search_cost
    from codegen.problem import DType, Problem

    assert search_cost.main(["--synthetic", "1536x2560x1024", "--samplers", "local", "--budgets", "12", "24",
                             "--out", str(tmp_path)]) == 0
    doc = json.loads(next(tmp_path.glob("search-cost-synthetic-*.json")).read_text())
    assert doc["measurer"].startswith("synthetic") and doc["measurement"].startswith("SYNTHETIC")
    runs = doc["runs"]
    assert [r["evaluated"] for r in runs] == [12, 24] and runs[1]["best_tflops"] >= runs[0]["best_tflops"] > 0
    assert runs[1]["windows"][0]["trials"] == [1, 23] and runs[1]["windows"][0]["store_ms"] > 0
    assert search_cost.SyntheticMeasurer(Problem(1536, 2560, 1024, DType.fp32)).space.size > 10_000_000
