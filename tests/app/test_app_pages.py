"""Streamlit AppTest drives every page on the fixture database, filters included."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from app_fixture_db import (
    BIG,
    BIG_BF16,
    DENSE,
    HOSTILE_EVIDENCE,
    MAIN,
    MATCHING,
    PAGES,
    REPLAY_EVALUATED,
    REPLAY_INVALID,
    REPLAYED,
    STALE,
    UNHASHED,
    build,
    source_of,
    sparse_problem,
)
from streamlit import dataframe_util
from streamlit.testing.v1 import AppTest

from codegen import families
from codegen.problem import DType
from codegen.render import render, source_hash
from store import Store

TIMEOUT = 60


def open_page(name: str) -> AppTest:
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT).run()
    if name != "Overview":
        at.switch_page(PAGES[name]).run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == [name]
    return at


def texts(at: AppTest) -> str:
    parts = [
        e.value for kind in ("markdown", "caption", "info", "warning", "success", "subheader") for e in at.get(kind)
    ]
    return "\n".join(str(p) for p in parts)


def chart_data(chart) -> list[pd.DataFrame]:  # type: ignore[no-untyped-def]
    """The data sets a drawn Altair chart carries, in layer order."""
    return [dataframe_util.convert_arrow_bytes_to_pandas_df(d.data.data) for d in chart.proto.datasets]


def rerun(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.usefixtures("use_db")
class TestPagesOnFixture:
    def test_overview(self) -> None:
        at = open_page("Overview")
        metrics = {m.label: m.value for m in at.metric}
        assert metrics["problems"] == "11" and metrics["devices"] == "2" and metrics["runs"] == "2"
        best = at.dataframe[0].value
        assert DENSE.key in set(best["problem"])
        dense = best[best["problem"] == DENSE.key].iloc[0]
        assert dense["bound"] == "compute" and dense["of compute peak"].endswith("%")
        assert pd.isna(dense["block"]) and dense["density"] == 1.0
        assert "vs cublas" in best.columns and "vs torch_bsr" in best.columns and "vs cusparselt" in best.columns
        empty = best[best["problem"] == sparse_problem(DType.fp32, 64, 0.0).key].iloc[0]  # an all-zero W
        assert (empty["block"], empty["density"], empty["of roofline"]) == (64, 0.0, "–")
        problems = at.dataframe[1].value
        assert {"block", "density", "pattern"} <= set(problems.columns)
        assert sorted(problems["block"].dropna().astype(int)) == [32] * 5 + [64] * 4
        assert "Test GPU 9000: roofline ceilings unknown" in texts(at)
        assert at.get("vega_lite_chart"), "the H200 roofline chart is drawn"

    def test_trials_filters_sort_chart_importance(self) -> None:
        at = open_page("Trials")
        assert len(at.dataframe[0].value) == 35
        assert {"block", "density"} <= set(at.dataframe[0].value.columns)
        at.sidebar.multiselect(key="trials_problem").set_value([DENSE.key])
        at.sidebar.multiselect(key="trials_status").set_value(["ok"])
        rerun(at)
        table = at.dataframe[0].value
        assert len(table) == 20 and set(table["status"]) == {"ok"}
        assert list(table["tflops"]) == sorted(table["tflops"], reverse=True)
        assert "Optuna" in texts(at) and at.get("vega_lite_chart")

        at.sidebar.selectbox(key="trials_param").set_value("pad")
        rerun(at)
        pads = at.sidebar.multiselect(key="trials_param_values").options
        at.sidebar.multiselect(key="trials_param_values").set_value([pads[0]])
        at.selectbox(key="trials_sort").set_value("median_ms")
        at.toggle(key="trials_desc").set_value(False)
        at.selectbox(key="trials_x").set_value("spec.group_m")
        rerun(at)
        table = at.dataframe[0].value
        assert 0 < len(table) < 20 and set(table["spec.pad"].astype(str)) == {pads[0]}
        assert list(table["median_ms"]) == sorted(table["median_ms"])

    def test_trials_family_and_name_filters(self) -> None:
        at = open_page("Trials")
        at.sidebar.multiselect(key="trials_family").set_value(["simt"])
        at.sidebar.text_input(key="trials_name").set_value("_bias_")
        rerun(at)
        assert set(at.dataframe[0].value["problem"]) == {"32x4096x4096_bf16_forward_bias"}
        assert "need at least 5 ok trials" in texts(at)

    def test_history(self) -> None:
        at = open_page("Search history")
        assert len(at.dataframe[0].value) == 2
        assert at.get("vega_lite_chart")
        at.sidebar.multiselect(key="history_sampler").set_value(["random"])
        rerun(at)
        assert list(at.dataframe[0].value["sampler"]) == ["random"]

    def test_kernel_source_is_code_not_html(self) -> None:
        at = open_page("Kernel")
        cpp = [c for c in at.code if c.language == "cpp"]
        shown = families.spec_from_name(at.sidebar.selectbox(key="kernel_name").value)
        assert [c.value for c in cpp] == [source_of(shown).rstrip()]
        assert all("<b>" not in m.value for m in at.markdown)
        assert at.get("vega_lite_chart"), "timing spread chart"
        assert at.json and "pad" in at.json[0].value
        assert "registers" in at.dataframe[0].value.index
        labels = [b.label for b in at.download_button]
        assert [label.rsplit(".", 1)[1] for label in labels] == ["cu", "json"]

    def test_kernel_never_compiled(self, use_db: str) -> None:
        with Store(use_db, read_only=True) as store:
            invalid = store.trials(status="invalid")[0]["kernel"]
        at = open_page("Kernel")
        at.sidebar.selectbox(key="kernel_name").set_value(invalid)
        rerun(at)
        assert "never compiled" in texts(at) and "No source stored" in texts(at)
        assert not [c for c in at.code if c.language == "cpp"]

    def test_failures_show_evidence_as_text(self) -> None:
        at = open_page("Failures")
        assert len(at.dataframe[0].value) == 4
        at.sidebar.multiselect(key="failures_status").set_value(["compile_error"])
        rerun(at)
        assert list(at.dataframe[0].value["status"]) == ["compile_error"]
        assert [c.value for c in at.code] == [HOSTILE_EVIDENCE]
        assert all("<script>" not in m.value for m in at.markdown)
        at.sidebar.multiselect(key="failures_problem").set_value(["32x4096x4096_bf16_forward_bias"])
        rerun(at)
        assert "No failed trial" in texts(at)

    def test_sparsity_time_speedup_and_break_even(self) -> None:
        at = open_page("Sparsity")
        assert at.sidebar.selectbox(key="sparsity_case").options == ["2048x2048x2048 · fp16", "2048x2048x2048 · fp32"]
        refs, even, points = (d.value for d in at.dataframe)
        assert list(refs["baseline"]) == ["dense cuBLAS", "cuSPARSELt 2:4"] and list(refs["ms"]) == [0.5, 0.35]
        assert list(zip(even["dtype"], even["block"], strict=True)) == [("fp16", 32), ("fp32", 32), ("fp32", 64)]
        fp16, b32, b64 = even["break_even_density"]
        assert fp16 == pytest.approx(0.35) and 0.25 < b32 < 0.5 and b64 == 0.5
        assert list(points["density"]) == [0.25, 0.5] and set(points["dtype"]) == {"fp16"}
        time_chart, speedup_chart = at.get("vega_lite_chart")
        lines, dense, semi = chart_data(time_chart)
        assert sorted(set(lines["series"])) == ["gemmscape", "torch BSR"] and set(lines["block"]) == {32}
        assert list(dense["label"]) == ["dense cuBLAS 0.5 ms"] and list(dense["measurements"]) == [2]
        assert (list(semi["density"]), list(semi["ms"])) == ([0.5], [0.35])
        (speedups,) = chart_data(speedup_chart)[:1]
        ours = speedups[speedups["series"] == "gemmscape"]
        assert list(ours["speedup"]) == pytest.approx([1.2, 0.7])
        assert "speedup over dense cuBLAS" in json.dumps(speedup_chart.proto.spec)

        at.sidebar.selectbox(key="sparsity_case").set_value("2048x2048x2048 · fp32")
        rerun(at)
        refs, even, points = (d.value for d in at.dataframe)
        assert list(refs["baseline"]) == ["dense cuBLAS"]  # no 2:4 baseline for fp32 in the fixture
        assert list(points["block"]) == [32] * 3 + [64] * 4 and points["density"].min() == 0.0
        lines, dense = chart_data(at.get("vega_lite_chart")[0])
        assert list(dense["label"]) == ["dense cuBLAS 1 ms"] and list(dense["measurements"]) == [7]
        assert lines[lines["series"] == "gemmscape"]["density"].min() == 0.0


def test_filter_text_never_becomes_sql(use_db: str) -> None:
    before = len(Store(use_db, read_only=True).trials())
    at = open_page("Trials")
    at.sidebar.text_input(key="trials_name").set_value("'; DROP TABLE gs_trials; --")
    rerun(at)
    assert "No trials match these filters." in texts(at)
    at.sidebar.text_input(key="trials_name").set_value("%")
    rerun(at)
    assert "No trials match these filters." in texts(at)
    with Store(use_db, read_only=True) as store:
        assert len(store.trials()) == before == 35


@pytest.mark.parametrize("name", list(PAGES))
def test_missing_database_shows_guidance(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nowhere.db"
    monkeypatch.setenv("GEMMSCAPE_DB", f"sqlite:///{missing}")
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT).run()
    at.switch_page(PAGES[name]).run()
    assert not at.exception
    from store.db import missing_message

    assert missing_message(missing) in texts(at)  # what `codegen results` and `codegen app --db` say, too
    assert not missing.exists(), "the read-only app never creates the database"


def test_empty_database_shows_guidance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Store(url).close()
    monkeypatch.setenv("GEMMSCAPE_DB", url)
    at = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT).run()
    assert not at.exception and "holds no trials" in texts(at)


def test_sparsity_guidance_without_sparse_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'dense.db'}"
    build(url, sparse=False)
    monkeypatch.setenv("GEMMSCAPE_DB", url)
    at = open_page("Sparsity")
    assert "No block-sparse results yet" in texts(at)


def test_kernel_page_keeps_each_source_of_a_name_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A template change gives a kernel name a second source: the page shows and exports either one."""
    from app_fixture_db import H200, ok, record, variant

    url = f"sqlite:///{tmp_path / 'two.db'}"
    store = Store(url)
    dev = store.device(H200)
    spec = variant(0)
    for text, ms in ((source_of(spec), 0.3), (source_of(spec) + "// a later template\n", 0.2)):
        store.kernel({**record(spec), "source": text, "source_hash": None})
        store.add_trial(None, spec.name, "sm_90", DENSE, dev, None, ok(ms, DENSE, 0.07), spec.to_dict(),
                        source_hash=store.kernel_record(spec.name, "sm_90")["source_hash"])
    store.close()
    monkeypatch.setenv("GEMMSCAPE_DB", url)
    at = open_page("Kernel")
    assert "2 sources recorded for this name" in texts(at)
    assert [c.value for c in at.code if c.language == "cpp"] == [(source_of(spec) + "// a later template\n").rstrip()]
    assert len(at.dataframe[-1].value) == 1  # the timing of this source only
    older = at.sidebar.selectbox(key="kernel_source").options[1]
    at.sidebar.selectbox(key="kernel_source").set_value(older)
    rerun(at)
    assert [c.value for c in at.code if c.language == "cpp"] == [source_of(spec).rstrip()]
    assert [b.label.rsplit(".", 1)[1] for b in at.download_button] == ["cu", "json"]


