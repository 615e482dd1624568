"""Tuned kernels without the store: a bundle folder, and one way to find a kernel in either.

``codegen export --bundle DIR`` writes the best stored kernel of every problem (per device) as
``<problem key>/<device>/<kernel>.cu`` and ``.json`` (the export manifest, codegen.export) and one
``index.json`` listing them by layer shape, dtype, layout, bias and device. ``Bundle`` reads it back
with nothing but the standard library; ``StoreKernels`` answers the same question from a store.
Both ``find(problem, device)``: a ``KernelFile`` (manifest, source and the kernel's verdict against
cuBLAS, codegen.nn.verdict), or the reason there is none.

A block-sparse W's GEMMs are problems of their own pattern (the key names the block, the density and
the pattern's hash, and the entry's ``problem`` holds them), so a bundle holds kernels per pattern and
a ``BlockSparseLinear`` finds its three GEMMs by its pattern's problems.

Each index entry keeps ``verdicts`` (by timing: what measured it) and ``verdict``, the one that
decides (codegen.nn.verdict.deciding): from the store's rows the search's cold single calls, and
where ``codegen tune-model --bundle`` or ``pick-step`` measured more, engine or train-step timing.
A bundle written before verdicts has neither and still loads: its kernels' winner is unknown.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from pathlib import Path

from codegen.nn import verdict as verdicts
from codegen.problem import Layout, Problem

__all__ = ["BUNDLE_FORMAT", "Bundle", "BundleError", "KernelFile", "SeedKernels", "StoreKernels", "layer_shape",
           "verdict_summary", "write_bundle"]

BUNDLE_FORMAT = "gemmscape-bundle/1"
INDEX = "index.json"


class BundleError(ValueError):
    """A bundle that cannot be read or written; the message says why."""


@dataclass(frozen=True)
class KernelFile:
    """One tuned kernel: its export manifest, its CUDA source, and where it came from."""

    manifest: dict
    source: str
    origin: str
    verdict: verdicts.Verdict | None = None  # None: never compared with cuBLAS (the winner is unknown)


def layer_shape(problem: Problem) -> dict:
    """The linear layer a GEMM belongs to: batch, in and out features (codegen.problem.linear_problems
    read backwards)."""
    m, n, k = problem.m, problem.n, problem.k
    batch, in_f, out_f = {Layout.forward: (m, k, n), Layout.grad_input: (m, n, k),
                          Layout.grad_weight: (k, n, m)}[problem.layout]
    return {"batch": batch, "in": in_f, "out": out_f}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "device"


def write_bundle(store, out: Path, *, device_id: int | None = None, family: str | None = None,
                 include_recorded: bool = True, choose=None, margin: float = verdicts.MARGIN) -> dict:
    """Export the kernel ``pick_stored`` chooses (the fastest ok one, but see there) for every problem
    (on each device, or on ``device_id``; of ``family`` if given) into ``out`` with one index.json;
    returns the index. ``choose`` (store, problem, rows) -> what pick_stored returns replaces it
    (``codegen pick-step`` chooses by the train step's time). Problems with no kernel that can be
    exported (no stored source of the measured kernel and the templates render another, or stored
    sources that no longer fit today's plan) are listed under ``skipped`` with the reason, never
    shipped with a measurement of other source. A 2:4 W's problems are exported like any other (the
    forward of ``codegen.nn.semisparse.Sparse24Linear`` finds them by their key). Each entry's cold_single verdict comes from its trial
    row (judged at ``margin``); verdicts of other timings that a bundle already in ``out`` holds for the
    same kernel, problem and device are kept (a re-export does not lose what engine timing found)."""
    from codegen.export import write_export

    out = Path(out)
    kept = _measured_verdicts(out)
    entries, skipped = [], []
    groups: dict[tuple, list[dict]] = {}
    for row in store.best(device_id=device_id, family=family, per_problem=CANDIDATES):
        groups.setdefault((row["problem_id"], row["device_id"]), []).append(row)
    for rows in groups.values():
        first = min(rows, key=lambda r: r["rank"])
        if first.get("recorded") and not include_recorded:
            continue
        problem = Problem.from_dict(first)
        picked = (choose or pick_stored)(store, problem, rows)
        if isinstance(picked, str):
            skipped.append({"problem": problem.key, "device": first["device"], "kernel": first["kernel"], "reason": picked})
            continue
        row, texts = picked[0], picked[1:]
        folder = out / problem.key / _slug(row["device"])
        cu, js = write_export(folder, row["kernel"], texts)
        judged = {"cold_single": verdicts.from_row(row, problem, margin=margin).to_dict(),
                  **kept.get((problem.key, row["device"], row["kernel"]), {})}
        entries.append({
            "problem": problem.to_dict(), "key": problem.key, "layer": layer_shape(problem),
            "dtype": problem.dtype.value, "layout": problem.layout.value, "bias": problem.bias,
            "device": row["device"], "recorded": bool(row.get("recorded")), "kernel": row["kernel"],
            "family": row["family"], "manifest": str(js.relative_to(out)), "source": str(cu.relative_to(out)),
            "median_ms": row["median_ms"], "tflops": row["tflops"],
            "verdict": verdicts.deciding(judged), "verdicts": judged,
        })
    index = {"format": BUNDLE_FORMAT, "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
             "store": store.location, "kernels": entries, "skipped": skipped}
    index["verdicts"] = verdict_summary(index)
    out.mkdir(parents=True, exist_ok=True)
    _write_index(out / INDEX, index)
    return index


def _write_index(path: Path, index: dict) -> None:
    part = path.with_suffix(".part")
    part.write_text(json.dumps(index, indent=1) + "\n")
    part.replace(path)


def _measured_verdicts(out: Path) -> dict:
    """(problem key, device, kernel) -> the verdicts other than cold_single that a bundle already at
    ``out`` holds (empty where there is none, or it cannot be read)."""
    try:
        entries = Bundle(out).entries
    except BundleError:
        return {}
    found = {}
    for e in entries:
        other = {t: v for t, v in (e.get("verdicts") or {}).items() if t != "cold_single" and isinstance(v, dict)}
        if other:
            found[(e.get("key"), e.get("device"), e.get("kernel"))] = other
    return found


def verdict_summary(index: dict) -> dict:
    """How many of an index's kernels each winner has, and by which timing the deciding verdicts were
    measured: {"ours": n, "cublas": n, "unknown": n, "timing": {timing: n}} (no verdict counts as unknown)."""
    out = {w: 0 for w in verdicts.WINNERS}
    timing: dict[str, int] = {}
    for e in index.get("kernels", []):
        v = e.get("verdict") if isinstance(e.get("verdict"), dict) else None
        out[v.get("winner", "unknown") if v else "unknown"] += 1
        if v:
            timing[v.get("timing", "?")] = timing.get(v.get("timing", "?"), 0) + 1
    return {**out, "timing": timing}


class Bundle:
    """A bundle folder written by ``write_bundle``: its index, and the kernels it lists."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        file = self.path / INDEX if self.path.is_dir() else self.path
        if not file.is_file():
            raise BundleError(f"no bundle at {self.path}: {INDEX} is missing (write one with "
                              f"`codegen export --bundle DIR`)")
        try:
            self.index = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BundleError(f"cannot read {file}: {e}") from None
        if not isinstance(self.index, dict) or self.index.get("format") != BUNDLE_FORMAT:
            raise BundleError(f"{file} is not a gemmscape bundle index (format {BUNDLE_FORMAT!r})")
        self.root = file.parent
        self.location = str(self.root)

    @property
    def entries(self) -> list[dict]:
        return list(self.index.get("kernels", []))

    def devices(self) -> list[str]:
        return sorted({e["device"] for e in self.entries})

    def find(self, problem: Problem, device: str) -> KernelFile | str:
        """The bundle's kernel for ``problem`` on ``device`` (by name), or why there is none."""
        same = [e for e in self.entries if e["key"] == problem.key]
        if not same:
            return f"no kernel for {problem.key} in the bundle {self.root}"
        here = [e for e in same if e["device"] == device]
        if not here:
            return (f"the bundle {self.root} has {problem.key} tuned on {', '.join(sorted({e['device'] for e in same}))}, "
                    f"not on {device}")
        entry = min(here, key=lambda e: e["median_ms"])
        try:
            manifest = json.loads((self.root / entry["manifest"]).read_text())
            source = (self.root / entry["source"]).read_text()
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            return f"the bundle's files for {problem.key} cannot be read: {e}"
        return KernelFile(manifest, source, f"bundle {self.root}",
                          verdicts.Verdict.from_dict(entry.get("verdict"), problem))

    def cublas_won_all(self, in_features: int, out_features: int, dtype: str, bias: bool) -> bool:
        """Whether the bundle holds GEMMs of this linear layer (any batch, any device) and cuBLAS won
        every one of them: then a model runs it best as torch's own ``nn.Linear`` (``replace_linear``
        leaves it). Only a dense W's GEMMs count: a block-sparse or 2:4 layer of the same shape is another layer."""
        mine = [e for e in self.entries if not (e.get("problem") or {}).get("block")
                and not (e.get("problem") or {}).get("sparsity")
                and e.get("layer", {}).get("in") == in_features
                and e.get("layer", {}).get("out") == out_features and e.get("dtype") == dtype
                and bool(e.get("bias")) == bias]
        return bool(mine) and all(
            (v := verdicts.Verdict.from_dict(e.get("verdict"), Problem.from_dict(e["problem"]))) is not None
            and v.winner == "cublas" for e in mine)

    def entry(self, problem: Problem, device: str) -> dict | None:
        """The index entry ``find`` takes for ``problem`` on ``device`` (the fastest listed), or None."""
        here = [e for e in self.index.get("kernels", []) if e["key"] == problem.key and e["device"] == device]
        return min(here, key=lambda e: e["median_ms"]) if here else None

    def set_verdict(self, problem: Problem, device: str, verdict: verdicts.Verdict) -> None:
        """Record ``verdict`` (under its timing) for the kernel ``find`` takes for ``problem`` on
        ``device``; the entry's deciding verdict is chosen again. ``save`` writes the index."""
        entry = self.entry(problem, device)
        if entry is None:
            raise BundleError(f"no kernel for {problem.key} on {device} in the bundle {self.root}")
        entry.setdefault("verdicts", {})[verdict.timing] = verdict.to_dict()
        entry["verdict"] = verdicts.deciding(entry["verdicts"])

    def save(self) -> None:
        """Write the index back (with its verdict summary), atomically."""
        self.index["verdicts"] = verdict_summary(self.index)
        _write_index(self.root / INDEX, self.index)


#: How many of a problem's fastest stored kernels a lookup looks at, fastest first.
CANDIDATES = 16


def pick_stored(store, problem: Problem, rows: list[dict]) -> tuple[dict, str, str] | str:
    """(trial row, .cu text, .json text) of the kernel to run for ``problem``, from ``rows`` (store.best
    rows of that problem on one device), or why there is none. The fastest whose stored source fits
    today's launch plan (codegen.export.check_source; one that does not is passed over); but among the
    kernels whose median lies within the fastest's 80th percentile (a tie that one measurement cannot
    break), one whose plan does not zero its output first: an atomic split-K forward that ties a two-pass
    one of the same tile alone ran markedly slower inside the train step, where its zeroing and atomics
    meet the other GEMMs (benchmarks/NOTES.md, "2026-12-04 (ninth session)")."""
    from codegen.export import ExportError, SourceMismatch, export_kernel

    fitting, refused = [], []
    for row in sorted(rows, key=lambda r: (r["median_ms"], r["id"])):
        if fitting and row["median_ms"] > (fitting[0][0]["p80_ms"] or fitting[0][0]["median_ms"]):
            break
        try:
            cu, js = export_kernel(store, row["kernel"], problem, arch=row["arch"], source_hash=row["source_hash"],
                                   device_id=row["device_id"])
        except SourceMismatch as e:
            refused.append(str(e))
            continue
        except ExportError as e:
            return str(e)
        fitting.append((row, cu, js))
    if not fitting:
        return (f"none of the {len(rows)} fastest kernels for {problem.key} in {store.location} fits today's launch "
                f"plan; the fastest: {refused[0]}")
    return next((f for f in fitting if not json.loads(f[2])["zero_output_first"]), fitting[0])


class StoreKernels:
    """The same lookup as ``Bundle.find``, answered by a store: its fastest ok kernel for the problem
    measured on the device, as ``pick_stored`` chooses it (the same choice as ``write_bundle``)."""

    def __init__(self, store) -> None:
        self.store = store
        self.location = store.location

    def find(self, problem: Problem, device: str) -> KernelFile | str:
        rows = self.store.best(problem, per_problem=CANDIDATES)
        if not rows:
            return f"no ok kernel for {problem.key} in {self.location}"
        here = [r for r in rows if r["device"] == device]
        if not here:
            return (f"{self.location} has {problem.key} tuned on {', '.join(sorted({r['device'] for r in rows}))}, "
                    f"not on {device}")
        picked = pick_stored(self.store, problem, here)
        if isinstance(picked, str):
            return picked
        return KernelFile(json.loads(picked[2]), picked[1], f"store {self.location}",
                          verdicts.from_row(picked[0], problem))


class SeedKernels:
    """Kernels without any tuning: for each problem, one of the families' built-in seeds (their
    SEEDS, the best points of earlier H200 searches) that is valid for it, the one whose row tile
    ``bm`` is nearest the problem's M (capped at 128); families tried in the order given per dtype.
    For benchmarks and tests that have no store or bundle; not a substitute for tuning."""

    DEFAULT = {"fp32": ("simt",), "tf32": ("tensorcore",), "fp16": ("tensorcore",), "bf16": ("tensorcore",)}
    #: Where the arch has it, the Hopper family goes first for 16-bit layers of at least this many rows:
    #: its 128-row tiles are near or past cuBLAS on large batches but leave most SMs idle on small ones,
    #: where the tensor-core seeds do better (benchmarks/results/hopper-NVIDIA_H200-*.json; benchmarks/NOTES.md,
    #: "2026-12-02: the Hopper probe re-run"). Its backward GEMMs need 16-byte rows (M, N, K multiples of
    #: 8 as the layout reads them); where they are not, the next family's seed is taken.
    HOPPER_MIN_M = 256
    #: The families a structured-sparse W's problems take seeds from (``families`` may name others
    #: under the sparsity, e.g. {"2:4": ("sparse24",)}); on sm_90 a 2:4 W of at least HOPPER_MIN_M rows
    #: takes the Hopper 2:4 family's first (its default seed took 0.21 ms at 4096^3 bf16 on an H100
    #: where sparse24's best took 0.30: benchmarks/NOTES.md, "2:4 on wgmma.sp").
    STRUCTURED = {"2:4": ("sparse24",)}
    HOPPER_STRUCTURED = {"2:4": "hopper_sp24"}
    #: Thread blocks (split-K's included) below which a seed leaves most of an H100's or H200's 132
    #: multiprocessors idle: among the seeds whose row tile is equally near M, those that launch at least
    #: this many go first (a skinny layer with a long K, e.g. 4096x14336 at M = 16, then takes the seed that
    #: splits K, 512 blocks, where the unsplit seed's 64 ran at 0.90x dense cuBLAS's speed on an H200).
    FILL_BLOCKS = 128

    def __init__(self, families: dict[str, tuple[str, ...]] | None = None, arch: str = "sm_90") -> None:
        self.families = {**self.DEFAULT, **(families or {})}
        self.arch = arch
        self.hopper_first = families is None and arch == "sm_90"
        self.location = "the families' built-in seeds"

    def spec_for(self, problem: Problem):
        """The seed's spec for ``problem``, or the reason there is none."""
        import math

        from codegen.spec import DeviceLimits
        from search.space import seeds, space_for

        limits = DeviceLimits.for_arch(self.arch)
        why = []
        order = self.families.get(problem.dtype.value, ())
        if problem.structured:  # a 2:4 W: only the families that compute its sparsity
            order = self.families.get(problem.sparsity, self.STRUCTURED.get(problem.sparsity, ()))
            if self.hopper_first and problem.m >= self.HOPPER_MIN_M and problem.sparsity in self.HOPPER_STRUCTURED:
                order = (self.HOPPER_STRUCTURED[problem.sparsity], *order)
        elif self.hopper_first and problem.dtype.value in ("bf16", "fp16") and problem.m >= self.HOPPER_MIN_M:
            order = ("hopper", *order)
        for family in order:
            space = space_for(family, problem.dtype, block=problem.block, layout=problem.layout,
                              sparsity=problem.sparsity)
            valid = []
            points = seeds(family, problem.block, problem.layout)
            if problem.layout is not Layout.forward:  # then the forward seeds, mapped onto the layout
                points += [p for p in seeds(family, problem.block) if p not in points]
            for i, point in enumerate(points):
                try:
                    spec = space.spec(point, problem)
                except (KeyError, ValueError, TypeError) as e:
                    why.append(f"{family} seed {i}: {e}")
                    continue
                reasons = spec.check(problem, limits)
                if reasons:
                    why.append(f"{family} seed {i}: {reasons[0]}")
                    continue
                bm, bn = getattr(spec, "bm", 128), getattr(spec, "bn", 128)
                blocks = -(-problem.m // bm) * -(-problem.n // bn) * getattr(spec, "split_k", 1)
                valid.append((abs(math.log2(bm) - math.log2(min(max(problem.m, 16), 128))),
                              blocks < self.FILL_BLOCKS, i, spec))
            if valid:
                return min(valid, key=lambda v: v[:3])[3]
        return f"no built-in seed is valid for {problem.key}" + (f" ({why[0]}; ...)" if why else "")

    def find(self, problem: Problem, device: str) -> KernelFile | str:
        from codegen.export import manifest
        from codegen.families import compile_target
        from codegen.render import render, source_hash

        spec = self.spec_for(problem)
        if isinstance(spec, str):
            return spec
        source = render(spec)
        doc = manifest(spec, problem, compile_target(spec, self.arch), None, source_hash=source_hash(source),
                       rerendered=True)
        return KernelFile(doc, source, f"built-in seed of the {spec.family} family")
