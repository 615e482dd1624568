"""Export a kernel as source that runs without gemmscape: ``<name>.cu`` and ``<name>.json``.

The manifest says everything a host program needs: symbol, compile options, headers, the
arguments in order with their C types, block size, dynamic shared memory, the grid for the tuned
shape and the rule for any shape, the problem, and the measured result with device and versions.
The source shipped is the one that was measured (stored with the kernel, by its hash); it is
rendered anew only where none is stored, and the manifest says so. A measurement is never
attached to a source other than the one it measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from codegen.families import compile_target, family_of, spec_from_dict
from codegen.launch import ARG_TYPES, TENSOR_MAP_TYPE, LaunchPlan, bsr_args, grid_rule, plan
from codegen.problem import Layout, Problem
from codegen.render import DTYPE_CUDA, render, source_hash
from codegen.spec import KernelSpec

__all__ = ["MANIFEST_FORMAT", "ExportError", "SourceMismatch", "check_source", "export_files", "export_kernel",
           "manifest", "other_source_note", "source_kernels", "write_export"]

MANIFEST_FORMAT = "gemmscape-kernel/1"
MEASURED_KEYS = ("median_ms", "p20_ms", "p80_ms", "tflops", "gbps", "rel_error", "ratio_cublas", "created")


#: What the arguments of each layout's kernels hold (problem M, N, K as codegen.problem.Layout says).
ARGUMENTS = {
    Layout.forward: "Y[M,N] = X[M,K] * W[N,K]^T (+ B[N]), row-major; B may be null without bias; a 2:4 W is "
                    "passed as WC and WE (see sparse)",
    Layout.grad_input: "DX[M,N] = DY[M,K] * W[K,N], row-major (M batch, N in features, K out features); B is null; "
                       "a block-sparse W is read as WT, Wᵀ in BSR (see sparse)",
    Layout.grad_weight: "DW[M,N] = DY[K,M]^T * X[K,N], row-major (M out features, N in features, K batch); B is "
                        "null; with bias DB[M] = sum over the K rows of DY is written by the _db kernel, or by the main kernel "
                        "where its arguments name DB; with a block-sparse W, DW is written at its kept blocks only, as "
                        "its BSR values (see sparse)",
}


class ExportError(KeyError):
    """The kernel cannot be exported as asked; the message says why and what to do."""

    def __str__(self) -> str:
        return str(self.args[0])


def manifest(spec: KernelSpec, problem: Problem, arch: str, measured: dict | None = None, *,
             source_hash: str | None = None, rerendered: bool = False) -> dict:
    cuda = DTYPE_CUDA[spec.dtype]
    launch = plan(spec, problem)
    block = getattr(spec, "block", 0)
    family_headers = getattr(family_of(spec), "headers", lambda _spec: [])(spec)
    headers = list(dict.fromkeys(([cuda["header"]] if cuda["header"] else []) + family_headers))
    kernels = []
    for step in launch.launches:
        kernels.append({
            "symbol": step.symbol,
            "args": [_argument(a, launch, cuda["ctype"]) for a in step.args],
            "block": list(step.block),
            "dynamic_smem_bytes": step.smem,
            "grid_for_problem": list(step.grid),
            **({"persistent": True if int(step.persistent) == 1 else int(step.persistent),
                "grid_note": "grid_for_problem[0] counts output tiles: launch min(grid_for_problem[0], "
                + ("" if int(step.persistent) == 1 else f"{int(step.persistent)} x ") + "multiprocessor count) blocks" + (
                    f" rounded down to a multiple of {step.cluster[0]}" if step.cluster[0] > 1 else "")
                + ", which loop over them"} if step.persistent else {}),
            **({"cluster": list(step.cluster), "cluster_note": "a thread-block cluster launch: cuLaunchKernelEx with "
                "the attribute CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = cluster (grid_for_problem is in blocks, a "
                "multiple of it)"} if step.cluster != (1, 1, 1) else {}),
        })
    target = compile_target(spec, arch)
    return {
        "format": MANIFEST_FORMAT,
        "name": spec.name,
        "family": spec.family,
        "spec": spec.to_dict(),
        "source_file": f"{spec.name}.cu",
        "source_hash": source_hash,
        "source_rerendered": rerendered,
        "source_note": ("rendered by this export from the current templates: no stored source" if rerendered
                        else "the stored source of the measured kernel"),
        "compile": {"arch": target, "std": "c++17", "defines": {}, "options": [f"-arch={target}", "-std=c++17"]},
        "includes": {
            "headers": headers,
            "note": "CUDA toolkit headers (pass -I<cuda>/include)" if headers else "none",
        },
        "element_type": cuda["ctype"],
        "kernels": kernels,
        "workspace_bytes": launch.workspace_bytes,
        **({"counters": launch.counters,
            "counters_note": "CT is an int32 array of this many tile counters: zero it once before the first launch "
                             "and keep it between launches (every launch leaves it zero); launches in flight at the "
                             "same time need one each"} if launch.counters else {}),
        "zero_output_first": launch.zero_output,
        "grid_rule": grid_rule(spec),
        "arguments_note": ARGUMENTS[problem.layout] + "; WS is the float32 workspace (null when workspace_bytes is 0)"
                          + ("; a CUtensorMap argument is 128 bytes passed by value, encoded on the host with "
                             "cuTensorMapEncodeTiled as its tensor_map says (global address = its operand's "
                             "+ offset_bytes; dims and strides are this problem's)" if launch.tensor_maps else ""),
        "problem": problem.to_dict(),
        **({"sparse": {"format": "BSR", "block": block, "arguments": bsr_args(problem.layout, block,
                                                                        any("BI" in x.args for x in launch.launches)),
                       "pattern": problem.pattern, "density": problem.density}} if block else {}),
        **({"sparse": family_of(spec).manifest_sparse(spec, problem)} if problem.structured else {}),
        "measured": measured,
    }


def _argument(name: str, launch: LaunchPlan, ctype: str) -> dict:
    """One kernel argument of a manifest: its name and C type, and for a tensor map how to encode it."""
    tmap = launch.tensor_map(name)
    if tmap is not None:
        return {"name": name, "type": TENSOR_MAP_TYPE, "tensor_map": tmap.encoding()}
    return {"name": name, "type": ARG_TYPES[name].replace("T*", ctype + "*")}


class SourceMismatch(ExportError):
    """A stored source that does not fit today's launch plan (check_source): measure it again."""


_KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)")


def _parameter_type(text: str, ctype: str) -> str:
    """A C parameter's type, spelled one way: qualifiers that do not change how it is passed dropped,
    the template's element type T and its TensorMap written as the manifest writes them."""
    words = [w for w in re.sub(r"\*", " * ", text).split() if w not in ("__restrict__", "__grid_constant__")][:-1]
    words = [ctype if w == "T" else "CUtensorMap" if w == "TensorMap" else w for w in words]
    return " ".join(words).replace(" *", "*")


def source_kernels(source: str, ctype: str) -> dict[str, list[str]]:
    """The kernels a CUDA source defines: symbol -> its parameters' types in order."""
    return {m[1]: [_parameter_type(p, ctype) for p in m[2].split(",") if p.strip()] for m in _KERNEL.finditer(source)}


def check_source(doc: dict, source: str) -> None:
    """Raise SourceMismatch (an ExportError) unless ``source`` defines every kernel the manifest
    ``doc`` launches, each with the parameter types the manifest passes, in order (a parameter may
    read as const the workspace the plan passes writable; an output never). A stored source is the
    text that was measured, while the launch plan is today's code: where the plan changed (a launch
    added or dropped, an argument retyped or turned from input into output), the stored source no
    longer fits it and must not be run with it. A change to how a kernel is launched therefore shows
    in its symbol or its parameters."""
    ctype = doc["element_type"]
    defined = source_kernels(source, ctype)
    for kernel in doc["kernels"]:
        want = [_parameter_type(a["type"] + " _", ctype) for a in kernel["args"]]
        have = defined.get(kernel["symbol"])
        fits = have is not None and len(have) == len(want) and all(
            h == w or (h == "const " + w and a["name"] == "WS") for h, w, a in zip(have, want, kernel["args"], strict=True))
        if not fits:
            found = "is not defined" if have is None else f"takes ({', '.join(have)})"
            raise SourceMismatch(
                f"the source of {doc['name']} does not fit today's launch plan: {kernel['symbol']} {found}, but the plan "
                f"passes ({', '.join(want)}). It was generated for a different plan; measure it again "
                f"(`codegen bench --kernel {doc['name']} --db ...`) to store today's source")


def export_files(spec: KernelSpec, problem: Problem, source: str | None, arch: str,
                 measured: dict | None = None) -> tuple[str, str]:
    """(.cu text, .json text) for ``source``; without one, the spec is rendered now (and the
    manifest says the source was re-rendered). Raises ExportError where the source does not fit
    the launch plan (check_source)."""
    rerendered = source is None
    text = render(spec) if rerendered else source
    doc = manifest(spec, problem, arch, measured, source_hash=source_hash(text), rerendered=rerendered)
    check_source(doc, text)
    return text, json.dumps(doc, indent=2) + "\n"


