"""CPU tier: the README's quick start end to end without a GPU, and what the commands print.

The replay answers from search/recordings/replay-simt-4096x4096x4096-fp32.json: recorded data,
measured on 2026-11-30 on the lent NVIDIA H200 (driver 580.159.04, NVRTC 13.0) by `codegen sweep`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.cli import errors
from codegen.families.simt import Spec as SimtSpec
from codegen.problem import Problem
from tests.test_cli_errors import DEVICE, add_ok, one_line, run

RECORDING = Path(__file__).resolve().parents[1] / "search" / "recordings" / "replay-simt-4096x4096x4096-fp32.json"
BIG = ["--m", "4096", "--n", "4096", "--k", "4096"]
RECORDED_NAME = "NVIDIA H200 (recorded 2026-11-30, replay-simt-4096x4096x4096-fp32.json)"


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """The quick start's replay search, stored in the default store (GEMMSCAPE_DB) as the README runs it."""
    folder = tmp_path_factory.mktemp("quickstart")
    url = f"sqlite:///{folder / 'gemmscape.db'}"
    env = {**__import__("os").environ, "GEMMSCAPE_DB": url}
    out = subprocess.run([sys.executable, "-m", "codegen", "search", *BIG, "--replay", str(RECORDING),
                          "--sampler", "tpe", "--budget", "12", "--quiet", "--json"],
                         capture_output=True, text=True, timeout=300, env=env, cwd=folder)
    assert out.returncode == 0, out.stderr
    return url, folder, env, out


def test_replay_search_stores_under_a_recorded_device(replayed):
    url, _, _, out = replayed
    summary = json.loads(out.stdout)  # stdout is the JSON alone; the human lines went to stderr
    assert summary["recorded"] is True and summary["device"]["name"] == RECORDED_NAME and summary["store"] == url
    assert "trials evaluated" in out.stderr and f'under the device "{RECORDED_NAME}"' in out.stderr
    from store import Store

    store = Store(url, read_only=True)
    devices = store.devices()
    assert [d["name"] for d in devices] == [RECORDED_NAME] and devices[0]["recorded"] is True
    assert (devices[0]["sm"], devices[0]["driver"], devices[0]["nvrtc"]) == ("sm_90", "580.159.04", "13.0")
    rows = [r for r in store.trials() if r["status"] != "invalid"]
    assert len(rows) == 12 and all(r["recorded"] and r["device"] == RECORDED_NAME for r in rows)
    assert all(r["source_hash"] for r in rows)  # each trial is tied to the source the recording measured
    runs = store.runs()
    assert len(runs) == 1 and RECORDED_NAME in runs[0]["study_name"] and runs[0]["device"] == RECORDED_NAME


def test_live_measurements_of_the_same_gpu_never_mix_with_the_recording(replayed, tmp_path):
    import shutil

    from store import Store

    url, folder, _, _ = replayed
    copy = tmp_path / "mixed.db"
    shutil.copy(folder / "gemmscape.db", copy)
    with Store(f"sqlite:///{copy}") as store:
        add_ok(store, SimtSpec(), Problem(4096, 4096, 4096), DEVICE, 100.0)  # the same H200, measured live
        names = {d["name"]: d["recorded"] for d in store.devices()}
        assert names == {RECORDED_NAME: True, "NVIDIA H200": False}
        live = [r for r in store.trials() if r["device"] == "NVIDIA H200"]
        assert len(live) == 1 and not live[0]["recorded"]
        best = store.best(Problem(4096, 4096, 4096))
        assert {b["device"] for b in best} == {RECORDED_NAME, "NVIDIA H200"}  # one best per device, never merged


def test_replay_with_no_store_writes_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMSCAPE_DB", f"sqlite:///{tmp_path / 'none' / 'g.db'}")
    code, out, err = run(["search", *BIG, "--replay", str(RECORDING), "--budget", "3", "--quiet", "--no-store"], capsys)
    assert code == 0 and "nothing stored (--no-store)" in err and "3 of 3 trials evaluated" in out
    assert not (tmp_path / "none").exists()


def test_results_show_the_replayed_best(replayed, capsys, monkeypatch):
    url, _, _, _ = replayed
    monkeypatch.setenv("GEMMSCAPE_DB", url)
    code, out, err = run(["results"], capsys)
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 2 and "4096x4096x4096_fp32_forward" in lines[1] and lines[1].endswith(RECORDED_NAME)
    assert "recorded" in err
    code, out, err = run(["results", "--json", "--top", "3"], capsys)
    rows = json.loads(out)
    assert code == 0 and len(rows) == 3 and all(r["recorded"] for r in rows) and err == ""
    assert [r["rank"] for r in rows] == [1, 2, 3]


