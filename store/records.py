"""Rows to plain dicts: what every reader of the store gets back."""

from __future__ import annotations

import zlib
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import inspect

from codegen.problem import SPARSITIES
from codegen.problem import Problem as ProblemKey
from codegen.sparse import Pattern as SparsePattern
from store.models import Device, Kernel, Pattern, Problem, Run, Trial

RESULT_KEYS = (
    "status", "evidence", "median_ms", "p20_ms", "p80_ms", "times_ms",
    "tflops", "gbps", "rel_error", "baselines", "ratio",
)  # fmt: skip


#: What a device's name carries when its results were replayed from a recording, not measured live:
#: ``"NVIDIA H200 (recorded 2026-11-30, replay-simt-4096x4096x4096-fp32.json)"``.
RECORDED_MARK = " (recorded "


def recorded_device_name(name: str, when: str, source: str) -> str:
    """The name under which replayed results of ``name`` are stored (a device row of their own)."""
    return f"{name}{RECORDED_MARK}{when[:10]}, {source})"


def is_recorded(device_name: str | None) -> bool:
    """Whether results under this device name came from a recording (a replay), not a live run."""
    return bool(device_name) and RECORDED_MARK in device_name and device_name.endswith(")")


def measured_on(device_name: str) -> str:
    """The GPU a (possibly recorded) device name stands for: the name without the recording note."""
    return device_name.split(RECORDED_MARK, 1)[0] if is_recorded(device_name) else device_name


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def device_dict(d: Device) -> dict[str, Any]:
    return {"id": d.id, "name": d.name, "sm": d.sm, "driver": d.driver, "nvrtc": d.nvrtc,
            "recorded": is_recorded(d.name)}


def pattern_hash(p: Problem) -> str | None:
    """The problem's pattern hash; None for a dense problem, and for every problem of an older
    store opened read-only (its reads leave the missing column unloaded, see store.queries)."""
    if "pattern" in inspect(p).unloaded:
        return None
    return p.pattern


#: A W of a structured sparsity (codegen.problem.SPARSITIES, e.g. 2:4) has no pattern of blocks: the
#: ``pattern`` column holds the sparsity's name instead, and reads give it back as ``sparsity``.
STRUCTURED = tuple(s for s in SPARSITIES if s)


def pattern_column(problem: ProblemKey) -> str | None:
    """What a problem's ``pattern`` column holds: a block-sparse W's pattern hash, a structured W's
    sparsity (e.g. "2:4"), None for a dense W."""
    return problem.pattern or problem.sparsity or None


def sparsity_fields(p: Problem) -> dict[str, Any]:
    """``pattern`` and, for a structured-sparse W, ``sparsity`` of a problem row (``pattern_column``)."""
    value = pattern_hash(p)
    return {"pattern": None, "sparsity": value} if value in STRUCTURED else {"pattern": value}


def problem_dict(p: Problem) -> dict[str, Any]:
    return {
        "id": p.id, "key": p.key, "m": p.m, "n": p.n, "k": p.k, "dtype": p.dtype,
        "layout": p.layout, "bias": p.bias, "density": p.density, "block": p.block, **sparsity_fields(p),
    }  # fmt: skip


# ---- block-sparse patterns ----------------------------------------------------------------------
def pack_indices(values: np.ndarray) -> bytes:
    """int32 little-endian, zlib-compressed: how ``gs_patterns`` keeps indptr and indices."""
    return zlib.compress(np.ascontiguousarray(values, dtype="<i4").tobytes())


def unpack_indices(blob: bytes) -> np.ndarray:
    return np.frombuffer(zlib.decompress(blob), dtype="<i4").astype(np.int32)


def pattern_row(pattern: SparsePattern) -> Pattern:
    return Pattern(hash=pattern.hash, n=pattern.n, k=pattern.k, block=pattern.block, nnzb=pattern.nnzb,
                   density=pattern.density, indptr=pack_indices(pattern.indptr),
                   indices=pack_indices(pattern.indices))  # fmt: skip


def pattern_of(row: Pattern) -> SparsePattern:
    """The codegen.sparse.Pattern a row keeps; ValueError when the row does not rebuild into the
    pattern of its hash (a damaged row)."""
    from codegen.sparse import Pattern as SparsePattern

    pattern = SparsePattern(row.n, row.k, row.block, unpack_indices(row.indptr), unpack_indices(row.indices))
    if pattern.hash != row.hash or pattern.nnzb != row.nnzb:
        raise ValueError(f"stored pattern {row.hash} rebuilds into {pattern.hash} with {pattern.nnzb} blocks "
                         f"(stored: {row.nnzb}): the row is damaged")
    return pattern


def pattern_dict(row: Pattern) -> dict[str, Any]:
    """A pattern's summary (no structure): hash, n, k, block, nnzb, density, created."""
    return {"hash": row.hash, "n": row.n, "k": row.k, "block": row.block, "nnzb": row.nnzb, "density": row.density,
            "created": _iso(row.created)}  # fmt: skip


def kernel_dict(k: Kernel) -> dict[str, Any]:
    return {
        "id": k.id, "name": k.name, "family": k.family, "arch": k.arch, "spec": dict(k.spec or {}),
        "source": k.source, "source_hash": k.source_hash, "options": list(k.options or []),
        "report": k.report, "log": k.log,
    }  # fmt: skip


def result_dict(t: Trial) -> dict[str, Any]:
    """The result as the runtime handed it in (see the ``add_trial`` docstring)."""
    return {
        "status": t.status, "evidence": t.evidence or "", "median_ms": t.median_ms, "p20_ms": t.p20_ms,
        "p80_ms": t.p80_ms, "times_ms": list(t.times_ms or []), "tflops": t.tflops, "gbps": t.gbps,
        "rel_error": t.rel_error, "baselines": dict(t.baselines or {}), "ratio": dict(t.ratios or {}),
    }  # fmt: skip


def trial_dict(t: Trial) -> dict[str, Any]:
    """One flat row per trial (friendly to a DataFrame), with the spec under ``params``."""
    p = t.problem
    row: dict[str, Any] = {
        "id": t.id, "run_id": t.run_id, "number": t.number, "created": _iso(t.created), "kernel_id": t.kernel_id,
        "kernel": t.kernel.name, "family": t.kernel.family, "arch": t.kernel.arch,
        "source_hash": t.kernel.source_hash,
        "problem": p.key, "problem_id": p.id, "m": p.m, "n": p.n, "k": p.k, "dtype": p.dtype,
        "layout": p.layout, "bias": p.bias, "density": p.density, "block": p.block, **sparsity_fields(p),
        "device": t.device.name, "device_id": t.device_id, "recorded": is_recorded(t.device.name),
        "ratio_cublas": t.ratio_cublas,
        "params": dict(t.params or {}),
    }  # fmt: skip
    row.update(result_dict(t))
    return row


def run_dict(r: Run, counts: dict[str, Any] | None = None) -> dict[str, Any]:
    counts = counts or {}
    return {
        "id": r.id, "problem": r.problem.key, "problem_id": r.problem_id, "device": r.device.name,
        "device_id": r.device_id, "family": r.family, "sampler": r.sampler, "seed": r.seed,
        "budget": r.budget, "study_name": r.study_name, "versions": dict(r.versions or {}),
        "command": r.command, "started": _iso(r.started), "ended": _iso(r.ended),
        "trials": counts.get("trials", 0), "ok": counts.get("ok", 0), "best_ms": counts.get("best_ms"),
    }  # fmt: skip
