"""Spec -> CUDA source: ``templates/<family>.cu.j2`` filled with the family's template values.

Every number is computed in Python (the family's ``template_values``); this module adds what all
families share: the element type's CUDA spelling and the kernel name.
"""

from __future__ import annotations

import functools
import hashlib

import jinja2

import templates
from codegen.families import family_of
from codegen.problem import DType
from codegen.spec import KernelSpec

__all__ = ["DTYPE_CUDA", "environment", "render", "source_hash"]

_FLOAT = {"header": "", "ctype": "float", "to_float": "", "from_float": ""}
#: CUDA spelling of each element type by its value: header, C type, conversions to and from float.
#: tf32 is stored and passed as float (it is a tensor-core compute mode, not a storage type).
_SPELLING = {
    "fp32": _FLOAT,
    "tf32": _FLOAT,
    "fp16": {"header": "cuda_fp16.h", "ctype": "__half", "to_float": "__half2float", "from_float": "__float2half_rn"},
    "bf16": {
        "header": "cuda_bf16.h",
        "ctype": "__nv_bfloat16",
        "to_float": "__bfloat162float",
        "from_float": "__float2bfloat16_rn",
    },
}
DTYPE_CUDA = {d: _SPELLING[d.value] for d in DType}


@functools.cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates.DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(spec: KernelSpec, *, check: bool = True) -> str:
    """CUDA source of one variant. Raises ValueError for a spec invalid in itself, unless
    ``check`` is False (tests that plant a kernel the checks would refuse)."""
    if check:
        reasons = spec.check()
        if reasons:
            raise ValueError(f"invalid spec {spec.name}: " + "; ".join(reasons))
    family = family_of(spec)
    values = family.template_values(spec)
    values.update(DTYPE_CUDA[spec.dtype])
    values["name"] = spec.name
    return environment().get_template(f"{family.NAME}.cu.j2").render(**values)


def source_hash(source: str) -> str:
    """The identity of a rendered source: sha256 of its text (what compile, store and export key on)."""
    return hashlib.sha256(source.encode()).hexdigest()