@pytest.mark.usefixtures("use_replay_db")
class TestPagesOnReplayedSearch:
    """What a new user met on a store that ``codegen search --replay`` filled."""

    def kernel_page(self, name: str) -> AppTest:
        at = open_page("Kernel")
        at.sidebar.selectbox(key="kernel_name").set_value(name)
        return rerun(at)

    def test_kernel_page_shows_todays_render_of_a_replayed_kernel(self) -> None:
        at = self.kernel_page(STALE.name)
        assert "never compiled" not in texts(at) and "rejected before it was rendered" not in texts(at)
        assert [c.value for c in at.code if c.language == "cpp"] == [render(STALE).rstrip()]
        warning = "\n".join(w.value for w in at.warning)
        assert "Not the measured source" in warning and source_hash(render(STALE))[:12] in warning
        assert "replayed from a recording" in texts(at)
        assert [b.label.rsplit(".", 1)[1] for b in at.download_button] == ["cu", "json"]  # as the CLI exports it
        assert "today's render, not measured" in texts(at)
        measured = Store(os.environ["GEMMSCAPE_DB"], read_only=True).kernel_record(STALE.name)["source_hash"]
        assert (f"the recording {REPLAYED['name']} measured source {measured} (a recording keeps source hashes, not "
                f"sources); today's templates render other source ({source_hash(render(STALE))}): this export, which "
                f"was not measured") in texts(at)  # the label of `codegen export`, word for word

    def test_kernel_page_says_when_todays_render_is_what_was_measured(self) -> None:
        at = self.kernel_page(MATCHING.name)
        assert [c.value for c in at.code if c.language == "cpp"] == [render(MATCHING).rstrip()]
        assert "matches the measured source" in texts(at)
        assert [w.value for w in at.warning if "Recorded results" not in w.value] == []  # the sidebar's note alone
        at = self.kernel_page(UNHASHED.name)
        assert [c.value for c in at.code if c.language == "cpp"] == [render(UNHASHED).rstrip()]
        assert "was not recorded" in "\n".join(w.value for w in at.warning)

    def test_overview_counts_evaluated_trials_and_invalid_points_apart(self) -> None:
        at = open_page("Overview")
        metrics = {m.label: m.value for m in at.metric}
        assert (metrics["trials"], metrics["kernels"]) == (str(REPLAY_EVALUATED), str(REPLAY_EVALUATED))
        assert metrics["invalid points"] == str(REPLAY_INVALID)
        assert f"{REPLAY_EVALUATED} trials (+{REPLAY_INVALID} invalid points" in texts(at)

    def test_overview_shows_kernel_and_winning_family_before_the_device(self) -> None:
        at = open_page("Overview")
        best = at.dataframe[0].value
        assert list(best.columns[:4]) == ["problem", "kernel", "family", "gpu"]
        by = best.set_index("problem")
        assert by.loc[BIG.key, "kernel"] == STALE.name and by.loc[BIG.key, "family"] == "simt"
        assert by.loc[BIG_BF16.key, "family"] == "tensorcore"
        assert by.loc[BIG.key, "gpu"] == "NVIDIA H200 · recorded 2026-11-30"
        assert by.loc[BIG.key, "device"] == REPLAYED["name"]  # the full name, further right
        assert list(best.columns).index("device") > list(best.columns).index("median ms")
        assert by.loc[BIG_BF16.key, "gpu"] == "NVIDIA H200"
        assert "Winning family (of the fastest ok kernel per problem and device): simt 1 · tensorcore 1" in texts(at)

    def test_trials_chart_orders_tile_sizes_as_numbers(self) -> None:
        at = open_page("Trials")
        at.sidebar.multiselect(key="trials_problem").set_value([BIG.key])
        at.selectbox(key="trials_x").set_value("spec.bm")
        rerun(at)
        (chart,) = at.get("vega_lite_chart")[:1]
        spec = json.loads(chart.proto.spec)
        assert spec["encoding"]["x"]["sort"] == ["64", "128", "256"]
        at.sidebar.selectbox(key="trials_param").set_value("bm")
        rerun(at)
        assert at.sidebar.multiselect(key="trials_param_values").options == ["64", "128", "256"]

    def test_history_counts_evaluated_trials_per_run(self) -> None:
        at = open_page("Search history")
        (run,) = at.dataframe[0].value.to_dict("records")
        assert (run["trials"], run["invalid"], run["ok"]) == (REPLAY_EVALUATED - 2, REPLAY_INVALID, REPLAY_EVALUATED - 2)