def test_export_best_of_the_replay(replayed, capsys, monkeypatch, tmp_path):
    url, _, _, _ = replayed
    monkeypatch.setenv("GEMMSCAPE_DB", url)
    code, out, err = run(["export", "--best", *BIG, "--out", str(tmp_path / "exported")], capsys)
    assert code == 0, err
    assert out.startswith("wrote ") and f"on {RECORDED_NAME} (a recording, replayed; not measured live)" in err
    (manifest_path,) = (tmp_path / "exported").glob("*.json")
    manifest = json.loads(manifest_path.read_text())
    cu = manifest_path.with_suffix(".cu").read_text()
    assert 'extern "C" __global__' in cu
    # Whether today's templates still render the source the H200 measured is read from the recording
    # itself (each result keeps the hash of its source). Where they do not (the recording's SIMT
    # sources are those of commit 9ad82c1, and the template has changed every one of them since), the
    # measurement is not pinned on this source: it is reported beside it, under the hash of the
    # source it measured, and the export says it is today's render, not measured.
    from codegen.families import spec_from_name
    from codegen.render import render, source_hash

    name = manifest["name"]
    recorded_hash = json.loads(RECORDING.read_text())["results"][name]["source_hash"]
    today = source_hash(render(spec_from_name(name)))
    assert manifest["source_hash"] == today and source_hash(cu) == today
    if recorded_hash != today:
        other = manifest["measured_other_source"]
        assert manifest["measured"] is None and manifest["source_rerendered"] is True
        assert other["device"]["name"] == RECORDED_NAME and other["device"]["recorded"] is True
        assert other["source_hash"] == recorded_hash and other["median_ms"] > 0
        assert other["note"] == (f"the recording {RECORDED_NAME} measured source {recorded_hash} (a recording keeps "
                                 f"source hashes, not sources); today's templates render other source ({today}): "
                                 f"this export, which was not measured")
        assert (f"note: {name}: the recording {RECORDED_NAME} measured source {recorded_hash[:12]}…" in err
                and f"today's templates render other source ({today[:12]}…): this export, which was not measured"
                in err)
    else:
        assert "measured_other_source" not in manifest
        assert manifest["measured"]["device"]["name"] == RECORDED_NAME


