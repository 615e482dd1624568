"""Rows to plain dicts: what every reader of the store gets back."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from store.models import Device, Kernel, Problem, Run, Trial

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


def problem_dict(p: Problem) -> dict[str, Any]:
    return {
        "id": p.id, "key": p.key, "m": p.m, "n": p.n, "k": p.k, "dtype": p.dtype,
        "layout": p.layout, "bias": p.bias, "density": p.density, "block": p.block,
    }  # fmt: skip


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
        "layout": p.layout, "bias": p.bias, "density": p.density, "block": p.block,
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
