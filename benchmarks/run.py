"""Benchmark suites: our best kernel and its baseline, timed side by side in one run.

    python3 -m benchmarks.run --suite simt [--out DIR] [--search BUDGET [--sampler NAME]]
                              [--problems KEY [KEY ...]]

Writes ``<suite>-<device>-<UTC date-time>.json`` (format: DESIGN.md) to benchmarks/results/ or DIR,
rewritten after every problem, so a run that is killed keeps what it measured.
``--problems`` keeps the suite's problems whose key (e.g. ``32x4096x4096_fp32_forward``) is given.
Each problem's candidates are hand-picked specs (dicts of a family's fields; "family" defaults to
simt, the family every suite here is written for; the sparsity suite adds its families' built-in
sparse seeds); the fastest correct one is "ours". With
``--search``, each problem is instead searched (the candidates are tried first) with that budget,
every trial stored in ``DIR/<suite>.db``, and the best found is "ours".
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import functools
import json
import multiprocessing as mp
import os
import re
import sys
from pathlib import Path

from codegen import sparse
from codegen.evaluate import DEFAULT_TIMING, Evaluator, build
from codegen.families import spec_from_dict
from codegen.problem import DType, Problem
from codegen.spec import KernelSpec
from codegen.versions import versions
from search import DEFAULT_SAMPLER, SAMPLERS
from search.space import point_of, seeds, space_for, to_spec

RESULTS = Path(__file__).resolve().parent / "results"
#: The family of a candidate that does not name one.
DEFAULT_FAMILY = "simt"


def candidate_spec(problem: Problem, params: dict) -> KernelSpec:
    """The spec of a hand-picked candidate for ``problem`` (its family's registry entry builds it)."""
    return spec_from_dict({"family": DEFAULT_FAMILY, **params, "dtype": problem.dtype.value, "bias": problem.bias})

_SQ = dict(bm=128, bn=128, bk=8, wm=32, wn=64, tm=8, tn=8, pad=4, vec=4, stages=2)
_SKINNY = dict(bm=32, bn=128, bk=32, wm=32, wn=32, tm=4, tn=8, pad=4, vec=4, stages=2)

#: suite -> [(problem, [candidate spec params])]
SUITES: dict[str, list[tuple[Problem, list[dict]]]] = {
    "simt": [
        (
            Problem(4096, 4096, 4096),
            [
                _SQ,
                dict(_SQ, group_m=8),
                dict(_SQ, bk=16),
                dict(_SQ, bk=16, group_m=8),
                dict(_SQ, pad=0),
                dict(_SQ, bm=256, group_m=8),
                dict(_SQ, bn=256, wn=64, wm=32, tm=8, tn=8, group_m=8),
                dict(_SQ, bm=64, bn=128, wm=32, wn=64, bk=16),
            ],
        ),
        (
            Problem(32, 4096, 4096),
            [
                dict(_SKINNY, split_k=4, reduce="atomic"),
                dict(_SKINNY, split_k=4, reduce="two_pass"),
                dict(_SKINNY, bk=64, split_k=4, reduce="atomic"),
                dict(_SKINNY, split_k=8, reduce="atomic"),
                dict(bm=32, bn=64, bk=64, wm=32, wn=16, tm=4, tn=4, pad=4, vec=4, stages=2, split_k=4, reduce="atomic"),
                dict(bm=32, bn=64, bk=32, wm=32, wn=16, tm=4, tn=4, pad=4, vec=4, stages=2, split_k=2, reduce="atomic"),
                dict(_SQ, bm=32, wm=32, bn=128, wn=32, tm=4, tn=8, bk=32),
            ],
        ),
    ],
}

_ASYNC = dict(bm=32, bn=128, bk=32, wm=32, wn=32, tm=4, tn=8, pad=4, vec=4, stages=3, copy="async")
_ASYNC_H = dict(_ASYNC, bk=64, pad=8, vec=8)
_SKINNY_CANDIDATES = [
    dict(_ASYNC, split_k=8, reduce="atomic"),
    dict(_ASYNC, split_k=16, reduce="atomic"),
    dict(_ASYNC, stages=4, split_k=8, reduce="atomic"),
    dict(_ASYNC, bn=64, wn=16, tn=4, split_k=8, reduce="atomic"),
    dict(_ASYNC, bn=64, wn=16, tn=4, split_k=16, reduce="atomic"),
    dict(_ASYNC, bk=64, split_k=8, reduce="atomic"),
    dict(_ASYNC, bk=64, stages=4, split_k=4, reduce="atomic"),
    dict(_SKINNY, split_k=16, reduce="atomic"),
]
_HALF_CANDIDATES = [
    dict(_ASYNC_H, split_k=4, reduce="two_pass"),
    dict(_ASYNC_H, split_k=8, reduce="two_pass"),
    dict(_ASYNC_H, stages=4, split_k=8, reduce="two_pass"),
    dict(_ASYNC_H, bn=64, wn=16, tn=4, split_k=8, reduce="two_pass"),
    dict(_ASYNC_H, bk=32, pad=8, split_k=16, reduce="two_pass"),
    dict(_SKINNY, vec=8, split_k=8, reduce="two_pass"),
]
SUITES["skinny"] = [
    (Problem(32, 4096, 4096), _SKINNY_CANDIDATES),
    (Problem(1, 4096, 4096), [dict(c, bm=16, wm=16, tm=2) for c in _SKINNY_CANDIDATES[:5]]),
    (Problem(32, 4096, 4096, DType.bf16), _HALF_CANDIDATES),
    (Problem(32, 4096, 4096, DType.fp16), _HALF_CANDIDATES),
    (Problem(1, 4096, 4096, DType.bf16), [dict(c, bm=16, wm=16, tm=2) for c in _HALF_CANDIDATES[:4]]),
]

_BIG = dict(_SQ, bk=16, group_m=8)
_GEMV = dict(bm=1, bn=256, bk=32, wm=1, wn=32, tm=1, tn=1, pad=4, vec=4, stages=3, copy="async")
_GEMV_H = dict(_GEMV, bk=64, pad=8, vec=8, stages=3)
_HALF8 = dict(bm=32, bn=128, bk=32, wm=32, wn=64, tm=8, tn=8, pad=8, vec=8, stages=3, copy="async")
#: Skinny tiles that read 256-512 B of each W row per tile: (bn, wm, wn, tm, tn, bk, stages, split_k).
_LONG_ROWS = [
    (64, 32, 16, 4, 4, 64, 3, 4), (64, 32, 16, 4, 4, 64, 2, 8), (64, 32, 16, 4, 4, 128, 2, 4),
    (64, 32, 16, 4, 4, 128, 2, 8), (128, 16, 64, 4, 8, 64, 2, 8), (128, 16, 64, 4, 8, 64, 2, 4),
    (32, 16, 16, 2, 4, 128, 3, 8), (32, 16, 16, 2, 4, 128, 2, 4), (32, 16, 16, 2, 4, 64, 4, 8),
    (64, 16, 32, 2, 8, 64, 3, 8), (64, 16, 32, 2, 8, 128, 2, 8), (128, 16, 64, 4, 8, 32, 4, 8),
    (128, 16, 64, 4, 8, 32, 3, 16),
]
#: Issue 5's shapes, hand-picked candidates (a first look; searches come later).
SUITES["simt5"] = [
    (Problem(4096, 4096, 4096), [_BIG, dict(_BIG, copy="async", stages=3), dict(_BIG, copy="async", stages=4, bk=32),
                                 dict(_BIG, copy="async", stages=3, wm=64, wn=32)]),
    (Problem(1000, 1000, 1000), [_BIG, dict(_BIG, bm=64, wm=32, wn=32, tm=4, tn=8),
                                 dict(_BIG, bm=64, bn=64, wm=32, wn=32, tm=4, tn=8, copy="async", stages=3, bk=32),
                                 dict(_BIG, bm=64, wm=32, wn=32, tm=4, tn=8, copy="async", stages=3, split_k=2, reduce="atomic")]),
    (Problem(4097, 4095, 4093), [_BIG, dict(_BIG, copy="async", stages=3), dict(_BIG, copy="async", stages=4, bk=32)]),
    (Problem(128, 4096, 4096), [dict(_BIG, split_k=2, reduce="atomic"), dict(_BIG, split_k=4, reduce="atomic"),
                                dict(_BIG, bm=64, wm=32, wn=32, tm=4, tn=8, copy="async", stages=3, split_k=4, reduce="atomic"),
                                dict(_BIG, bm=128, bn=64, wm=32, wn=32, tm=8, tn=4, copy="async", stages=4, bk=32, split_k=4, reduce="atomic")]),
    (Problem(32, 4096, 4096), [dict(_ASYNC, wm=16, wn=64, split_k=8, reduce="atomic")]  # best of the first search
     + [dict(_ASYNC, bn=bn, wm=wm, wn=wn, tm=tm, tn=tn, bk=bk, stages=st, split_k=sk, reduce="atomic")
        for bn, wm, wn, tm, tn, bk, st, sk in _LONG_ROWS]  # longer W row runs per tile
     + [dict(_ASYNC, split_k=8, reduce="atomic"), dict(_ASYNC, stages=2, split_k=16, reduce="atomic"),
                               dict(_ASYNC, bn=64, wn=16, tn=4, split_k=8, reduce="atomic"),
                               dict(_ASYNC, bn=64, wn=16, tn=4, stages=4, split_k=8, reduce="atomic"),
                               dict(_ASYNC, bn=64, wn=16, tn=4, bk=16, stages=4, split_k=8, reduce="atomic"),
                               dict(_ASYNC, bn=64, wn=16, tn=4, split_k=4, reduce="atomic"),
                               dict(_ASYNC, bm=32, bn=128, wm=32, wn=64, tm=8, tn=8, split_k=8, reduce="atomic"),
                               dict(_ASYNC, bm=32, bn=64, wm=32, wn=32, tm=4, tn=8, split_k=8, reduce="atomic")]),
    (Problem(1, 4096, 4096), [dict(_GEMV, split_k=4, reduce="atomic"), dict(_GEMV, split_k=8, reduce="atomic"),
                              dict(_GEMV, split_k=16, reduce="atomic"), dict(_GEMV, bk=64, stages=2, split_k=8, reduce="atomic"),
                              dict(_GEMV, bn=512, wn=64, tn=2, bk=16, split_k=8, reduce="atomic")]),
    (Problem(32, 4096, 4096, DType.bf16), [dict(_HALF8, split_k=8, reduce="two_pass"), dict(_HALF8, split_k=16, reduce="two_pass"),
                                           dict(_HALF8, bn=64, wn=64, split_k=16, reduce="two_pass"),
                                           dict(_ASYNC_H, bk=32, split_k=16, reduce="two_pass")]),
    (Problem(32, 4096, 4096, DType.fp16), [dict(_HALF8, split_k=8, reduce="two_pass"), dict(_HALF8, split_k=16, reduce="two_pass"),
                                           dict(_HALF8, bn=64, wn=64, split_k=16, reduce="two_pass"),
                                           dict(_ASYNC_H, bk=32, split_k=16, reduce="two_pass")]),
    (Problem(1, 4096, 4096, DType.bf16), [dict(_GEMV_H, split_k=4, reduce="two_pass"), dict(_GEMV_H, split_k=8, reduce="two_pass"),
                                          dict(_GEMV_H, bk=32, split_k=16, reduce="two_pass")]),
    (Problem(1, 4096, 4096, DType.fp16), [dict(_GEMV_H, split_k=4, reduce="two_pass"), dict(_GEMV_H, split_k=8, reduce="two_pass"),
                                          dict(_GEMV_H, bk=32, split_k=16, reduce="two_pass")]),
]



def _tc(bm, bn, bk, wm, wn, warps_k, stages, **more) -> dict:
    """A tensor-core candidate: slice-K (warps_k > 1) stages its epilogue through shared memory."""
    return dict(family="tensorcore", bm=bm, bn=bn, bk=bk, wm=wm, wn=wn, warps_k=warps_k, stages=stages,
                epilogue="smem" if warps_k > 1 else "direct", **more)


#: Hand-picked on the H200 (2026-12-01, dev exploration of the family): the search starts from these.
_TC_SQUARE = [_tc(128, 128, 32, 64, 64, 1, 4), _tc(128, 256, 64, 64, 64, 1, 3), _tc(64, 256, 32, 64, 64, 1, 4)]
_TC_UNALIGNED = _TC_SQUARE[:1] + [dict(c, prepass="pack") for c in _TC_SQUARE[:2]]
_TC_SKINNY = [_tc(32, 16, 256, 32, 16, 8, 4), _tc(32, 16, 128, 32, 16, 4, 5), _tc(32, 16, 128, 32, 16, 2, 5)]
_TC_GEMV = [_tc(16, 16, 256, 16, 16, 4, 5), _tc(16, 16, 256, 16, 16, 8, 5), _tc(16, 16, 128, 16, 16, 4, 5)]
_TC_TF32 = [_tc(128, 128, 16, 64, 64, 1, 4, prepass="pack"), _tc(128, 128, 16, 64, 64, 1, 4),
            _tc(64, 128, 16, 64, 64, 1, 4, prepass="pack")]
SUITES["tensorcore"] = [
    (Problem(m, n, k, dtype), cands)
    for dtype in (DType.bf16, DType.fp16)
    for (m, n, k), cands in (
        ((4096, 4096, 4096), _TC_SQUARE), ((8192, 8192, 8192), _TC_SQUARE), ((4096, 11008, 4096), _TC_SQUARE),
        ((4097, 4095, 4093), _TC_UNALIGNED), ((32, 4096, 4096), _TC_SKINNY), ((1, 4096, 4096), _TC_GEMV),
    )
] + [(Problem(4096, 4096, 4096, DType.tf32), _TC_TF32)]


def seed_candidates(family: str, problem: Problem) -> list[dict]:
    """The family's built-in seeds (sparse ones for a block-sparse W) as candidates for ``problem``,
    mapped by its space (e.g. hopper's pack prepass where K breaks 16-byte rows)."""
    return [to_spec(family, point, problem).to_dict() for point in seeds(family, problem.block, problem.layout)]


#: The large layers of the tensor-core suite on the Hopper family (wgmma + TMA, sm_90 only).
SUITES["hopper"] = [
    (problem, seed_candidates("hopper", problem))
    for problem in (Problem(m, n, k, dtype) for dtype in (DType.bf16, DType.fp16)
                    for m, n, k in ((4096, 4096, 4096), (8192, 8192, 8192), (4096, 11008, 4096), (4097, 4095, 4093)))
]


def _tcs(bm, bk, wm, wn, block, warps_k=1, stages=4, split_k=1, epilogue="smem", bn=None) -> dict:
    """A block-sparse tensor-core candidate (the block tile spans one block row, bn = block, or with
    ``bn`` an equal part of its rows)."""
    return dict(family="tensorcore", bm=bm, bn=bn or block, bk=bk, wm=wm, wn=wn, warps_k=warps_k, stages=stages,
                epilogue=epilogue, block=block, split_k=split_k, reduce="two_pass" if split_k > 1 else "none")


def _simts(bm, bk, wm, wn, tm, tn, block, stages=2, copy="reg", split_k=1, pad=4) -> dict:
    """A block-sparse SIMT candidate (fp32: split-K adds atomically)."""
    return dict(bm=bm, bn=block, bk=bk, wm=wm, wn=wn, tm=tm, tn=tn, pad=pad, vec=4, stages=stages, copy=copy,
                block=block, split_k=split_k, reduce="atomic" if split_k > 1 else "none")


def _dr(bm, bn, warps, block, depth=1) -> dict:
    """A direct-family candidate (block-sparse W at small batches, codegen/families/direct.py)."""
    return dict(family="direct", bm=bm, bn=bn, warps=warps, depth=depth, block=block)


#: Hand-picked starting points for block-sparse W, per (M, block): tiles one block row wide.
_SPARSE_BF16 = {
    (4096, 64): [_tcs(128, 32, 64, 32, 64), _tcs(256, 32, 64, 32, 64), _tcs(128, 32, 32, 64, 64),
                 _tcs(128, 32, 32, 32, 64), _tcs(64, 32, 32, 32, 64)],
    (4096, 32): [_tcs(128, 32, 64, 32, 32), _tcs(256, 32, 64, 32, 32), _tcs(128, 64, 64, 32, 32),
                 _tcs(256, 64, 64, 32, 32, stages=3), _tcs(128, 64, 32, 32, 32)],  # bk 64: two blocks per k-tile
    (4096, 16): [_tcs(128, 16, 32, 16, 16), _tcs(128, 64, 32, 16, 16), _tcs(256, 64, 64, 16, 16),
                 _tcs(128, 32, 32, 16, 16), _tcs(256, 64, 32, 16, 16, stages=3)],
    # batch 32: few block rows, so also tiles over part of a block's rows (more blocks) with deep
    # pipelines (a row's few kept blocks all in flight at once)
    (32, 64): [_tcs(32, 32, 16, 32, 64), _tcs(32, 32, 16, 32, 64, split_k=2), _tcs(32, 64, 32, 32, 64, warps_k=2),
               _tcs(32, 32, 32, 16, 64, split_k=4), _tcs(32, 128, 32, 32, 64, warps_k=2),
               _tcs(32, 64, 32, 32, 64, warps_k=2, stages=8),
               _tcs(32, 64, 16, 16, 64, stages=8, epilogue="direct", bn=32),
               _tcs(32, 64, 32, 16, 64, stages=8, epilogue="direct", bn=32),
               _tcs(32, 64, 32, 16, 64, warps_k=2, stages=8, bn=32),
               _tcs(32, 128, 32, 16, 64, warps_k=4, stages=4, bn=32),
               _tcs(32, 64, 16, 16, 64, stages=8, epilogue="direct", bn=16),
               _tcs(32, 64, 32, 16, 64, warps_k=2, stages=8, bn=16),
               _dr(32, 32, 8, 64), _dr(32, 32, 4, 64, depth=2), _dr(32, 16, 8, 64), _dr(32, 16, 4, 64, depth=2),
               _dr(32, 16, 16, 64), _dr(32, 64, 8, 64), _dr(32, 8, 4, 64)],
    (32, 32): [_tcs(32, 32, 16, 16, 32), _tcs(32, 32, 16, 16, 32, split_k=2), _tcs(32, 32, 32, 32, 32, split_k=4),
               _tcs(32, 64, 16, 32, 32), _tcs(32, 128, 32, 32, 32, warps_k=2),
               _tcs(32, 64, 16, 16, 32, stages=8, epilogue="direct"),
               _tcs(32, 128, 32, 16, 32, warps_k=4, stages=6),
               _tcs(32, 64, 16, 16, 32, stages=8, epilogue="direct", bn=16),
               _tcs(32, 64, 32, 16, 32, warps_k=2, stages=8, bn=16),
               _dr(32, 32, 8, 32), _dr(32, 32, 8, 32, depth=2), _dr(32, 16, 8, 32), _dr(32, 16, 4, 32, depth=2),
               _dr(32, 32, 16, 32), _dr(32, 8, 4, 32)],
    (32, 16): [_tcs(32, 16, 16, 16, 16), _tcs(32, 16, 16, 16, 16, split_k=2), _tcs(32, 16, 32, 16, 16, split_k=4),
               _tcs(32, 64, 16, 16, 16), _tcs(32, 128, 32, 16, 16, warps_k=2),
               _tcs(32, 64, 16, 16, 16, stages=8, epilogue="direct"),
               _tcs(32, 128, 32, 16, 16, warps_k=2, stages=6),
               _dr(32, 16, 8, 16), _dr(32, 16, 8, 16, depth=2), _dr(32, 8, 8, 16), _dr(32, 16, 16, 16, depth=2)],
}
_SPARSE_FP32 = {
    (4096, 64): [_simts(128, 16, 32, 32, 8, 4, 64), _simts(128, 16, 32, 64, 8, 8, 64),
                 _simts(128, 16, 32, 32, 4, 8, 64, stages=3, copy="async"), _simts(256, 16, 64, 32, 8, 8, 64)],
    (4096, 32): [_simts(128, 16, 32, 32, 8, 4, 32), _simts(128, 32, 64, 32, 8, 8, 32),
                 _simts(128, 16, 32, 32, 4, 8, 32, stages=3, copy="async")],
    (4096, 16): [_simts(128, 16, 64, 16, 8, 4, 16), _simts(128, 16, 32, 16, 4, 4, 16),
                 _simts(128, 16, 64, 16, 8, 4, 16, stages=3, copy="async")],
    (32, 64): [_simts(32, 16, 32, 32, 4, 8, 64), _simts(32, 16, 32, 32, 4, 8, 64, split_k=2),
               _simts(32, 32, 16, 32, 4, 4, 64, stages=3, copy="async", split_k=4)],
    (32, 32): [_simts(32, 16, 32, 32, 4, 8, 32), _simts(32, 16, 32, 32, 4, 8, 32, split_k=2),
               _simts(32, 32, 16, 32, 4, 4, 32, stages=3, copy="async", split_k=4)],
    (32, 16): [_simts(32, 16, 32, 16, 4, 4, 16), _simts(32, 16, 32, 16, 4, 4, 16, split_k=2)],
}
#: Issue 11's sparsity suite: a synthetic random pattern (seed 0) per block and density, for the
#: large square layer and batch 32, bf16 on tensor cores and fp32 on CUDA cores.
SPARSE_DENSITIES = (0.05, 0.1, 0.25, 0.5)
#: The families whose block-sparse variants run each dtype of the sparsity suite. Their built-in sparse
#: seeds (search/spaces/: the bests of earlier H200 searches and probes) join every problem's hand-picked
#: candidates, so one run times each family's known-good kernels side by side with the baselines.
SPARSE_FAMILIES = {DType.bf16: ("tensorcore", "hopper", "direct"), DType.fp32: ("simt",)}


def with_sparse_seeds(problem: Problem, candidates: list[dict]) -> list[dict]:
    """The hand-picked candidates, then the sparse seeds of the dtype's families mapped onto the
    problem, each kernel once (by name); seeds a problem's rules refuse are tried and reported invalid."""
    pool = candidates + [c for family in SPARSE_FAMILIES[problem.dtype] for c in seed_candidates(family, problem)]
    unique: dict[str, dict] = {}
    for params in pool:
        unique.setdefault(candidate_spec(problem, params).name, params)
    return list(unique.values())


SUITES["sparse"] = [
    (problem, with_sparse_seeds(problem, cands[(m, block)]))
    for dtype, cands in ((DType.bf16, _SPARSE_BF16), (DType.fp32, _SPARSE_FP32))
    for m in (4096, 32)
    for block in sparse.BLOCKS
    for density in SPARSE_DENSITIES
    for problem in (sparse.problem_for(m, sparse.Pattern.random(4096, 4096, block, density, seed=0), dtype),)
]

def hand_suite(problems: list, timing: dict):
    """Every hand-picked candidate of each problem; yields (record, device) per problem, with the
    fastest correct candidate and cuBLAS."""
    with Evaluator(timing=timing, timeout_s=120.0) as ev, \
            cf.ProcessPoolExecutor(os.cpu_count() or 2, mp_context=mp.get_context("spawn")) as pool:
        device = ev.device()
        arch, limits = ev.target_arch, ev.limits()
        for problem, candidates in problems:
            tried = []
            specs = [candidate_spec(problem, params) for params in candidates]
            # Compiled in parallel on the CPU, measured one at a time on the GPU.
            built_all = pool.map(functools.partial(build, problem=problem, arch=arch, limits=limits), specs)
            for spec, built in zip(specs, built_all, strict=True):
                result = ev.run(built, problem)
                tried.append((spec, result))
                line = f"{problem.key:28s} {spec.name:60s} {result['status']}"
                if result["status"] == "ok":
                    line += f" {result['median_ms'] * 1e3:9.1f} us {result['tflops']:6.2f} TFLOP/s ratio {result['ratio'].get('cublas', float('nan')):.3f}"
                print(line, flush=True)
            ok = [(s, r) for s, r in tried if r["status"] == "ok"]
            record = {"problem": problem_record(problem)}
            record["candidates"] = [
                {"kernel": s.name, "status": r["status"], "median_ms": r["median_ms"], "evidence": r["evidence"][-300:]}
                for s, r in tried
            ]
            if ok:
                spec, best = min(ok, key=lambda sr: sr[1]["median_ms"])
                record["ours"] = {
                    "kernel": spec.name,
                    **{k: best[k] for k in ("median_ms", "p20_ms", "p80_ms", "tflops", "gbps", "rel_error")},
                    "search": {"sampler": "hand", "candidates": len(candidates)},
                }
                record["baselines"] = best["baselines"]
                record["ratio"] = best["ratio"]
            yield record, device


def problem_record(problem: Problem) -> dict:
    """A result record's problem (DESIGN.md): its fields, ``block`` null for a dense W."""
    return {**problem.to_dict(), "block": problem.block or None}


def write_results(name: str, path: Path, stamp: str, timing: dict, records: list[dict], device: dict) -> None:
    doc = {
        "suite": name,
        "date": stamp,
        "device": device["name"],
        "versions": {**versions(), "nvrtc": device["nvrtc"], "driver": device["driver"], "sm": device["sm"]},
        "command": "python3 -m benchmarks.run " + " ".join(sys.argv[1:]),
        "timing": timing,
        "records": records,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)  # never a half-written file


def search_suite(name: str, problems: list, out_dir: Path, timing: dict, budget: int, sampler: str):
    """Search each problem (hand candidates first); yields (record, device) per problem, with the
    best found and cuBLAS. Every trial is stored in ``out_dir/<name>.db``, so a rerun resumes."""
    from search.measure import GpuMeasurer
    from search.runner import run_search
    from store import Store

    out_dir.mkdir(parents=True, exist_ok=True)
    store = Store(f"sqlite:///{(out_dir / f'{name}.db').resolve()}")
    for problem, candidates in problems:
        measurer = GpuMeasurer(problem, timing=timing, timeout_s=120.0)
        device = measurer.device
        specs = [candidate_spec(problem, c) for c in candidates]
        family = specs[0].family if specs else DEFAULT_FAMILY
        seed_points = [point_of(spec) for spec in specs if spec.family == family]
        try:
            s = run_search(problem, space_for(family, problem.dtype, block=problem.block), measurer, sampler=sampler, seed=0,
                           budget=budget, store=store, seeds=seed_points, progress=False, versions=versions(),
                           command=f"python3 -m benchmarks.run --suite {name} --search {budget} --sampler {sampler}")
        finally:
            measurer.close()
        record = {"problem": problem_record(problem)}
        if s.best and "median_ms" in s.best:
            b = s.best
            # The search starts from the hand candidates: say how much it added over the best of them.
            names = {spec.name for spec in specs}
            seeded = [r for r in store.trials(problem=problem, status="ok") if r["kernel"] in names]
            best_seed = min(seeded, key=lambda r: r["median_ms"]) if seeded else None
            record["ours"] = {"kernel": b["kernel"], **{k: b[k] for k in ("median_ms", "p20_ms", "p80_ms", "gbps")},
                              "tflops": b["tflops"],
                              "search": {"sampler": sampler, "budget": budget, "evaluated": s.evaluated,
                                         "wall_s": round(s.wall_s, 1), "failures": dict(s.failures),
                                         "seeds": sorted(names),
                                         "best_seed": ({"kernel": best_seed["kernel"],
                                                        "median_ms": best_seed["median_ms"]} if best_seed else None),
                                         "gain_over_best_seed": (best_seed["median_ms"] / b["median_ms"]
                                                                 if best_seed else None)}}
            record["baselines"], record["ratio"] = b["baselines"], b["ratio"]
            print(f"{problem.key:28s} best {b['kernel']}  {b['tflops']:.2f} TFLOP/s  "
                  f"ratio to cuBLAS {b['ratio'].get('cublas', float('nan')):.3f}  ({s.wall_s:.0f} s)", flush=True)
        yield record, device


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), default="simt")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--reps-min", type=int, default=DEFAULT_TIMING["reps_min"])
    parser.add_argument("--search", type=int, metavar="BUDGET", help="search each problem with this budget")
    parser.add_argument("--sampler", default=DEFAULT_SAMPLER, choices=list(SAMPLERS),
                        help=f"sampler for --search (default {DEFAULT_SAMPLER}, as codegen search)")
    parser.add_argument("--problems", nargs="+", metavar="KEY", help="only these problems of the suite")
    parser.add_argument("--match", nargs="+", metavar="TEXT",
                        help="only the suite's problems whose key contains every TEXT (e.g. bf16 bsr64)")
    args = parser.parse_args(argv)
    timing = dict(DEFAULT_TIMING, reps_min=args.reps_min)
    problems = SUITES[args.suite]
    if args.problems:
        known = {p.key for p, _ in problems}
        unknown = sorted(set(args.problems) - known)
        if unknown:
            parser.error(f"not in suite {args.suite}: {', '.join(unknown)}; its problems: {', '.join(sorted(known))}")
        problems = [(p, c) for p, c in problems if p.key in args.problems]
    if args.match:
        problems = [(p, c) for p, c in problems if all(t in p.key for t in args.match)]
        if not problems:
            parser.error(f"no problem of suite {args.suite} matches {' '.join(args.match)}")
    if args.search:
        results = search_suite(args.suite, problems, args.out, timing, args.search, args.sampler)
    else:
        results = hand_suite(problems, timing)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    records, path = [], None
    for record, device in results:
        records.append(record)
        if path is None:
            path = args.out / f"{args.suite}-{re.sub(r'[^A-Za-z0-9]+', '_', device['name'])}-{stamp.replace(':', '')}.json"
        write_results(args.suite, path, stamp, timing, records, device)
    for r in records:
        if "ours" in r:
            print(f"{Problem.from_dict(r['problem']).key:28s} best {r['ours']['kernel']}  {r['ours']['tflops']:.2f} TFLOP/s"
                  f"  ratio to cuBLAS {r['ratio'].get('cublas', float('nan')):.3f}")
    print(f"wrote {path}" if path else "no problem was measured")
    return 0 if path else 1


if __name__ == "__main__":
    raise SystemExit(main())
