"""Kernel families as plug-ins: every module ``codegen/families/<name>.py`` is one family.

A family module provides ``NAME``, a frozen dataclass ``Spec`` (``family``, ``dtype``, ``bias`` and
its own variant fields; ``name``, ``from_name``, ``to_dict``, ``from_dict``, ``check``, ``threads``,
``smem_bytes``: mixing in ``codegen.spec.SpecData`` gives the dict round trip, and ``from_name``
from the family's ``_NAME`` and ``_MARKS``; ``codegen.spec`` has the rules every ``check``
shares), ``template_values(spec)`` for ``templates/<NAME>.cu.j2``, ``plan(spec, problem)`` and
``grid_rule(spec)``; optionally ``headers(spec)`` (toolkit headers the source includes) and
``compile_target(arch)`` (the -arch NVRTC gets on a device of ``arch``, e.g. sm_90 -> sm_90a for
arch-specific instructions) and ``sampled_defaults(block)`` (the variant fields a command line leaves
unset take for the weight gradient of a block-sparse W, where the family generates it) and
``SPARSITIES`` (the structured sparsities of W it computes, e.g. ("2:4",); without it, none) with
``manifest_sparse(spec, problem)`` (what an export manifest says of that W's operands).
Everything outside the family finds it here and never names its fields.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from types import ModuleType
from typing import Any

from codegen.spec import KernelSpec

__all__ = ["compile_target", "family_of", "get", "names", "plugin_modules", "spec_from_dict", "spec_from_name",
           "takes_dtype", "takes_layouts", "takes_sparse", "takes_sparsity", "variant_fields"]

#: Fields the problem sets (``block``, W's sparse block size with 0 for a dense W, only in families
#: with block-sparse variants; ``layout``, which GEMM of the linear layer, only in families that
#: generate the backward ones); a family's other fields are its variant fields.
COMMON_FIELDS = ("dtype", "bias", "block", "layout")


def plugin_modules(path, package: str, what: str) -> dict[str, ModuleType]:
    """Every module ``<package>.<name>`` under ``path`` (names starting with ``_`` left out), by
    name; each must set ``NAME`` to its file's name. ``what`` names the kind in the error."""
    found: dict[str, ModuleType] = {}
    for info in sorted(pkgutil.iter_modules(path), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        name = getattr(module, "NAME", None)
        if name != info.name:
            raise RuntimeError(f"{what} module {module.__name__} must set NAME = {info.name!r}, not {name!r}")
        found[name] = module
    return found


@functools.cache
def _families() -> dict[str, ModuleType]:
    found = plugin_modules(__path__, __name__, "family")
    for name, module in found.items():
        if getattr(module.Spec, "family", None) != name:
            raise RuntimeError(f"{module.__name__}.Spec.family must be {name!r}")
    return found


def names() -> list[str]:
    """The known family names, sorted."""
    return sorted(_families())


def get(name: str) -> ModuleType:
    """The family module called ``name``."""
    try:
        return _families()[name]
    except KeyError:
        raise ValueError(f"unknown kernel family {name!r}; known families: {', '.join(names())}") from None


def family_of(spec: KernelSpec) -> ModuleType:
    """The module of the family a spec belongs to."""
    return get(spec.family)


def compile_target(spec: KernelSpec, arch: str) -> str:
    """The -arch NVRTC compiles ``spec`` with on a device of ``arch``: ``arch`` itself, unless the
    family needs an arch-specific target (``compile_target``, e.g. sm_90a)."""
    return getattr(family_of(spec), "compile_target", lambda a: a)(arch)


def spec_from_dict(d: dict[str, Any]) -> KernelSpec:
    """A spec from its ``to_dict()`` form, dispatched on ``d["family"]``."""
    if not isinstance(d, dict) or "family" not in d:
        raise ValueError(f"a spec dict names its family (one of {', '.join(names())}); got {d!r}")
    return get(d["family"]).Spec.from_dict(d)


def spec_from_name(name: str) -> KernelSpec:
    """The spec whose generated name is ``name``, whichever family made it."""
    for module in _families().values():
        try:
            return module.Spec.from_name(name)
        except ValueError:
            continue
    raise ValueError(f"{name!r} is not a kernel name of any family ({', '.join(names())})")


def takes_sparse(name: str) -> bool:
    """Whether family ``name`` has block-sparse variants (its Spec has a ``block`` field)."""
    return any(f.name == "block" for f in dataclasses.fields(get(name).Spec))


def takes_sparsity(name: str, sparsity: str) -> bool:
    """Whether family ``name`` computes a W of structured ``sparsity`` ("" : none, a dense or
    block-sparse W): its ``SPARSITIES`` (a family without one takes only "")."""
    return sparsity in getattr(get(name), "SPARSITIES", ("",))


def takes_dtype(name: str, dtype) -> bool:
    """Whether family ``name`` generates kernels of ``dtype`` (its ``DTYPES``; all, without one)."""
    takes = getattr(get(name), "DTYPES", None)
    return takes is None or dtype in takes


def takes_layouts(name: str) -> bool:
    """Whether family ``name`` generates the backward GEMMs (its Spec has a ``layout`` field)."""
    return any(f.name == "layout" for f in dataclasses.fields(get(name).Spec))


def variant_fields(name: str) -> list[dataclasses.Field]:
    """A family's own spec fields (all but those the problem sets), in declaration order."""
    return [f for f in dataclasses.fields(get(name).Spec) if f.name not in COMMON_FIELDS]
