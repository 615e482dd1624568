"""SASS of a cubin through ``nvdisasm``, and what it says about a kernel's global loads.

Needs no GPU. ``nvdisasm`` comes from the pip package ``nvidia-cuda-nvdisasm`` (the ``test`` extra),
else from a CUDA toolkit (``CUDA_HOME``, ``/usr/local/cuda``) or ``PATH``.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["SassError", "disassemble", "functions", "global_load_widths", "mnemonics", "nvdisasm_path", "opcodes"]

_MISSING = (
    "nvdisasm not found: install the pip package nvidia-cuda-nvdisasm "
    '(pip install -e ".[test]"), or set CUDA_HOME to a CUDA toolkit'
)
#: One code section per kernel: ``.section .text.<function>,"ax",@progbits``.
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_OTHER_SECTION = re.compile(r"^\s*\.section\s")
#: An instruction line: ``/*0910*/  @!P3 LDG.E.128.CONSTANT R12, desc[UR10][R12.64] ;``.
_LDG = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T]\s+)?LDG((?:\.[A-Z0-9_]+)*)\s", re.IGNORECASE)
#: Width modifiers of LDG; without one a load is 32 bits wide.
_WIDTH = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "32": 32, "64": 64, "128": 128, "256": 256}


#: Where a CUDA toolkit usually lives when CUDA_HOME does not say.
TOOLKIT = Path("/usr/local/cuda")


class SassError(RuntimeError):
    """nvdisasm is missing or refused the cubin."""


def nvdisasm_path() -> Path:
    """``nvdisasm`` from the pip nvidia packages, else ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``, ``PATH``."""
    candidates: list[Path] = []
    try:
        import nvidia  # namespace package of the pip CUDA wheels

        for root in nvidia.__path__:
            candidates += sorted(Path(root).glob("cu*/bin/nvdisasm"), reverse=True)
            candidates.append(Path(root) / "cuda_nvdisasm" / "bin" / "nvdisasm")
    except ImportError:
        pass
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / "nvdisasm")
    candidates.append(TOOLKIT / "bin" / "nvdisasm")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("nvdisasm")
    if found:
        return Path(found)
    raise SassError(_MISSING)


def disassemble(cubin: bytes, branch_targets: bool = False, timeout: float = 60.0) -> str:
    """The code sections of ``cubin`` as SASS text (``nvdisasm -c``).

    ``branch_targets`` runs nvdisasm's dataflow analysis, which labels indirect branch targets;
    it costs about a third more time and changes no instruction.
    """
    tool = nvdisasm_path()
    options = ["-c"] if branch_targets else ["-c", "-ndf"]
    with tempfile.TemporaryDirectory(prefix="gemmscape-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run(
            [str(tool), *options, str(path)], capture_output=True, text=True, timeout=timeout, check=False
        )
    if proc.returncode != 0:
        raise SassError(f"nvdisasm failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def functions(sass: str) -> dict[str, str]:
    """SASS text of each code section, keyed by its function name."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in sass.splitlines():
        if m := _SECTION.match(line):
            current = out.setdefault(m.group(1), [])
        elif _OTHER_SECTION.match(line):
            current = None
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in out.items()}


def global_load_widths(sass: str, function: str | None = None) -> collections.Counter[int]:
    """How many ``LDG`` instructions of each width in bits (``LDG.E.128`` -> 128, ``LDG.E`` -> 32).

    Counts static instructions, all of ``sass`` or of one function's code section.
    """
    if function is not None:
        sections = functions(sass)
        if function not in sections:
            raise KeyError(f"no function {function!r} in this SASS; it has {sorted(sections)}")
        sass = sections[function]
    widths: collections.Counter[int] = collections.Counter()
    for line in sass.splitlines():
        if m := _LDG.match(line):
            modifiers = m.group(1).upper().split(".")
            widths[next((_WIDTH[x] for x in modifiers if x in _WIDTH), 32)] += 1
    return widths


#: Any instruction line: an address comment, an optional predicate, then the opcode.
_OPCODE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*)", re.IGNORECASE)


def opcodes(sass: str, function: str | None = None) -> collections.Counter[str]:
    """Static count of each opcode (``HMMA.16816.F32.BF16`` counts as ``HMMA``), of all of
    ``sass`` or of one function's code section."""
    if function is not None:
        sass = functions(sass)[function]
    return collections.Counter(m.group(1).upper() for line in sass.splitlines() if (m := _OPCODE.match(line)))


#: An instruction's full mnemonic, modifiers included: ``HMMA.SP.16832.F32.BF16``.
_MNEMONIC = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)", re.IGNORECASE)


def mnemonics(sass: str, function: str | None = None, opcode: str | None = None) -> collections.Counter[str]:
    """Static count of each full mnemonic (``HMMA.SP.16832.F32.BF16``: the sparse MMA of m16n8k32 in
    bf16), of all of ``sass`` or of one function's code section; with ``opcode``, only that opcode's."""
    if function is not None:
        sass = functions(sass)[function]
    found = (m.group(1).upper() for line in sass.splitlines() if (m := _MNEMONIC.match(line)))
    return collections.Counter(x for x in found if opcode is None or x.split(".")[0] == opcode.upper())
