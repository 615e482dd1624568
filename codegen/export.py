"""Export a kernel as source that runs without gemmscape: ``<name>.cu`` and ``<name>.json``.

The manifest says everything a host program needs: symbol, compile options, headers, the
arguments in order with their C types, block size, dynamic shared memory, the grid for the tuned
shape and the rule for any shape, the problem, and the measured result with device and versions.
"""

from __future__ import annotations

import json
from pathlib import Path

from codegen.launch import ARG_TYPES, grid_rule, plan
from codegen.problem import Problem
from codegen.render import DTYPE_CUDA, render
from codegen.spec import SimtSpec

MANIFEST_FORMAT = "gemmscape-kernel/1"


def manifest(spec: SimtSpec, problem: Problem, arch: str, measured: dict | None = None) -> dict:
    cuda = DTYPE_CUDA[spec.dtype]
    launch = plan(spec, problem)
    kernels = []
    for step in launch.launches:
        kernels.append({
            "symbol": step.symbol,
            "args": [{"name": a, "type": ARG_TYPES[a].replace("T*", cuda["ctype"] + "*")} for a in step.args],
            "block": list(step.block),
            "dynamic_smem_bytes": step.smem,
            "grid_for_problem": list(step.grid),
        })
    return {
        "format": MANIFEST_FORMAT,
        "name": spec.name,
        "spec": spec.to_dict(),
        "source_file": f"{spec.name}.cu",
        "compile": {"arch": arch, "std": "c++17", "defines": {}, "options": [f"-arch={arch}", "-std=c++17"]},
        "includes": {
            "headers": [cuda["header"]] if cuda["header"] else [],
            "note": "CUDA toolkit headers (pass -I<cuda>/include)" if cuda["header"] else "none",
        },
        "element_type": cuda["ctype"],
        "kernels": kernels,
        "workspace_bytes": launch.workspace_bytes,
        "zero_output_first": launch.zero_output,
        "grid_rule": grid_rule(spec),
        "arguments_note": "Y[M,N] = X[M,K] * W[N,K]^T (+ B[N]), row-major; B may be null without bias; "
                          "WS is the float32 workspace (null when workspace_bytes is 0)",
        "problem": problem.to_dict(),
        "measured": measured,
    }


def export_files(spec: SimtSpec, problem: Problem, source: str | None, arch: str,
                 measured: dict | None = None) -> tuple[str, str]:
    source = source or render(spec)
    return source, json.dumps(manifest(spec, problem, arch, measured), indent=2) + "\n"


def export_kernel(store, kernel_name: str, problem: Problem | None = None) -> tuple[str, str]:
    """(.cu text, .json text) of a stored kernel, with its best measurement (for a problem, if given)."""
    record = store.kernel_record(kernel_name)
    if record is None:
        raise KeyError(f"no kernel named {kernel_name} in {store.url}")
    spec = SimtSpec.from_dict(record["spec"])
    rows = [r for r in store.trials(kernel_name=kernel_name, status="ok")
            if problem is None or r["problem"] == problem.key]
    measured = None
    if rows:
        best = min(rows, key=lambda r: r["median_ms"])
        problem = problem or Problem.from_dict(best)
        device = next((d for d in store.devices() if d["id"] == best["device_id"]), {})
        measured = {k: best.get(k) for k in ("median_ms", "p20_ms", "p80_ms", "tflops", "gbps", "rel_error",
                                             "ratio_cublas", "created")}
        measured["device"] = device
        run = next((r for r in store.runs() if r["id"] == best.get("run_id")), None)
        measured["versions"] = run["versions"] if run else {}
    if problem is None:
        raise KeyError(f"kernel {kernel_name} has no ok measurement; name a problem to export it for")
    return export_files(spec, problem, record.get("source"), record.get("arch") or "sm_90", measured)


def write_export(out_dir: Path, name: str, texts: tuple[str, str]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    cu, js = out_dir / f"{name}.cu", out_dir / f"{name}.json"
    cu.write_text(texts[0])
    js.write_text(texts[1])
    return cu, js
