"""Samplers as plug-ins: every module ``search/samplers/<name>.py`` is one sampler of a search.

A sampler module sets ``NAME`` (its file's name) and ``RANK`` (its place in listings such as
``--sampler``'s choices) and defines ``Strategy``, a subclass of ``Strategy`` below that says what
the sampler does in a search: the Optuna sampler it builds, where a proposal that brought nothing
new is replaced, what happens when it converges (restart, hand over, nothing), and, for a sampler
with an order of its own, the next point. A module may also define ``missing()``: why the sampler
cannot run here (a library it needs is absent), or None. The runner (``search.runner``) knows no
sampler by name; adding a sampler is adding one module here.

Sampler modules import nothing heavy at module level (Optuna is imported when a sampler is
built), so listing them costs the command line nothing.
"""

from __future__ import annotations

import functools
from types import ModuleType

__all__ = ["CONVERGED", "Strategy", "get", "make_sampler", "missing", "names", "strategy"]

#: Sampler proposals in a row that bring nothing new (invalid, or a kernel already measured)
#: after which a sampler counts as converged (``Strategy.converged``).
CONVERGED = 16


class Strategy:
    """How a search uses one sampler. ``seed`` seeds it (None: unseeded); ``space`` is the family's
    space (its dimensions are the trials' integer parameters)."""

    def __init__(self, seed: int | None, space) -> None:
        self.seed, self.space = seed, space

    def build(self):
        """The Optuna sampler the study starts with."""
        raise NotImplementedError

    def order(self, sizes: list[int]):
        """An object whose ``next()`` gives the next point (choice indices) the sampler proposes,
        None once it has no more; None here when the study's sampler proposes (the default)."""
        return None

    def replacement(self, pool, key: tuple[int, ...]):
        """What stands in for a proposal (``key``) that brought nothing new, as
        ``search.pool.Pool`` answers: the nearest open point, else a random one."""
        return pool.nearest(key) or pool.any_open()

    def converged(self, study, proposals: int) -> str | None:
        """Called each time ``CONVERGED`` proposals in a row brought nothing new
        (``proposals``: the sampler's proposals so far). May replace ``study.sampler``; returns the
        line the summary shows for what it did, or None when it does nothing."""
        return None


@functools.cache
def _modules() -> dict[str, ModuleType]:
    from codegen.families import plugin_modules

    found = plugin_modules(__path__, __name__, "sampler")
    return dict(sorted(found.items(), key=lambda item: (item[1].RANK, item[0])))


def names() -> tuple[str, ...]:
    """The samplers a search can use, in their listing order."""
    return tuple(_modules())


def get(name: str) -> ModuleType:
    """The module of sampler ``name``."""
    try:
        return _modules()[name]
    except KeyError:
        raise ValueError(f"unknown sampler {name!r}; choose from {', '.join(names())}") from None


def strategy(name: str, seed: int | None, space) -> Strategy:
    """Sampler ``name``'s strategy for a search of ``space``."""
    return get(name).Strategy(seed, space)


def make_sampler(name: str, seed: int | None, space):
    """The Optuna sampler that sampler ``name`` starts a study with (also what a sampler that
    hands over builds for its successor)."""
    return strategy(name, seed, space).build()


def missing(name: str) -> str | None:
    """Why sampler ``name`` cannot run here (None: it can)."""
    check = getattr(get(name), "missing", None)
    return check() if check is not None else None
