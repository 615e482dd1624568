"""Search spaces as plug-ins: every module ``search/spaces/<name>.py`` is the space of family <name>.

A space module provides ``NAME``, ``space(dtype) -> Space``, ``RESTRICTED`` (a narrowing small
enough to sweep), ``to_spec(point, problem)``, ``point_of(spec)`` (its inverse) and ``SEEDS``
(known-good points, may be empty).
"""

from __future__ import annotations

import functools
from types import ModuleType

__all__ = ["get", "names"]


@functools.cache
def _spaces() -> dict[str, ModuleType]:
    from codegen.families import plugin_modules

    return plugin_modules(__path__, __name__, "space")


def names() -> list[str]:
    """Families that have a search space, sorted."""
    return sorted(_spaces())


def get(family: str) -> ModuleType:
    """The space module of ``family``; a family without one cannot be searched."""
    try:
        return _spaces()[family]
    except KeyError:
        from codegen import families

        known = families.names()
        if family in known:
            raise ValueError(f"kernel family {family!r} has no search space (search/spaces/{family}.py); "
                             f"families with one: {', '.join(names()) or 'none'}") from None
        raise ValueError(f"unknown kernel family {family!r}; known families: {', '.join(known)}") from None