def test_app_marks_the_recording(replayed, monkeypatch):
    from streamlit.testing.v1 import AppTest

    url, _, _, _ = replayed
    monkeypatch.setenv("GEMMSCAPE_DB", url)
    main = Path(__file__).resolve().parents[1] / "app" / "main.py"
    at = AppTest.from_file(str(main), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    warnings = " ".join(str(w.value) for w in at.sidebar.warning)
    assert "Recorded results" in warnings and RECORDED_NAME in warnings
    best = at.dataframe[0].value
    assert list(best["measured"]) == ["recording (replayed)"] and list(best["device"]) == [RECORDED_NAME]
    assert at.get("vega_lite_chart"), "the recorded H200's roofline is drawn with the H200's ceilings"


def test_app_counts_and_shows_the_replay_as_the_cli_does(replayed, monkeypatch):
    """On the store the quick start's replay left: the overview counts the trials the search said it
    evaluated (invalid points apart), and the Kernel page of the replayed best shows today's render
    of its spec, said not to be the source measured (never "never compiled")."""
    from streamlit.testing.v1 import AppTest

    url, _, _, out = replayed
    summary = json.loads(out.stdout)
    monkeypatch.setenv("GEMMSCAPE_DB", url)
    main = Path(__file__).resolve().parents[1] / "app" / "main.py"
    at = AppTest.from_file(str(main), default_timeout=60).run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["trials"] == str(summary["evaluated"]) == "12"
    at.switch_page("pages/kernel.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.sidebar.selectbox(key="kernel_name").value == summary["best"]["kernel"]
    shown = " ".join(str(e.value) for e in [*at.info, *at.warning, *at.caption, *at.markdown])
    assert "never compiled" not in shown and "rejected before it was rendered" not in shown
    assert [c for c in at.code if c.language == "cpp"], "today's render of the replayed best is shown"


def test_app_refuses_a_missing_named_store_as_results_does(capsys, tmp_path, monkeypatch):
    """One message, from one place, for a store named to be read that is not there: what it is and
    what to do; exit 1 (nothing found) from app as from results, and the dashboard is not started."""
    from app import launch

    monkeypatch.setattr(launch, "run", lambda *a: pytest.fail("the dashboard started"))
    url = f"sqlite:///{tmp_path / 'nope.db'}"
    said = {}
    for command in ("app", "results"):
        code, out, err = run([command, "--db", url], capsys)
        assert code == errors.EXIT_FAILURE and out == ""
        said[command] = one_line(err).removeprefix(f"codegen {command}: ")
    assert said["app"] == said["results"]
    assert said["app"].startswith(f"no gemmscape database at {tmp_path / 'nope.db'}: run a search first")
    assert "--db URL or the GEMMSCAPE_DB environment variable" in said["app"]
    assert not (tmp_path / "nope.db").exists()


# ---- export --best over several devices ------------------------------------------------------------
@pytest.fixture
def two_devices(tmp_path):
    """Kernel A on the first device (slower), kernel B on the second (faster)."""
    from store import Store

    problem = Problem(64, 64, 64)
    a = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4)
    b = SimtSpec(bm=64, bn=64, bk=8, wm=16, wn=32, tm=4, tn=4)
    url = f"sqlite:///{tmp_path / 'two.db'}"
    with Store(url) as store:
        add_ok(store, a, problem, DEVICE, 0.020)
        add_ok(store, b, problem, {**DEVICE, "name": "NVIDIA B200", "sm": "sm_100"}, 0.010)
        add_ok(store, a, problem, {**DEVICE, "name": "NVIDIA B200", "sm": "sm_100"}, 0.015)
    return url, problem, a, b


def test_export_best_takes_the_fastest_over_all_devices_and_says_where(two_devices, capsys, tmp_path):
    url, _, a, b = two_devices
    base = ["export", "--best", "--m", "64", "--n", "64", "--k", "64", "--db", url]
    code, _, err = run([*base, "--out", str(tmp_path / "all")], capsys)
    assert code == 0, err
    assert f"{b.name}, 10.0 us" in err and "on NVIDIA B200" in err and "fastest over 2 devices" in err
    manifest = json.loads((tmp_path / "all" / f"{b.name}.json").read_text())
    assert manifest["measured"]["device"]["name"] == "NVIDIA B200"

    for choice in ("NVIDIA H200", "1", "h200"):  # by name, id, or a unique part of the name
        code, _, err = run([*base, "--device", choice, "--out", str(tmp_path / choice)], capsys)
        assert code == 0, err
        manifest = json.loads((tmp_path / choice / f"{a.name}.json").read_text())
        assert manifest["measured"]["device"]["name"] == "NVIDIA H200"
        assert manifest["measured"]["median_ms"] == pytest.approx(0.020)

    code, _, err = run(["export", "--kernel", a.name, "--device", "NVIDIA B200", "--db", url,
                        "--out", str(tmp_path / "k")], capsys)
    assert code == 0, err
    manifest = json.loads((tmp_path / "k" / f"{a.name}.json").read_text())
    assert manifest["measured"]["median_ms"] == pytest.approx(0.015)  # its measurement on that device

    code, _, err = run([*base, "--device", "NVIDIA", "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "no single device 'NVIDIA'" in one_line(err) and "1 NVIDIA H200; 2 NVIDIA B200" in err
    code, _, err = run([*base, "--device", "9", "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and not (tmp_path / "x").exists()


def test_export_best_with_nothing_stored_is_exit_1(two_devices, capsys, tmp_path):
    url, _, _, _ = two_devices
    code, _, err = run(["export", "--best", "--m", "8", "--n", "8", "--k", "8", "--db", url,
                        "--out", str(tmp_path / "x")], capsys)
    assert code == 1 and "no ok kernel stored for 8x8x8" in one_line(err) and not (tmp_path / "x").exists()


def test_results_of_an_empty_store(capsys, tmp_path):
    from store import Store

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    Store(url).close()
    code, out, err = run(["results", "--db", url], capsys)
    assert code == 1 and out == "" and "no results" in one_line(err)
    code, out, err = run(["results", "--db", url, "--json"], capsys)
    assert code == 1 and json.loads(out) == [] and err == ""


def test_compile_json_is_pure_json(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMSCAPE_CACHE", str(tmp_path / "cache"))
    code, out, err = run(["compile", "--arch", "sm_90", "--json", "--source"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["name"] == SimtSpec().name and 'extern "C"' in doc["source"]


def test_main_module_runs_and_exit_code_passes_through(tmp_path):
    out = subprocess.run([sys.executable, "-m", "codegen", "results", "--top", "0"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1
    assert errors.EXIT_USAGE == 2


# ---- what the README's commands write stays out of git ----------------------------------------------
def test_the_readme_s_output_folders_are_ignored_by_git():
    """Every folder the README's commands write into (``--out DIR/``, ``--bundle DIR/``, relative to
    the repository, as the quick start runs them) is ignored by git, so a quick start leaves the
    checkout clean."""
    import re
    import shutil

    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    readme = (root / "README.md").read_text()
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", readme, re.S))
    folders = sorted(set(re.findall(r"--(?:out|bundle) ([A-Za-z_][\w.-]*/)", blocks)))
    assert "exported/" in folders and "kernels/" in folders
    for folder in folders:
        probe = f"{folder}some_kernel.cu"
        ignored = subprocess.run(["git", "check-ignore", "-q", probe], cwd=root)
        assert ignored.returncode == 0, f"{probe} (written by a README command) is not ignored by git"


# ---- codegen app: the port is checked before the URL is printed and the server started ----------------
def test_app_on_a_busy_port_is_one_line_and_starts_nothing(db, capsys, monkeypatch):
    import socket

    from app import launch

    started = []
    monkeypatch.setattr(launch, "run", lambda url, port: started.append(port) or 0)
    url, _ = db
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, out, err = run(["app", "--db", url, "--port", str(port)], capsys)
        assert code == errors.EXIT_USAGE and out == "" and started == []
        line = one_line(err)
        assert line == (f"codegen app: port {port} on 127.0.0.1 is in use (another dashboard?): stop what holds it, "
                        f"or choose another with --port N")
        assert "http://" not in err
    code, _, err = run(["app", "--db", url, "--port", str(port)], capsys)  # free again: the URL, then the server
    assert code == 0 and started == [port] and f"dashboard on http://127.0.0.1:{port}" in one_line(err)
