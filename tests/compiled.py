"""Compile many specs with NVRTC in a process pool for the SASS tests: one helper for every family's
compiler tier (each spec built for its family's target on the given arch)."""

from __future__ import annotations

import concurrent.futures
import os

from codegen import sass
from codegen.compile import compile_source
from codegen.families import compile_target
from codegen.render import render


def _build(job):
    spec, arch, use_cache = job
    result = compile_source(render(spec), spec.name, arch, use_cache=use_cache, target=compile_target(spec, arch))
    return spec.name, arch, result, sass.disassemble(result.cubin)


def compile_all(specs, archs=("sm_90",), use_cache: bool = True, workers: int = 4) -> dict:
    """(spec name, arch) -> (CompileResult, SASS text), for every spec on every arch."""
    jobs = [(s, a, use_cache) for s in specs for a in archs]
    with concurrent.futures.ProcessPoolExecutor(max(1, min(workers, os.cpu_count() or 1))) as pool:
        return {(name, arch): (result, text) for name, arch, result, text in pool.map(_build, jobs)}
