"""Block-sparse W: the pattern of kept blocks (BSR) and the problems built on it (numpy only).

W[N,K] is cut into ``block x block`` blocks (the last block row and column padded with zeros
when N or K is not a multiple of the block). A :class:`Pattern` says which blocks are kept, in
BSR form: ``indptr[r] .. indptr[r+1]`` index ``indices``, the block columns kept in block row
``r``, ascending. The values travel separately as ``blocks[nnzb, block, block]``, each block
row-major and contiguous, in the order of ``indices``.

A pattern's identity is the hash of its shape and structure. Kernels are timed on random values
on the pattern (the values do not change the time), so a problem carries the hash, and the
pattern itself is registered in each process that needs it (:func:`register`, :func:`lookup`).

A pattern comes from a mask (:meth:`Pattern.from_mask`), at random (:meth:`Pattern.random`), or
from the user's own W (:func:`load_weights`): its non-zero blocks (:func:`from_dense`) or its
largest blocks at a target density (:func:`prune_blocks`).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from codegen.problem import DType, Layout, Problem

__all__ = ["BLOCKS", "Pattern", "WeightsError", "from_dense", "load_weights", "lookup", "probe_pattern",
           "problem_for", "prune_blocks", "register"]

#: Block sizes the sparse kernels take.
BLOCKS = (16, 32, 64)


@dataclass(frozen=True, eq=False)
class Pattern:
    """Which ``block x block`` blocks of an ``n x k`` W are kept (BSR structure, no values)."""

    n: int
    k: int
    block: int
    indptr: np.ndarray  # int32 [block_rows + 1]
    indices: np.ndarray  # int32 [nnzb], ascending within each block row

    def __post_init__(self) -> None:
        if self.block not in BLOCKS:
            raise ValueError(f"block must be one of {', '.join(map(str, BLOCKS))}, got {self.block!r}")
        for name in ("n", "k"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        indptr = np.ascontiguousarray(self.indptr, dtype=np.int32)
        indices = np.ascontiguousarray(self.indices, dtype=np.int32)
        if indptr.shape != (self.block_rows + 1,) or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
            raise ValueError(f"indptr must be {self.block_rows + 1} non-decreasing offsets from 0")
        if indptr[-1] != indices.size:
            raise ValueError(f"indptr ends at {indptr[-1]} but there are {indices.size} block indices")
        if indices.size and (indices.min() < 0 or indices.max() >= self.block_cols):
            raise ValueError(f"block column indices must lie in [0, {self.block_cols})")
        for r in range(self.block_rows):
            row = indices[indptr[r]:indptr[r + 1]]
            if np.any(np.diff(row) <= 0):
                raise ValueError(f"block row {r}: column indices must be strictly ascending")
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "indices", indices)

    # ---- shape ----------------------------------------------------------------------------------
    @property
    def block_rows(self) -> int:
        return -(-self.n // self.block)

    @property
    def block_cols(self) -> int:
        return -(-self.k // self.block)

    @property
    def nnzb(self) -> int:
        return int(self.indices.size)

    @property
    def density(self) -> float:
        """The fraction of blocks kept."""
        return self.nnzb / (self.block_rows * self.block_cols)

    @property
    def row_counts(self) -> np.ndarray:
        return np.diff(self.indptr)

    @property
    def hash(self) -> str:
        h = hashlib.sha256(f"bsr:{self.n}:{self.k}:{self.block}:".encode())
        h.update(self.indptr.tobytes())
        h.update(self.indices.tobytes())
        return h.hexdigest()[:16]

    # ---- conversions ----------------------------------------------------------------------------
    def mask(self) -> np.ndarray:
        """Kept blocks as a bool array [block_rows, block_cols]."""
        m = np.zeros((self.block_rows, self.block_cols), dtype=bool)
        rows = np.repeat(np.arange(self.block_rows), self.row_counts)
        m[rows, self.indices] = True
        return m

    @classmethod
    def from_mask(cls, mask: np.ndarray, n: int, k: int, block: int) -> Pattern:
        """The pattern of a bool block mask [ceil(n/block), ceil(k/block)]."""
        mask = np.asarray(mask, dtype=bool)
        want = (-(-n // block), -(-k // block))
        if mask.shape != want:
            raise ValueError(f"a block mask for {n}x{k} in {block}x{block} blocks is {want[0]}x{want[1]}, "
                             f"got {mask.shape[0]}x{mask.shape[1]}")
        indptr = np.concatenate([[0], np.cumsum(mask.sum(axis=1))])
        return cls(n, k, block, indptr, np.nonzero(mask)[1])

    @classmethod
    def random(cls, n: int, k: int, block: int, density: float, seed: int = 0) -> Pattern:
        """``round(density * blocks)`` blocks chosen uniformly at random (a synthetic pattern)."""
        if not 0.0 <= density <= 1.0:
            raise ValueError(f"density must lie in [0, 1], got {density!r}")
        rows, cols = -(-n // block), -(-k // block)
        keep = round(density * rows * cols)
        chosen = np.random.default_rng(seed).choice(rows * cols, size=keep, replace=False)
        mask = np.zeros(rows * cols, dtype=bool)
        mask[chosen] = True
        return cls.from_mask(mask.reshape(rows, cols), n, k, block)

    def expand(self, blocks: np.ndarray) -> np.ndarray:
        """The dense [n, k] W of ``blocks[nnzb, block, block]`` on this pattern (zeros elsewhere)."""
        b = self.block
        dense = np.zeros((self.block_rows * b, self.block_cols * b), dtype=blocks.dtype)
        rows = np.repeat(np.arange(self.block_rows), self.row_counts)
        for i, (r, c) in enumerate(zip(rows, self.indices, strict=True)):
            dense[r * b:(r + 1) * b, c * b:(c + 1) * b] = blocks[i]
        return dense[: self.n, : self.k]

    def gather(self, dense: np.ndarray) -> np.ndarray:
        """The kept blocks ``[nnzb, block, block]`` of a dense [n, k] array (padding zero)."""
        b = self.block
        if dense.shape != (self.n, self.k):
            raise ValueError(f"W is {dense.shape[0]}x{dense.shape[1]}, the pattern is {self.n}x{self.k}")
        padded = np.zeros((self.block_rows * b, self.block_cols * b), dtype=dense.dtype)
        padded[: self.n, : self.k] = dense
        tiles = padded.reshape(self.block_rows, b, self.block_cols, b).swapaxes(1, 2)
        rows = np.repeat(np.arange(self.block_rows), self.row_counts)
        return np.ascontiguousarray(tiles[rows, self.indices])

    def transpose(self) -> Pattern:
        """The pattern of Wᵀ [k, n]: block (r, c) kept here is block (c, r) kept there."""
        return Pattern.from_mask(self.mask().T, self.k, self.n, self.block)

    def transpose_order(self) -> np.ndarray:
        """For each kept block of Wᵀ in its BSR order (``transpose``), its index among the kept blocks
        here (int32)."""
        rows = np.repeat(np.arange(self.block_rows), self.row_counts)
        order = np.full(self.mask().shape, -1, dtype=np.int32)
        order[rows, self.indices] = np.arange(self.nnzb, dtype=np.int32)
        return np.ascontiguousarray(order.T[self.mask().T])

    def to_dict(self) -> dict:
        return {"n": self.n, "k": self.k, "block": self.block, "indptr": self.indptr.tolist(),
                "indices": self.indices.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> Pattern:
        return cls(d["n"], d["k"], d["block"], np.asarray(d["indptr"]), np.asarray(d["indices"]))


_REGISTRY: dict[str, Pattern] = {}


def register(pattern: Pattern) -> str:
    """Make ``pattern`` findable by its hash in this process; returns the hash."""
    _REGISTRY[pattern.hash] = pattern
    return pattern.hash


def lookup(problem_or_hash: Problem | str) -> Pattern:
    """The registered pattern of a sparse problem (or of a hash)."""
    key = problem_or_hash if isinstance(problem_or_hash, str) else problem_or_hash.pattern
    try:
        return _REGISTRY[key]
    except KeyError:
        raise LookupError(f"block-sparse pattern {key!r} is not known in this process: build the problem with "
                          "codegen.sparse.problem_for (or register its pattern)") from None


def problem_for(m: int, pattern: Pattern, dtype: DType | str = DType.fp32, bias: bool = False,
                layout: Layout | str = Layout.forward) -> Problem:
    """The ``layout`` GEMM of a layer at batch ``m`` whose W [out, in] is block-sparse on ``pattern``
    (registered here): forward ``Y = X·Wᵀ (+ b)``; grad_input ``dX = dY·W`` (N = in, K = out);
    grad_weight ``dW = dYᵀ·X`` sampled at the pattern's kept blocks (M = out, N = in, K = the batch;
    with ``bias`` also db)."""
    layout = Layout(layout)
    m, n, k = {Layout.forward: (m, pattern.n, pattern.k), Layout.grad_input: (m, pattern.k, pattern.n),
               Layout.grad_weight: (pattern.n, pattern.k, m)}[layout]
    return Problem(m, n, k, DType(dtype), layout, bias=bias, block=pattern.block, density=pattern.density,
                   pattern=register(pattern))


def probe_pattern(n: int, k: int, block: int) -> Pattern:
    """The small pattern every sparse evaluation also checks: about half the blocks kept, the
    first block row empty when there are several, at least one block kept."""
    p = Pattern.random(n, k, block, 0.5, seed=1)
    mask = p.mask()
    if mask.shape[0] > 1:
        mask[0] = False
    if not mask.any():
        mask[-1, -1] = True
    return Pattern.from_mask(mask, n, k, block)


# ---- patterns of a given W ------------------------------------------------------------------------
def _dense_2d(w: np.ndarray) -> np.ndarray:
    w = np.asarray(w)
    if w.ndim != 2 or w.size == 0:
        raise ValueError(f"W must be a non-empty 2-D array [N, K], got shape {tuple(w.shape)}")
    return w


def _block_view(w: np.ndarray, block: int) -> np.ndarray:
    """``w`` zero-padded to whole blocks, as [block_rows, block, block_cols, block]."""
    if block not in BLOCKS:
        raise ValueError(f"block must be one of {', '.join(map(str, BLOCKS))}, got {block!r}")
    n, k = w.shape
    rows, cols = -(-n // block), -(-k // block)
    padded = np.zeros((rows * block, cols * block), dtype=w.dtype)
    padded[:n, :k] = w
    return padded.reshape(rows, block, cols, block)


def prune_blocks(w: np.ndarray, block: int, density: float) -> tuple[Pattern, np.ndarray]:
    """Magnitude block pruning of a dense W[N, K]: keep the ``round(density * blocks)`` blocks of
    largest Frobenius norm (the zero padding at the bottom and right edges counts as zeros; equal
    norms go to the lower row-major block index). Returns the pattern and its kept blocks
    ``pattern.gather(w)``."""
    w = _dense_2d(w)
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density must lie in [0, 1], got {density!r}")
    if not np.all(np.isfinite(w)):
        raise ValueError("W has NaN or infinite values: its blocks cannot be ranked by magnitude")
    tiles = _block_view(w.astype(np.float64, copy=False), block)
    norms = np.square(tiles).sum(axis=(1, 3))  # squared Frobenius norm per block, same order
    keep = round(density * norms.size)
    order = np.argsort(-norms.ravel(), kind="stable")  # stable: ties keep the lower block index
    mask = np.zeros(norms.size, dtype=bool)
    mask[order[:keep]] = True
    pattern = Pattern.from_mask(mask.reshape(norms.shape), w.shape[0], w.shape[1], block)
    return pattern, pattern.gather(w)


def from_dense(w: np.ndarray, block: int, mask: np.ndarray | None = None) -> tuple[Pattern, np.ndarray]:
    """The pattern of a dense W[N, K] and its kept blocks ``[nnzb, block, block]``.

    Without ``mask`` a block is kept iff any of its elements is non-zero (all-zero blocks are
    skipped). ``mask`` (bool, or numbers: non-zero means kept) is either an element mask of W's
    shape [N, K], which keeps every block holding a kept element, the elements outside the mask
    being zero in the returned blocks; or a block mask [ceil(N/block), ceil(K/block)], which keeps
    whole blocks. Any other shape is a ValueError. The density is the pattern's."""
    w = _dense_2d(w)
    n, k = w.shape
    rows, cols = -(-n // block), -(-k // block)
    if mask is None:
        keep = (_block_view(w, block) != 0).any(axis=(1, 3))
    else:
        mask = np.asarray(mask)
        if mask.dtype != bool:
            mask = mask != 0
        if mask.shape == (n, k):
            keep = _block_view(mask, block).any(axis=(1, 3))
            w = np.where(mask, w, np.zeros((), dtype=w.dtype))
        elif mask.shape == (rows, cols):
            keep = mask
        else:
            raise ValueError(f"a mask for a {n}x{k} W in {block}x{block} blocks is an element mask {n}x{k} or a "
                             f"block mask {rows}x{cols}, got {'x'.join(map(str, mask.shape)) or 'a scalar'}")
    pattern = Pattern.from_mask(keep, n, k, block)
    return pattern, pattern.gather(w)


# ---- reading W from a file ------------------------------------------------------------------------
class WeightsError(ValueError):
    """A weights file (or the tensor named in it) cannot be used; the message is one line."""


#: The suffixes :func:`load_weights` reads.
WEIGHT_SUFFIXES = (".npy", ".npz", ".pt", ".pth", ".safetensors")

# safetensors dtype -> (numpy dtype read from the file, little-endian). BF16 is read as its raw
# 16 bits and widened to float32 by hand (numpy has no bfloat16).
_SAFETENSORS_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
    "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}


def split_weights_spec(text: str) -> tuple[Path, str | None]:
    """``PATH[:NAME]`` as (path, name). A path that exists as given is taken whole (it may hold a
    colon); otherwise the text after the last colon names the tensor."""
    if not text:
        raise WeightsError("no weights file named")
    path = Path(text).expanduser()
    if path.exists() or ":" not in text:
        return path, None
    head, _, name = text.rpartition(":")
    if not head:
        raise WeightsError(f"{text!r}: no file before ':'")
    if not name:
        raise WeightsError(f"{text!r}: no tensor name after ':'")
    return Path(head).expanduser(), name


def _listing(tensors: dict[str, tuple[int, ...]]) -> str:
    names = [n for n, shape in tensors.items() if len(shape) == 2]
    if not names:
        shown = ", ".join(f"{n} [{'x'.join(map(str, s))}]" for n, s in list(tensors.items())[:8])
        return "it holds no 2-D tensor" + (f" ({shown}{', ...' if len(tensors) > 8 else ''})" if shown else "")
    more = f", ... ({len(names) - 20} more)" if len(names) > 20 else ""
    return f"its 2-D tensors: {', '.join(names[:20])}{more}"


def _choose(where: str, tensors: dict[str, tuple[int, ...]], name: str | None) -> str:
    """The one tensor to read: ``name``, or the only 2-D one."""
    if name is not None:
        if name not in tensors:
            raise WeightsError(f"{where} has no tensor {name!r}; {_listing(tensors)}")
        return name
    two_d = [n for n, shape in tensors.items() if len(shape) == 2]
    if len(two_d) == 1:
        return two_d[0]
    if not two_d:
        raise WeightsError(f"{where}: {_listing(tensors)}")
    raise WeightsError(f"{where} holds {len(two_d)} 2-D tensors, pick one with {where}:NAME; {_listing(tensors)}")


def _as_weights(array: np.ndarray, where: str) -> np.ndarray:
    if array.ndim != 2:
        raise WeightsError(f"{where} is {array.ndim}-D (shape {'x'.join(map(str, array.shape)) or 'scalar'}); "
                           f"W of a linear layer is 2-D [N, K]")
    if array.size == 0:
        raise WeightsError(f"{where} is empty (shape {array.shape[0]}x{array.shape[1]})")
    if array.dtype.kind not in "biuf":
        raise WeightsError(f"{where} holds {array.dtype} values, not real numbers")
    return np.ascontiguousarray(array, dtype=np.float32)


def _magic(path: Path, n: int) -> bytes:
    with path.open("rb") as f:
        return f.read(n)


def _read_numpy(path: Path, name: str | None) -> np.ndarray:
    if not _magic(path, 6).startswith((b"\x93NUMPY", b"PK")):
        raise WeightsError(f"{path} is not a numpy .npy or .npz file")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise WeightsError(f"{path} is not a numpy .npy or .npz file it can read ({_first_line(e)})") from None
    if isinstance(loaded, np.ndarray):
        if name is not None:
            raise WeightsError(f"{path} holds one array; drop ':{name}'")
        return _as_weights(loaded, str(path))
    with loaded:  # .npz: an archive of named arrays
        try:
            shapes = {n: tuple(loaded[n].shape) for n in loaded.files}
            chosen = _choose(str(path), shapes, name)
            return _as_weights(loaded[chosen], f"{path}:{chosen}")
        except (ValueError, OSError, EOFError) as e:
            if isinstance(e, WeightsError):
                raise
            raise WeightsError(f"{path} is a damaged .npz file ({_first_line(e)})") from None


def _tensors_of(obj, prefix: str = "") -> dict:
    """The tensors of a torch checkpoint: a bare tensor (named ''), or a (nested) state dict whose
    names are joined with '.'."""
    import torch

    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    out: dict = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.update(_tensors_of(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _read_torch(path: Path, name: str | None) -> np.ndarray:
    if not _magic(path, 4).startswith((b"PK", b"\x80")):  # a zip archive (torch.save) or a legacy pickle
        raise WeightsError(f"{path} is not a torch file")
    try:
        import torch
    except ImportError:
        raise WeightsError(f"reading {path.suffix} needs torch (pip install gemmscape[torch])") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle, zip and torch errors alike mean "cannot read it"
        if "weights only" in str(e).lower():
            raise WeightsError(f"{path} holds more than tensors (a pickled object torch will not load safely); "
                               f"save the model's state_dict() or the weight tensor instead") from None
        raise WeightsError(f"{path} is not a torch file it can read ({_first_line(e)})") from None
    tensors = _tensors_of(obj)
    if not tensors:
        raise WeightsError(f"{path} holds no tensor (a {type(obj).__name__}); save a tensor or a state dict")
    if set(tensors) == {""}:  # a bare tensor
        if name is not None:
            raise WeightsError(f"{path} holds one tensor; drop ':{name}'")
        chosen, where = "", str(path)
    else:
        chosen = _choose(str(path), {n: tuple(t.shape) for n, t in tensors.items()}, name)
        where = f"{path}:{chosen}"
    tensor = tensors[chosen].detach()
    if tensor.is_complex():
        raise WeightsError(f"{where} holds complex values, not real numbers")
    if tensor.ndim != 2:
        raise WeightsError(f"{where} is {tensor.ndim}-D (shape {'x'.join(map(str, tensor.shape)) or 'scalar'}); "
                           f"W of a linear layer is 2-D [N, K]")
    return _as_weights(tensor.to(torch.float32).numpy(), where)


def _read_safetensors(path: Path, name: str | None) -> np.ndarray:
    """Read the format directly: an 8-byte little-endian header length, a JSON header (per tensor:
    dtype, shape, data_offsets into the data that follows), then raw little-endian data. Only the
    chosen tensor's bytes are read. (The safetensors package's numpy API cannot return bf16, and
    its torch API needs torch, so reading the format, which is this simple, keeps bf16 weights
    readable with numpy alone.)"""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightsError(f"{path} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise WeightsError(f"{path} is not a safetensors file (its header says {length} bytes, the file has "
                               f"{size - 8})")
        try:
            header = json.loads(f.read(length).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise WeightsError(f"{path} is not a safetensors file (its header is not JSON)") from None
        if not isinstance(header, dict):
            raise WeightsError(f"{path} is not a safetensors file (its header is not a JSON object)")
        header.pop("__metadata__", None)
        data_size = size - 8 - length
        shapes = {}
        for tname, info in header.items():
            try:
                shape = tuple(int(d) for d in info["shape"])
                start, end = (int(o) for o in info["data_offsets"])
                dtype = str(info["dtype"])
            except (KeyError, TypeError, ValueError):
                raise WeightsError(f"{path} is a damaged safetensors file (tensor {tname!r} has no valid dtype, "
                                   f"shape and data_offsets)") from None
            if not 0 <= start <= end <= data_size:
                raise WeightsError(f"{path} is a damaged safetensors file (tensor {tname!r} lies outside its data; "
                                   f"truncated?)")
            shapes[tname] = shape
            header[tname] = (dtype, shape, start, end)
        chosen = _choose(str(path), shapes, name)
        where = f"{path}:{chosen}" if len(header) > 1 or name is not None else str(path)
        dtype, shape, start, end = header[chosen]
        if dtype not in _SAFETENSORS_DTYPES:
            raise WeightsError(f"{where} holds {dtype} values, which gemmscape does not read "
                               f"({', '.join(_SAFETENSORS_DTYPES)} it does)")
        np_dtype = np.dtype(_SAFETENSORS_DTYPES[dtype])
        count = int(np.prod(shape, dtype=np.int64))
        if end - start != count * np_dtype.itemsize:
            raise WeightsError(f"{path} is a damaged safetensors file (tensor {chosen!r}: {end - start} bytes for "
                               f"{count} {dtype} values)")
        f.seek(8 + length + start)
        array = np.frombuffer(f.read(end - start), dtype=np_dtype, count=count).reshape(shape)
    if dtype == "BF16":  # bfloat16 is the top half of a float32
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return _as_weights(array, where)


def _first_line(e: BaseException, limit: int = 160) -> str:
    """An exception's message as one short line (its first line, cut after ``limit`` characters)."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line if len(line) <= limit else line[:limit].rstrip() + "…"


def load_weights(path: str) -> np.ndarray:
    """A dense W[N, K] as float32 from ``PATH[:NAME]``: a ``.npy`` array, a ``.npz`` archive, a torch
    ``.pt``/``.pth`` file (a tensor or a state dict, nested dicts' names joined with '.'; torch is
    imported only here) or a ``.safetensors`` file. ``NAME`` picks one tensor of a file holding
    several; without it the file's only 2-D tensor is taken. fp16, bf16, integer and float64
    values become float32. Any file or tensor that cannot be used is a :class:`WeightsError`
    (a ValueError) with a one-line message."""
    file, name = split_weights_spec(str(path))
    if file.is_dir():
        raise WeightsError(f"{file} is a folder, not a weights file")
    if not file.exists():
        raise WeightsError(f"no weights file {file}")
    suffix = file.suffix.lower()
    if suffix not in WEIGHT_SUFFIXES:
        raise WeightsError(f"cannot read {file}: weights are {', '.join(WEIGHT_SUFFIXES[:-1])} or "
                           f"{WEIGHT_SUFFIXES[-1]} files")
    try:
        if suffix in (".npy", ".npz"):
            return _read_numpy(file, name)
        if suffix in (".pt", ".pth"):
            return _read_torch(file, name)
        return _read_safetensors(file, name)
    except OSError as e:
        raise WeightsError(f"cannot read {file}: {e.strerror or _first_line(e)}") from None
