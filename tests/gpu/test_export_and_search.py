"""GPU tier: an exported kernel runs from its manifest alone; a real search stores and resumes."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

from codegen.export import export_files
from codegen.families.simt import Spec as SimtSpec
from codegen.problem import Problem

pytestmark = pytest.mark.gpu


#: numpy storage of each manifest element type (bf16 as its 16 raw bits).
_STORAGE = {"float": np.float32, "__half": np.float16, "__nv_bfloat16": np.uint16}


def _launch_from_manifest(cu: str, manifest: dict, x, w, b, runs: int = 2, operands: dict | None = None) -> np.ndarray:
    """Compile and run with cuda-python and the manifest only (no gemmscape code): X, W, B given in
    the manifest's element type (numpy storage; W may be None where the kernel takes ``operands``,
    other arrays uploaded as they are, e.g. a 2:4 W's WC and WE), Y returned in it after ``runs`` runs of its launches
    (the second shows that state a run keeps, such as tile counters, is left as the note says). Tensor-map arguments are encoded
    as the manifest says; a persistent launch gets at most one block per multiprocessor (in whole
    clusters); a kernel with a cluster is launched with cuLaunchKernelEx."""
    from cuda.bindings import driver, nvrtc

    from codegen.compile import include_dirs  # only to find the CUDA headers on this machine

    def ok(res):
        err, *vals = res if isinstance(res, tuple) else (res,)
        assert int(err) == 0, err
        return vals[0] if len(vals) == 1 else vals

    opts = [o.encode() for o in manifest["compile"]["options"]]
    if manifest["includes"]["headers"]:
        opts += [f"-I{d}".encode() for d in include_dirs()]
    prog = ok(nvrtc.nvrtcCreateProgram(cu.encode(), manifest["source_file"].encode(), 0, [], []))
    assert int(nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]) == 0
    cubin = b" " * ok(nvrtc.nvrtcGetCUBINSize(prog))
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    ok(driver.cuInit(0))
    device = ok(driver.cuDeviceGet(0))
    ctx = ok(driver.cuDevicePrimaryCtxRetain(device))
    ok(driver.cuCtxSetCurrent(ctx))
    sms = ok(driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device))
    module = ok(driver.cuModuleLoadData(cubin))
    p = manifest["problem"]
    m, n, k = p["m"], p["n"], p["k"]
    storage = _STORAGE[manifest["element_type"]]

    def upload(a, dtype=storage):
        a = np.ascontiguousarray(a, dtype=dtype)
        ptr = ok(driver.cuMemAlloc(a.nbytes))
        ok(driver.cuMemcpyHtoD(ptr, a.ctypes.data, a.nbytes))
        return ptr

    y = np.empty((m, n), storage)
    ptrs = {"X": upload(x), "W": upload(w) if w is not None else 0, "B": upload(b) if b is not None else 0,
            **{name: upload(a, a.dtype) for name, a in (operands or {}).items()},
            "Y": ok(driver.cuMemAlloc(y.nbytes)),
            "WS": ok(driver.cuMemAlloc(manifest["workspace_bytes"])) if manifest["workspace_bytes"] else 0,
            "CT": ok(driver.cuMemAlloc(4 * manifest["counters"])) if manifest.get("counters") else 0}
    if ptrs["CT"]:  # zeroed once, as the counters_note says; each launch leaves them zero
        ok(driver.cuMemsetD8(ptrs["CT"], 0, 4 * manifest["counters"]))
    dims = {"M": m, "N": n, "K": k}

    def tensor_map(t: dict):
        assert t["encode"] == "cuTensorMapEncodeTiled"
        enum = lambda kind, name: getattr(getattr(driver, kind), name)  # noqa: E731
        tmap = ok(driver.cuTensorMapEncodeTiled(
            enum("CUtensorMapDataType", t["data_type"]), t["rank"], int(ptrs[t["operand"]]) + t["offset_bytes"],
            [driver.cuuint64_t(v) for v in t["global_dim"]], [driver.cuuint64_t(v) for v in t["global_strides_bytes"]],
            [driver.cuuint32_t(v) for v in t["box_dim"]], [driver.cuuint32_t(v) for v in t["element_strides"]],
            enum("CUtensorMapInterleave", t["interleave"]), enum("CUtensorMapSwizzle", t["swizzle"]),
            enum("CUtensorMapL2promotion", t["l2_promotion"]), enum("CUtensorMapFloatOOBfill", t["oob_fill"])))
        return (ctypes.c_ubyte * 128).from_buffer_copy(ctypes.string_at(tmap.getPtr(), 128))

    for kern in [k for _ in range(runs) for k in manifest["kernels"]]:
        if kern is manifest["kernels"][0] and manifest["zero_output_first"]:
            ok(driver.cuMemsetD8(ptrs["Y"], 0, y.nbytes))
        func = ok(driver.cuModuleGetFunction(module, kern["symbol"].encode()))
        if kern["dynamic_smem_bytes"] > 48 * 1024:
            ok(driver.cuFuncSetAttribute(func, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         kern["dynamic_smem_bytes"]))
        vals = [tensor_map(a["tensor_map"]) if "tensor_map" in a
                else ctypes.c_int(dims[a["name"]]) if a["type"] == "int" else ctypes.c_void_p(int(ptrs[a["name"]]))
                for a in kern["args"]]
        arr = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        grid = list(kern["grid_for_problem"])
        cluster = kern.get("cluster", [1, 1, 1])
        if kern.get("persistent"):
            grid[0] = max(cluster[0], min(grid[0], sms) // cluster[0] * cluster[0])
        if cluster == [1, 1, 1]:
            ok(driver.cuLaunchKernel(func, *grid, *kern["block"], kern["dynamic_smem_bytes"],
                                     driver.CUstream(0), ctypes.addressof(arr), 0))
            continue
        attr = driver.CUlaunchAttribute()  # a thread-block cluster launch, as the manifest's cluster_note says
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        config = driver.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = kern["block"]
        config.sharedMemBytes, config.hStream = kern["dynamic_smem_bytes"], driver.CUstream(0)
        config.attrs, config.numAttrs = [attr], 1
        ok(driver.cuLaunchKernelEx(config, func, ctypes.addressof(arr), 0))
    ok(driver.cuCtxSynchronize())
    ok(driver.cuMemcpyDtoH(y.ctypes.data, ptrs["Y"], y.nbytes))
    for ptr in ptrs.values():
        if ptr:
            driver.cuMemFree(ptr)
    driver.cuModuleUnload(module)
    return y


@pytest.mark.parametrize("split", [(1, "none"), (4, "atomic"), (3, "two_pass"), (3, "last")])
def test_exported_kernel_runs_from_its_manifest_alone(split):
    problem = Problem(67, 45, 91, bias=True)
    spec = SimtSpec(bias=True, bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, pad=4, vec=4, stages=2,
                    split_k=split[0], reduce=split[1])
    cu, js = export_files(spec, problem, None, "sm_90")
    manifest = json.loads(js)
    rng = np.random.default_rng()
    x = rng.uniform(-1, 1, (67, 91)).astype(np.float32)
    w = rng.uniform(-1, 1, (45, 91)).astype(np.float32)
    b = rng.uniform(-1, 1, 45).astype(np.float32)
    y = _launch_from_manifest(cu, manifest, x, w, b)
    ref = x.astype(np.float64) @ w.astype(np.float64).T + b
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5


def test_real_search_stores_every_trial_and_resumes(tmp_path):
    from search.measure import GpuMeasurer
    from search.runner import run_search
    from search.space import space_for
    from store import Store

    problem = Problem(512, 512, 512)
    store = Store(f"sqlite:///{tmp_path / 'g.db'}")
    space = space_for("simt", problem.dtype, restricted=True)
    timing = {"reps_min": 5, "reps_max": 5, "target_ms": 1.0}
    measurer = GpuMeasurer(problem, timing=timing, baseline=False, compile_workers=4)
    try:
        first = run_search(problem, space, measurer, budget=6, store=store, progress=False)
        second = run_search(problem, space, measurer, budget=10, store=store, progress=False)
    finally:
        measurer.close()
    assert (first.evaluated, second.evaluated, second.evaluated_now) == (6, 10, 4)
    rows = [r for r in store.trials() if r["status"] != "invalid"]
    assert len(rows) == 10 and len({r["kernel"] for r in rows}) == 10
    assert store.best(problem)[0]["tflops"] == pytest.approx(second.best["tflops"])


def test_two_gpu_workers_share_one_study(tmp_path):
    """``--gpus`` with one GPU lent: two workers (each its own GPU process) on GPU 0 over one study."""
    from search.measure import GpuMeasurer
    from search.parallel import ParallelMeasurer
    from search.runner import run_search
    from search.space import space_for
    from store import Store

    problem = Problem(384, 640, 256, bias=True)
    store = Store(f"sqlite:///{tmp_path / 'two.db'}")
    timing = {"reps_min": 5, "reps_max": 5, "target_ms": 1.0}
    workers = [GpuMeasurer(problem, ordinal=0, timing=timing, baseline=False, compile_workers=2) for _ in range(2)]
    measurer = ParallelMeasurer(workers)
    try:
        summary = run_search(problem, space_for("simt", problem.dtype, restricted=True), measurer, budget=12,
                             store=store, progress=False)
    finally:
        measurer.close()
    assert summary.evaluated == 12 and summary.stopped == "budget reached"
    assert all(n > 0 for n in measurer.measured_by) and sum(measurer.measured_by) == 12, measurer.measured_by
    rows = [r for r in store.trials() if r["status"] != "invalid"]
    assert len(rows) == 12 and len({r["kernel"] for r in rows}) == 12
    assert sum(r["status"] == "ok" for r in rows) >= 6, [r["status"] for r in rows]
    assert store.best(problem)[0]["tflops"] == pytest.approx(summary.best["tflops"])
