"""Which families fit a problem on an arch: the one rule every command's default uses.

A family fits when its space takes the problem (its dtypes, the layout, a dense, block-sparse or
2:4 W: ``search.space.space_for``; a 2:4 W only in the families that name it) and it has a valid kernel for the problem on the arch (one of its seeds
or of a few hundred random points passes ``spec.check``: e.g. the Hopper family needs sm_90, and
its backward GEMMs 16-byte rows). Without families asked for, a search takes every family that
fits and is meant for the problem's dtype (a family module's ``DEFAULT_DTYPES``, else its
``DTYPES``): the SIMT family computes 16-bit problems too, but is searched for them only when asked
or when no tensor-core family fits. Families come in the order of their ``RANK`` (the fastest
first where several fit: docs/families.md), then by name. A dtype is never widened: fp32
problems are computed in fp32 (tf32 only when asked, with ``--dtype tf32``).
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass

from codegen import families
from codegen.problem import Problem
from codegen.spec import DeviceLimits

__all__ = ["Fit", "chosen", "default_family", "fitting", "generated", "ranked"]


@dataclass(frozen=True)
class Fit:
    """A family and whether it fits: its space when it does, else why not."""

    family: str
    space: object | None
    why: str | None = None


def ranked(names: list[str] | None = None) -> list[str]:
    """Family names (default: all) in their preference order."""
    names = families.names() if names is None else names
    return sorted(names, key=lambda n: (getattr(families.get(n), "RANK", 100), n))


def generated(problem: Problem, space, limits: DeviceLimits | None = None, samples: int = 400,
              seed: int = 0) -> str | None:
    """None when ``space``'s family has a valid kernel for ``problem`` (one of its seeds, or one of
    ``samples`` random points); else the reason its kernels give most often."""
    from search.space import seeds

    rng = random.Random(seed)
    reasons: collections.Counter = collections.Counter()
    points = [dict(p) for p in seeds(space.family, problem.block, problem.layout)]
    points += [{k: rng.choice(v) for k, v in space.dims.items()} for _ in range(samples)]
    for point in points:
        try:
            spec = space.spec(point, problem)
        except (KeyError, ValueError, TypeError):
            continue
        why = spec.check(problem, limits) if limits is not None else spec.check(problem)
        if not why:
            return None
        reasons.update(why)
    if not reasons:
        return f"no point of the {space.family} space maps onto a kernel for {problem.key}"
    return reasons.most_common(1)[0][0]


def fitting(problem: Problem, limits: DeviceLimits | None, asked: list[str] | None = None,
            restricted: bool | str = False) -> list[Fit]:
    """Every family asked (default: all), in preference order (asked ones in the order given),
    each with its space where it is to be searched for ``problem`` on a device of ``limits``
    (None: sm_90's), else why not."""
    from search.space import space_for

    out = []
    for family in (list(dict.fromkeys(asked)) if asked else ranked()):
        try:
            space = space_for(family, problem.dtype, restricted, block=problem.block, layout=problem.layout,
                              sparsity=problem.sparsity)
        except ValueError as e:
            out.append(Fit(family, None, str(e)))
            continue
        why = generated(problem, space, limits)
        out.append(Fit(family, space if why is None else None, why))
    if asked:
        return out
    meant = [f for f in out if f.space is not None and _meant_for(f.family, problem.dtype)]
    if not meant:
        return out
    return [f if f in meant or f.space is None else
            Fit(f.family, None, f"searched for {problem.dtype.value} only when asked (--family {f.family})")
            for f in out]


def _meant_for(family: str, dtype) -> bool:
    meant = getattr(families.get(family), "DEFAULT_DTYPES", None)
    return families.takes_dtype(family, dtype) if meant is None else dtype in meant


def chosen(fits: list[Fit]) -> list[Fit]:
    """The families of ``fitting`` that are searched."""
    return [f for f in fits if f.space is not None]


def default_family(problem: Problem, limits: DeviceLimits | None) -> str:
    """The family a command takes when none is named (compile, bench, sweep): the first that the
    problem's search would take, else the first that takes its dtype at all."""
    found = chosen(fitting(problem, limits))
    if found:
        return found[0].family
    return next((f for f in ranked() if families.takes_dtype(f, problem.dtype)), ranked()[-1])
