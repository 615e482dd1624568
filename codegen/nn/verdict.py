"""Whether a tuned kernel beat cuBLAS: the one rule that decides, and the record a bundle keeps of it.

A bundle (codegen.nn.bundle) keeps per GEMM a ``Verdict``: our time and cuBLAS's (torch's op) as one
harness measured them (``timing``), their ratio (cuBLAS ÷ ours: above 1 means ours was faster), the
noise margin it was judged at, and the ``winner``. ``judge`` is the only place a winner is decided:
ours only where the ratio clears 1 + margin; a tie within the noise goes to cuBLAS, since a user who
swaps our kernels in must never be slower by that choice. Where nothing measured cuBLAS, the winner
is ``unknown`` (codegen.nn then runs ours, as before verdicts existed, and says so once in its log).

One rule for a block-sparse W too: there cuBLAS is the dense layer, ``F.linear`` (or dY·W, dYᵀ·X) on
the same W as a dense matrix, zeros outside the kept blocks, timed by each harness beside ours; a
block-sparse kernel runs only where it beats the dense layer, since a user who prunes a model and then
runs it slower than before gained nothing. Where it does not, ``codegen.nn.sparse.BlockSparseLinear``
runs torch on that dense W: kept between inference calls (so it costs what the dense layer costs, and
holds its memory), scattered from the blocks in a train step (whose dW is dense dYᵀ·X gathered at the
kept blocks).

The harnesses (``TIMINGS``):

- ``cold_single``: one call after an L2 flush, as the search measures every trial (codegen.engine);
  the store's trial rows keep the cuBLAS baseline timed so (``baselines.cublas``).
- ``engine``: the layer called back to back over distinct weights far past L2 in one captured CUDA
  graph, as an inference engine runs it (codegen.nn.timing).
- ``train_step``: the layer's whole train step (forward and both gradients) with this GEMM on ours
  or on torch's op, the others unchanged (codegen.nn.step).

Cold single calls make cuBLAS look slow on skinny forward GEMMs (it streams W far below the
bandwidth it reaches back to back; figures: benchmarks/results/engine-*.json against the store's
baselines), so a ``cold_single`` win of ours in a forward GEMM of ``ENGINE_MAX_M`` rows or fewer is
not trusted for inference: ``judge`` makes it ``unknown`` and engine timing (``codegen tune-model
--bundle``) decides. Nothing here needs torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["ENGINE_MAX_M", "MARGIN", "TIMINGS", "WINNERS", "Verdict", "deciding", "from_row", "judge", "untrusted"]

#: How each verdict's times were measured (see the module docstring).
TIMINGS = ("cold_single", "engine", "train_step")
WINNERS = ("ours", "cublas", "unknown")
#: The noise margin: ours wins only where cuBLAS's median over ours clears 1 + MARGIN. The medians of
#: one and the same cuBLAS call, timed in separate runs on one GPU, differ by up to about 2% (the
#: torch_linear baselines of the cases repeated across benchmarks/results/linear-NVIDIA_H200-*.json,
#: eager and graph-replayed alike); a smaller lead is not told apart from that noise, so it is no win.
MARGIN = 0.02
#: Which verdict decides where a GEMM has several, first first: the harness nearest how the layer runs.
PRECEDENCE = ("engine", "train_step", "cold_single")
#: Forward GEMMs of at most this many rows are judged for inference by engine timing only.
ENGINE_MAX_M = 128


@dataclass(frozen=True)
class Verdict:
    """One GEMM's measured comparison with cuBLAS, as a bundle's index keeps it (``to_dict``)."""

    ours_ms: float | None
    cublas_ms: float | None
    ratio: float | None
    timing: str
    margin: float
    winner: str
    note: str = ""
    refused: str = ""  # why ours may not run whatever the times (a wrong result): cuBLAS's by that alone

    def to_dict(self) -> dict:
        d = asdict(self)
        for optional in ("note", "refused"):
            if not d[optional]:
                del d[optional]
        return d

    @classmethod
    def from_dict(cls, d: dict | None, problem=None) -> Verdict | None:
        """A verdict read back from an index entry of ``problem`` (None: the entry has none, as in
        bundles written before verdicts). The winner is judged again from the times, so an index
        edited by hand or written under an older rule cannot disagree with ``judge``."""
        if not isinstance(d, dict):
            return None
        refused = d.get("refused") if isinstance(d.get("refused"), str) else ""
        return judge(d.get("ours_ms"), d.get("cublas_ms"), str(d.get("timing", "cold_single")), problem,
                     margin=float(d.get("margin", MARGIN)), refused=refused)

    def reason(self) -> str:
        """Why torch's op runs where cuBLAS won: the words codegen.nn's fallbacks report."""
        ratio = f"{self.ratio:.3f}" if self.ratio is not None else "-"
        if self.refused:
            return f"cuBLAS won: ours {self.refused} (timing {self.timing})"
        return f"cuBLAS won (ratio {ratio} at margin {self.margin:g}, timing {self.timing})"

    def describe(self) -> str:
        """One line for tables: winner, ratio, margin and timing."""
        ratio = f"{self.ratio:.3f}x" if self.ratio is not None else "no ratio"
        return f"{self.winner} ({ratio} at margin {self.margin:g}, {self.timing})" + (f"; {self.note}" if self.note else "")


def judge(ours_ms: float | None, cublas_ms: float | None, timing: str, problem=None, *,
          margin: float = MARGIN, refused: str = "") -> Verdict:
    """THE rule: ``ours`` only where cublas_ms / ours_ms > 1 + ``margin``, else ``cublas``; ``unknown``
    where either time is missing (or not a positive number), and where ours would win but the harness
    does not decide for ``problem`` (a codegen.problem.Problem; ``untrusted``): a cuBLAS win there
    stands, since that harness only ever flatters ours. ``refused`` (why ours may not run, e.g. a
    wrong result in that harness) makes it ``cublas`` whatever the times."""
    if timing not in TIMINGS:
        raise ValueError(f"timing {timing!r}: one of {', '.join(TIMINGS)}")
    if margin < 0:
        raise ValueError(f"margin {margin}: not negative")
    measured = all(isinstance(t, int | float) and not isinstance(t, bool) and t > 0 for t in (ours_ms, cublas_ms))
    ratio = cublas_ms / ours_ms if measured else None
    note = ""
    if refused:
        winner = "cublas"
    elif not measured:
        winner = "unknown"
        note = "no cuBLAS baseline measured" if ours_ms else "ours not measured"
    elif ratio > 1 + margin:
        why = untrusted(problem, timing) if problem is not None else None
        winner, note = ("unknown", why) if why else ("ours", "")
    else:
        winner = "cublas"
    return Verdict(ours_ms, cublas_ms, ratio, timing, margin, winner, note, refused)


def untrusted(problem, timing: str) -> str | None:
    """Why a win of ours in ``timing`` does not decide for ``problem``, or None: a cold single call
    of a forward GEMM of at most ``ENGINE_MAX_M`` rows (engine timing decides it)."""
    if timing == "cold_single" and problem.layout.value == "forward" and problem.m <= ENGINE_MAX_M:
        return f"cold_single at M <= {ENGINE_MAX_M} does not decide for inference: engine timing does"
    return None


def from_row(row: dict, problem, *, margin: float = MARGIN) -> Verdict:
    """The verdict of a store trial row of ``problem`` (store.records.trial_dict: ``median_ms`` and the
    cuBLAS baseline ``baselines.cublas.median_ms``, both timed by the search as cold single calls)."""
    base = (row.get("baselines") or {}).get("cublas")
    cublas_ms = base.get("median_ms") if isinstance(base, dict) else None
    if cublas_ms is None and row.get("ratio_cublas") and row.get("median_ms"):
        cublas_ms = row["ratio_cublas"] * row["median_ms"]  # a row that kept the ratio alone
    return judge(row.get("median_ms"), cublas_ms, "cold_single", problem, margin=margin)


def deciding(verdicts: dict) -> dict | None:
    """Of a GEMM's verdicts by timing (as dicts), the one that decides (``PRECEDENCE``), or None."""
    return next((verdicts[t] for t in PRECEDENCE if isinstance(verdicts.get(t), dict)), None)
