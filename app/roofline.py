"""Where a result sits against a device's two roofline limits: compute rate and bandwidth."""

from __future__ import annotations

from dataclasses import dataclass

from codegen.problem import Problem
from store.records import measured_on


@dataclass(frozen=True)
class Ceiling:
    value: float  # TFLOP/s for compute, TB/s for bandwidth
    source: str


@dataclass(frozen=True)
class DeviceCeilings:
    bandwidth: Ceiling
    compute: dict[str, Ceiling]  # by dtype


# Figures from the project's anchors (shared/ANCHORS.md).
CEILINGS: dict[str, DeviceCeilings] = {
    "nvidia h200": DeviceCeilings(
        bandwidth=Ceiling(4.27, "device-to-device copy, measured"),
        compute={
            "fp32": Ceiling(67.0, "fp32 SIMT, datasheet"),
            "fp16": Ceiling(989.0, "fp16 tensor cores, datasheet"),
            "bf16": Ceiling(989.0, "bf16 tensor cores, datasheet"),
        },
    ),
}


def ceilings_for(device_name: str) -> DeviceCeilings | None:
    """The ceilings of the GPU a device name stands for (a recorded device's: its GPU's)."""
    return CEILINGS.get(measured_on(device_name).strip().lower())


def problem_of(row: dict) -> Problem:
    """The problem of a trial row, sized as the store keeps it: a block-sparse row's flops and
    bytes count its kept blocks only (Problem.flops and min_bytes include the density). The
    pattern hash only names the problem; a row without one (an older store) is sized all the same.
    ValueError: a dtype or field this version does not know."""
    block = int(row.get("block") or 0)
    density = row.get("density")
    sparsity = {"block": block, "density": 1.0 if density is None else float(density),
                "pattern": row.get("pattern") or "unrecorded"} if block else {}  # fmt: skip
    return Problem(int(row["m"]), int(row["n"]), int(row["k"]), dtype=row["dtype"], bias=bool(row["bias"]),
                   **sparsity)  # fmt: skip


def place(row: dict) -> dict[str, object]:
    """Roofline place of one trial row (needs m, n, k, dtype, bias, device, tflops, gbps; block,
    density and pattern for a block-sparse problem)."""
    out: dict[str, object] = {"intensity": None, "bound": None, "of_compute": None, "of_bandwidth": None,
                              "of_roofline": None, "ceilings": "unknown for this device"}  # fmt: skip
    try:
        problem = problem_of(row)
    except ValueError:  # a dtype this version does not know
        return out
    intensity = problem.flops / problem.min_bytes
    out["intensity"] = intensity
    limits = ceilings_for(str(row["device"]))
    compute = limits.compute.get(str(row["dtype"])) if limits else None
    if limits is None or compute is None:
        return out
    ridge = compute.value / limits.bandwidth.value  # FLOP per byte where the two limits meet
    attainable = min(compute.value, intensity * limits.bandwidth.value)  # TFLOP/s
    tflops, gbps = row.get("tflops"), row.get("gbps")
    out.update(
        bound="memory" if intensity < ridge else "compute",
        ceilings=f"{compute.value:g} TFLOP/s ({compute.source}); {limits.bandwidth.value:g} TB/s "
        f"({limits.bandwidth.source})",
        of_compute=tflops / compute.value if tflops is not None else None,
        of_bandwidth=gbps / (limits.bandwidth.value * 1000.0) if gbps is not None else None,
        of_roofline=tflops / attainable if tflops is not None and attainable > 0 else None,  # 0: an all-zero W
    )
    return out
