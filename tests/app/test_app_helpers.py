"""The dashboard's pure pieces: launcher command, roofline place, break-even, importances."""

from __future__ import annotations

import pytest

from app import launch
from app.frames import best_so_far, filter_param, trials_frame
from app.importance import param_importances
from app.roofline import place
from app.sparsity import break_even


def test_launch_binds_loopback_headless_and_passes_the_database() -> None:
    cmd = launch.command(8777)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4].endswith("app/main.py")
    flags = dict(zip(cmd[5::2], cmd[6::2], strict=True))
    assert flags["--server.address"] == "127.0.0.1" and flags["--server.port"] == "8777"
    assert flags["--server.headless"] == "true"
    assert launch.environment("sqlite:////x/y.db")["GEMMSCAPE_DB"] == "sqlite:////x/y.db"


def test_launch_keeps_the_environment_without_a_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMMSCAPE_DB", "sqlite:////from/env.db")
    assert launch.environment(None)["GEMMSCAPE_DB"] == "sqlite:////from/env.db"


def row(**kw: object) -> dict:
    return {"m": 4096, "n": 4096, "k": 4096, "dtype": "fp32", "bias": False, "density": 1.0,
            "device": "NVIDIA H200", "tflops": 46.6, "gbps": 68.0} | kw  # fmt: skip


def test_roofline_place_on_the_h200() -> None:
    big = place(row())
    assert big["bound"] == "compute" and big["of_compute"] == pytest.approx(46.6 / 67)
    assert big["of_roofline"] == pytest.approx(46.6 / 67)
    skinny = place(row(m=32, dtype="bf16", tflops=55.6, gbps=1700.0))
    assert skinny["bound"] == "memory"
    assert skinny["of_bandwidth"] == pytest.approx(1700 / 4270)
    assert skinny["of_roofline"] == pytest.approx(55.6 / (skinny["intensity"] * 4.27))


def test_roofline_unknown_device_says_so() -> None:
    unknown = place(row(device="Some Other GPU"))
    assert unknown["ceilings"] == "unknown for this device" and unknown["of_compute"] is None
    assert place(row(dtype="fp8"))["intensity"] is None  # a dtype this version cannot size


def test_break_even_interpolates_and_says_when_it_cannot() -> None:
    assert break_even([(0.1, 3.0), (0.5, 0.6), (0.25, 1.4)])[0] == pytest.approx(0.25 + 0.4 / 0.8 * 0.25)
    assert break_even([(0.1, 0.5), (0.2, 0.4)]) == (None, "slower than dense at every measured density (down to 0.1)")
    assert break_even([(0.1, 2.0), (0.3, 1.5)])[0] == 0.3
    assert break_even([]) == (None, "no points")


def trial(i: int, status: str = "ok", **params: object) -> dict:
    return {"id": i, "number": i, "status": status, "tflops": float(i) if status == "ok" else None,
            "params": {"family": "simt", **params}}  # fmt: skip


def test_best_so_far_carries_over_failures() -> None:
    rows = [trial(0, bm=1), trial(1, "timeout"), trial(3), trial(2)]
    curve = best_so_far(rows, "run")
    assert list(curve["trial"]) == [0, 1, 2, 3]
    assert list(curve["best_tflops"]) == [0.0, 0.0, 2.0, 3.0]


def test_param_filter_compares_as_text() -> None:
    frame = trials_frame([trial(0, bm=64) | {"kernel": "a"}, trial(1, bm=128) | {"kernel": "b"}])
    assert list(filter_param(frame, "spec.bm", ["128"])["kernel"]) == ["b"]
    assert len(filter_param(frame, "spec.bm", [])) == 2


def test_importances_need_enough_varying_trials() -> None:
    few = [trial(i, bm=i) for i in range(1, 4)]
    assert param_importances(few)[0] is None and "at least 5" in param_importances(few)[1]
    flat = [trial(i, bm=64) for i in range(1, 9)]
    assert param_importances(flat) == (None, "No spec parameter varies across the matching ok trials.")
    rows = [trial(i, bm=16 * (i % 4 + 1), pad=i % 2) for i in range(1, 25)]
    found, note = param_importances(rows)
    assert set(found) == {"bm", "pad"} and sum(found.values()) == pytest.approx(1.0)
    assert "Optuna" in note and "24 ok trials" in note
