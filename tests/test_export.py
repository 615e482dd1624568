"""Export: a stored kernel becomes <name>.cu + <name>.json that compile with plain NVRTC."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from codegen.evaluate import build
from codegen.families.simt import Spec as SimtSpec
from codegen.problem import DType, Problem


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """A store holding two kernels for one problem, built through the store's own API."""
    from store import Store

    monkeypatch.setenv("GEMMSCAPE_CACHE", str(tmp_path / "cache"))
    url = f"sqlite:///{tmp_path / 'e.db'}"
    store = Store(url)
    problem = Problem(67, 45, 91, DType.bf16, bias=True)
    device = store.device({"name": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "nvrtc": "13.0"})
    run = store.start_run(problem, device, "simt", "tpe", 0, 2, "s", {"gemmscape": "test"}, "codegen search ...")
    specs = [SimtSpec(dtype=DType.bf16, bias=True, bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, vec=8,
                      split_k=3, reduce="two_pass"),
             SimtSpec(dtype=DType.bf16, bias=True, bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, vec=8)]
    for i, (spec, ms) in enumerate(zip(specs, (0.010, 0.020), strict=True)):
        built = build(spec, problem, "sm_90")
        store.kernel(built.kernel_record())
        result = {"status": "ok", "evidence": "", "median_ms": ms, "p20_ms": ms, "p80_ms": ms, "times_ms": [ms],
                  "tflops": problem.flops / ms / 1e9, "gbps": 1.0, "rel_error": 1e-3,
                  "baselines": {"cublas": {"median_ms": 0.02, "p20_ms": 0.02, "p80_ms": 0.02}},
                  "ratio": {"cublas": 0.02 / ms}}
        store.add_trial(run, spec.name, "sm_90", problem, device, i, result, spec.to_dict(),
                        source_hash=built.kernel_record()["source_hash"])
    return url, problem, specs


def test_export_best_writes_a_self_contained_pair(stored, tmp_path):
    url, problem, specs = stored
    out = subprocess.run([sys.executable, "-m", "codegen", "export", "--best", "--m", "67", "--n", "45", "--k", "91",
                          "--dtype", "bf16", "--bias", "--db", url, "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    name = specs[0].name  # the faster one
    cu = (tmp_path / "x" / f"{name}.cu").read_text()
    manifest = json.loads((tmp_path / "x" / f"{name}.json").read_text())
    assert 'extern "C" __global__' in cu and "gemmscape" not in manifest["includes"]["note"]
    assert [k["symbol"] for k in manifest["kernels"]] == [name, name + "_reduce"]
    assert [a["name"] for a in manifest["kernels"][0]["args"]] == ["Y", "X", "W", "B", "WS", "M", "N", "K"]
    assert manifest["kernels"][0]["args"][0]["type"] == "__nv_bfloat16*"
    assert manifest["workspace_bytes"] == 4 * 3 * 67 * 45
    assert manifest["kernels"][0]["grid_for_problem"] == [3 * 1, 3, 1]
    assert manifest["measured"]["median_ms"] == pytest.approx(0.010)
    assert manifest["measured"]["device"]["name"] == "NVIDIA H200"
    assert manifest["problem"] == problem.to_dict()
    assert "ceil(M/32)" in manifest["grid_rule"]

    # Plain NVRTC with only what the manifest says (plus where this machine keeps CUDA headers).
    from cuda.bindings import nvrtc

    from codegen.compile import include_dirs

    opts = [o.encode() for o in manifest["compile"]["options"]] + [f"-I{d}".encode() for d in include_dirs()]
    assert manifest["includes"]["headers"] == ["cuda_bf16.h"]
    err, prog = nvrtc.nvrtcCreateProgram(cu.encode(), manifest["source_file"].encode(), 0, [], [])
    (status,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    assert status == nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, size = nvrtc.nvrtcGetCUBINSize(prog)
    cubin = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    for kernel in manifest["kernels"]:
        assert kernel["symbol"].encode() in cubin


def test_export_by_name_and_clear_errors(stored, tmp_path):
    url, _, specs = stored
    ok = subprocess.run([sys.executable, "-m", "codegen", "export", "--kernel", specs[1].name, "--db", url,
                         "--out", str(tmp_path / "y")], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "y" / f"{specs[1].name}.json").is_file()
    missing = subprocess.run([sys.executable, "-m", "codegen", "export", "--kernel", "simt_nope", "--db", url,
                              "--out", str(tmp_path / "z")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "no kernel named simt_nope" in missing.stderr


def test_results_table_lists_the_best_per_problem(stored):
    url, problem, specs = stored
    out = subprocess.run([sys.executable, "-m", "codegen", "results", "--db", url], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.strip().splitlines()
    assert len(rows) == 2 and problem.key in rows[1] and specs[0].name in rows[1] and "2.000" in rows[1]
    js = subprocess.run([sys.executable, "-m", "codegen", "results", "--db", url, "--json"], capture_output=True,
                        text=True, timeout=120)
    assert json.loads(js.stdout)[0]["kernel"] == specs[0].name
