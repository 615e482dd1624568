"""CUDA source -> cubin through NVRTC (cuda-python), with the ptxas report and a disk cache.

Needs no GPU: NVRTC is a compiler library. The CUDA headers are looked up in ``CUDA_HOME``, the
pip ``nvidia-*`` packages and ``/usr/local/cuda``, in that order.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from codegen import render

DEFAULT_ARCH = "sm_90"
STD = "c++17"


class CompileError(RuntimeError):
    """NVRTC refused the source; ``log`` holds the program log."""

    def __init__(self, name: str, log: str, source: str = "") -> None:
        self.name, self.log = name, log
        lines = source.splitlines()
        context = []
        for m in re.finditer(r"\((\d+)\): error", log):
            n = int(m.group(1))
            if 0 < n <= len(lines):
                context.append(f"  line {n}: {lines[n - 1].strip()}")
        super().__init__(f"NVRTC failed to compile {name}:\n{log.strip()}" + ("\n" + "\n".join(context) if context else ""))


@dataclass
class CompileResult:
    name: str
    arch: str
    options: list[str]
    cubin: bytes = field(repr=False)
    log: str
    report: dict
    nvrtc_version: str
    source_hash: str
    seconds: float
    cached: bool = False

    def meta(self) -> dict:
        d = asdict(self)
        d.pop("cubin")
        return d


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def _pip_include_dirs() -> list[Path]:
    try:
        import nvidia  # namespace package of the pip CUDA wheels
    except ImportError:
        return []
    dirs = []
    for root in nvidia.__path__:
        dirs += sorted(Path(root).glob("cu*/include")) + sorted(Path(root).glob("cuda_runtime/include"))
    return dirs


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """Folders holding cuda_fp16.h and friends, best first."""
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    candidates += _pip_include_dirs()
    candidates.append(Path("/usr/local/cuda/include"))
    found = [d for d in candidates if (d / "cuda_fp16.h").is_file()]
    if not found:
        raise RuntimeError(
            "CUDA headers not found: install the pip package nvidia-cuda-runtime "
            "(pip install -e .), or set CUDA_HOME to a CUDA toolkit"
        )
    # One folder only (headers of two toolkits do not mix); prefer one that also has mma.h's
    # internals (crt/, from the pip package nvidia-cuda-crt or a toolkit), which wmma needs.
    complete = [d for d in found if (d / "crt" / "mma.h").is_file()]
    return (str((complete or found)[0]),)


@functools.cache
def default_arch() -> str:
    """The visible GPU's architecture (asked of nvidia-smi, so no CUDA context here), else sm_90."""
    if os.environ.get("GEMMSCAPE_ARCH"):
        return os.environ["GEMMSCAPE_ARCH"]
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout.split()
            if out:
                return "sm_" + out[0].replace(".", "")
        except (subprocess.SubprocessError, OSError):
            pass
    return DEFAULT_ARCH


def options_for(arch: str, defines: dict[str, str] | None = None) -> list[str]:
    opts = [f"-arch={arch}", f"-std={STD}", "--ptxas-options=-v"]
    opts += [f"-D{k}={v}" for k, v in (defines or {}).items()]
    return opts


def cache_dir() -> Path:
    return Path(os.environ.get("GEMMSCAPE_CACHE", Path.home() / ".cache" / "gemmscape")) / "cubin"


_FUNC = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(log: str) -> dict:
    """Per entry function: registers, barriers, static smem, stack frame, spill stores/loads."""
    out: dict[str, dict] = {}
    current = None
    for line in log.splitlines():
        if (m := re.search(r"Compiling entry function '(\S+)'", line)) or (m := _FUNC.search(line)):
            current = out.setdefault(m.group(1), {})
        elif (m := _FRAME.search(line)) and current is not None:
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif (m := re.search(r"Used (\d+) registers", line)) and current is not None:
            current["registers"] = int(m.group(1))
            b = re.search(r"used (\d+) barriers", line)
            s = re.search(r"(\d+) bytes smem", line)
            current["barriers"] = int(b.group(1)) if b else 0
            current["smem_static"] = int(s.group(1)) if s else 0
    return out


def compile_source(source: str, name: str, arch: str | None = None, use_cache: bool = True,
                   target: str | None = None) -> CompileResult:
    """Compile to a cubin for ``arch`` (default: the device's, else sm_90). ``target`` is the -arch
    NVRTC gets when it differs from the device's arch (sm_90a for sm_90's arch-specific
    instructions: ``codegen.families.compile_target``); the result keeps ``arch``, the device's."""
    from cuda.bindings import nvrtc

    arch = arch or default_arch()
    target = target or arch
    for a in (arch, target):
        if not re.fullmatch(r"sm_\d+a?", a):
            raise ValueError(f"arch must look like sm_90, got {a!r}")
    options = options_for(target)
    version = nvrtc_version()
    source_hash = render.source_hash(source)
    key = hashlib.sha256(json.dumps([source_hash, options, version]).encode()).hexdigest()[:32]
    cached = cache_dir() / f"{key}.cubin"
    if use_cache and cached.is_file() and cached.with_suffix(".json").is_file():
        meta = json.loads(cached.with_suffix(".json").read_text())
        meta.update(cubin=cached.read_bytes(), cached=True)
        return CompileResult(**meta)

    start = time.perf_counter()
    all_opts = [o.encode() for o in options + [f"-I{d}" for d in include_dirs()]]
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(all_opts), all_opts)
        log = _program_log(prog)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(name, log, source)
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(err, "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    result = CompileResult(
        name=name, arch=arch, options=options, cubin=cubin, log=log, report=parse_ptxas(log),
        nvrtc_version=version, source_hash=source_hash, seconds=time.perf_counter() - start,
    )
    if use_cache:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(cubin)
            tmp.replace(cached)
            cached.with_suffix(".json").write_text(json.dumps(result.meta()))
        except OSError:
            pass  # a read-only cache is not an error
    return result


def _program_log(prog) -> str:
    from cuda.bindings import nvrtc

    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\x00").decode(errors="replace")


def _check(err, what: str) -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