def export_kernel(store, kernel_name: str, problem: Problem | None = None, *, arch: str | None = None,
                  source_hash: str | None = None, render_missing: bool = True, device_id: int | None = None,
                  unmeasured_render: bool = False) -> tuple[str, str]:
    """(.cu text, .json text) of a stored kernel with its best ok measurement (for ``problem``, if
    given; of the given arch and source, on the given device, if given). Ships the measured
    kernel's stored source; where none is stored and ``render_missing``, renders it, and refuses
    if that is not the source that was measured, unless ``unmeasured_render``: then the render
    ships with no measurement (``measured`` null) and the manifest's ``measured_other_source``
    says what was measured, of which source, and that it is not this one. Raises ExportError
    saying why an export cannot be made."""
    if store.kernel_record(kernel_name) is None:
        raise ExportError(f"no kernel named {kernel_name} in {store.location}")
    best = store.measured_kernel(kernel_name, problem, arch=arch, source_hash=source_hash, device_id=device_id)
    measured = None
    if best is not None:
        record, trial = best["kernel"], best["trial"]
        problem = problem or Problem.from_dict(trial)
        measured = {k: trial.get(k) for k in MEASURED_KEYS} | {"device": best["device"], "versions": best["versions"]}
    elif problem is None:
        raise ExportError(f"kernel {kernel_name} has no ok measurement; name a problem to export it for")
    else:
        record = store.kernel_record(kernel_name, arch, source_hash)
        if record is None:
            raise ExportError(f"no kernel {kernel_name} of arch {arch or 'any'} and source {source_hash or 'any'} "
                              f"in {store.location}")
    spec = spec_from_dict(record["spec"])
    target = record.get("arch") or "sm_90"
    if record.get("source"):
        return export_files(spec, problem, record["source"], target, measured)
    if not render_missing:
        raise ExportError(f"no source is stored for {kernel_name} (source hash {record.get('source_hash') or 'unknown'}): "
                          f"`codegen export --kernel {kernel_name}` renders it from the templates")
    texts = export_files(spec, problem, None, target, measured)
    rendered = json.loads(texts[1])["source_hash"]
    if measured is not None and rendered != record.get("source_hash") and unmeasured_render:
        cu = texts[0]
        doc = manifest(spec, problem, target, None, source_hash=rendered, rerendered=True)
        doc["source_note"] = ("rendered by this export from the current templates, which no longer render the source "
                              "measured (measured_other_source.source_hash): not measured")
        doc["measured_other_source"] = measured | {
            "source_hash": record.get("source_hash"),
            "note": other_source_note(record.get("source_hash"), rendered, measured["device"]),
        }
        return cu, json.dumps(doc, indent=2) + "\n"
    if measured is not None and rendered != record.get("source_hash"):
        raise ExportError(f"{kernel_name} was measured with source {record.get('source_hash') or 'of unknown hash'}, "
                          f"which is not stored, and the templates now render {rendered[:12]}…: that measurement is "
                          f"not of this source. Measure it again (`codegen bench --kernel {kernel_name} ...`), "
                          f"or export it without a measurement by naming the problem of a kernel never measured")
    return texts


def other_source_note(measured_hash: str | None, rendered: str, device: dict, short: bool = False) -> str:
    """What an export of today's render says where the kernel's measurement was of other source:
    the hash of the source measured (by a recording, where ``device`` is a recording's: it keeps
    hashes, not sources), that today's templates render other source, and that this render was not
    measured. ``short``: the hashes cut to 12 characters, for a line on a terminal."""
    def cut(digest: str | None) -> str:
        return "of unknown hash" if not digest else f"{digest[:12]}…" if short else digest

    if device.get("recorded"):
        what = (f"the recording {device['name']} measured source {cut(measured_hash)} (a recording keeps source "
                f"hashes, not sources)")
    else:
        what = f"measured on {device['name']} with source {cut(measured_hash)}, which is not stored"
    return f"{what}; today's templates render other source ({cut(rendered)}): this export, which was not measured"


def write_export(out_dir: Path, name: str, texts: tuple[str, str]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    cu, js = out_dir / f"{name}.cu", out_dir / f"{name}.json"
    cu.write_text(texts[0])
    js.write_text(texts[1])
    return cu, js
