"""Spec -> CUDA source. Templates get values; every number is computed here."""

from __future__ import annotations

import functools

import jinja2

import templates
from codegen.problem import DType
from codegen.spec import SimtSpec

#: CUDA spelling of each element type: header, C type, conversions to and from float.
DTYPE_CUDA = {
    DType.fp32: {"header": "", "ctype": "float", "to_float": "", "from_float": ""},
    DType.fp16: {
        "header": "cuda_fp16.h",
        "ctype": "__half",
        "to_float": "__half2float",
        "from_float": "__float2half_rn",
    },
    DType.bf16: {
        "header": "cuda_bf16.h",
        "ctype": "__nv_bfloat16",
        "to_float": "__bfloat162float",
        "from_float": "__float2bfloat16_rn",
    },
}
#: Register type for a global load of the given number of bytes (all accepted by __ldg).
LOAD_TYPE = {2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}
#: Register type for a shared-memory fragment read of 1, 2 or 4 floats.
FRAG_TYPE = {1: "float", 2: "float2", 4: "float4"}


@functools.cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates.DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def template_values(spec: SimtSpec) -> dict:
    values = spec.to_dict()
    values.update(DTYPE_CUDA[spec.dtype])
    values.update(
        name=spec.name,
        dtype=spec.dtype.value,
        rm=spec.rm,
        rn=spec.rn,
        lanes_m=spec.lanes_m,
        lanes_n=spec.lanes_n,
        warps_n=spec.warps_n,
        threads=spec.threads,
        a_loads=spec.a_loads,
        w_loads=spec.w_loads,
        vload_t=LOAD_TYPE.get(spec.vec * spec.dtype.itemsize, "unsigned int"),
        frag_m_t=FRAG_TYPE[spec.rm],
        frag_n_t=FRAG_TYPE[spec.rn],
        kv=spec.kv,
        frag_k_t=LOAD_TYPE[spec.kv * spec.dtype.itemsize],
        cp_bytes=spec.vec * spec.dtype.itemsize,
        cp_cache="cg" if spec.vec * spec.dtype.itemsize == 16 else "ca",
    )
    return values


def render(spec: SimtSpec) -> str:
    """CUDA source of one variant. Raises ValueError for a spec invalid in itself."""
    reasons = spec.check()
    if reasons:
        raise ValueError(f"invalid spec {spec.name}: " + "; ".join(reasons))
    return environment().get_template(f"{spec.family}.cu.j2").render(**template_values(spec))
