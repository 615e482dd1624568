"""Run a rendered kernel's launch plan on the CPU: its CUDA source compiled as C++ by g++ against a
small shim, every block's threads run as fibers (ucontext) that switch at each barrier.

A test aid for index arithmetic (which element goes where), not a model of the GPU: copies that
are asynchronous on the device (cp.async) happen at once, and the warp-collective instructions the
tensor-core families use (ldmatrix with and without .trans, mma.sync m16n8k16 bf16/fp16, and
mma.sp m16n8k32 with its metadata) are emulated from the PTX ISA's fragment layouts, each lane depositing its operands and every lane
reading them after a barrier that all threads of the block pass (the kernels' control flow is
uniform, so barrier counts agree); in wmma every lane holds and multiplies its whole tile.
fp32, bf16 and fp16 (the compiler's _Float16) element types; no tf32.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from codegen.data import NAN16, NAN32_HALVES, STORAGE
from codegen.launch import LaunchPlan
from codegen.problem import DType, Problem

__all__ = ["available", "run_plan"]

SHIM = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <type_traits>
#include <vector>
#include <ucontext.h>
using std::min;
using std::max;
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __grid_constant__

struct U3 { unsigned x, y, z; };
static U3 threadIdx, blockIdx, blockDim, gridDim;
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
template <class P> static inline P __ldg(const P* p) { return *p; }
static inline float atomicAdd(float* p, float v) { float o = *p; *p = o + v; return o; }
static inline int atomicAdd(int* p, int v) { int o = *p; *p = o + v; return o; }
static inline int atomicExch(int* p, int v) { int o = *p; *p = v; return o; }
template <class P> static inline P __ldcg(const P* p) { return *p; }
static inline void __threadfence() {}  // blocks run one after another here

struct __half { unsigned short x; };  // fp16 through the compiler's _Float16
struct __half2 { __half x, y; };
typedef __half half;
static inline float __half2float(__half h) { _Float16 f; memcpy(&f, &h.x, 2); return (float)f; }
static inline __half __float2half_rn(float v) { _Float16 f = (_Float16)v; __half h; memcpy(&h.x, &f, 2); return h; }
struct __nv_bfloat16 { unsigned short x; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
static inline float __bfloat162float(__nv_bfloat16 v) { unsigned u = (unsigned)v.x << 16; float f; memcpy(&f, &u, 4); return f; }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    unsigned u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {(unsigned short)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return {(unsigned short)(u >> 16)};
}

// ---- fibers: one per thread of a block, switching at each barrier --------------------------------
struct Fiber { ucontext_t ctx; std::vector<char> stack; bool done = false; unsigned tid = 0; };
static ucontext_t g_sched;
static Fiber* g_cur = nullptr;
static std::function<void()> g_body;
static void __syncthreads() { swapcontext(&g_cur->ctx, &g_sched); }
static void fiber_entry() { g_body(); g_cur->done = true; swapcontext(&g_cur->ctx, &g_sched); }
static unsigned char* g_smem = nullptr;

static void run_grid(U3 grid, unsigned threads, size_t smem, const std::function<void()>& body) {
    std::vector<unsigned char> dyn(smem + 256);
    g_smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(dyn.data()) + 127) & ~(uintptr_t)127);
    gridDim = grid;
    blockDim = {threads, 1, 1};
    g_body = body;
    std::vector<Fiber> fibers(threads);
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            blockIdx = {bx, by, 0};
            memset(g_smem, 0xA5, smem);  // garbage, as on the device
            for (unsigned t = 0; t < threads; ++t) {
                Fiber& f = fibers[t];
                f.stack.resize(1 << 16);
                f.done = false;
                f.tid = t;
                getcontext(&f.ctx);
                f.ctx.uc_stack.ss_sp = f.stack.data();
                f.ctx.uc_stack.ss_size = f.stack.size();
                f.ctx.uc_link = nullptr;
                makecontext(&f.ctx, fiber_entry, 0);
            }
            for (bool running = true; running;) {
                running = false;
                for (auto& f : fibers) {
                    if (f.done) continue;
                    g_cur = &f;
                    threadIdx = {f.tid, 0, 0};
                    swapcontext(&g_sched, &f.ctx);
                    running |= !f.done;
                }
            }
        }
}

// ---- what the kernels do with inline PTX ----------------------------------------------------------
#ifndef EMU_CP_BYTES
#define EMU_CP_BYTES 16
#endif
static inline void cp_async(void* dst, const void* src, int n) { memcpy(dst, src, n); memset((char*)dst + n, 0, EMU_CP_BYTES - n); }
static inline void cp_async4(void* dst, const void* src, int n) { memcpy(dst, src, n); memset((char*)dst + n, 0, 4 - n); }
static inline void cp_async16(void* dst, const void* src, int n) { memcpy(dst, src, n); memset((char*)dst + n, 0, 16 - n); }
static inline void cp_commit() {}
template <int N> static inline void cp_wait() {}

// Warp collectives: each lane deposits, a barrier, each lane reads, a barrier.
static const void* g_addr[1024];
static unsigned g_regs[1024][6];
static float g_acc[1024][4];
static inline unsigned short lm_elem(int lane_src, int col) {  // 16-bit element col of the row lane_src gave
    unsigned short v; memcpy(&v, (const char*)g_addr[lane_src] + 2 * col, 2); return v;
}
template <class P> static void ldmatrix_any(unsigned (&r)[4], const P* p, bool trans) {
    const unsigned t = threadIdx.x, w0 = t & ~31u, lane = t & 31u;
    g_addr[t] = p;
    __syncthreads();
    for (int q = 0; q < 4; ++q) {
        unsigned short lo, hi;
        if (!trans) { lo = lm_elem(w0 + 8 * q + lane / 4, 2 * (lane % 4)); hi = lm_elem(w0 + 8 * q + lane / 4, 2 * (lane % 4) + 1); }
        else { lo = lm_elem(w0 + 8 * q + 2 * (lane % 4), lane / 4); hi = lm_elem(w0 + 8 * q + 2 * (lane % 4) + 1, lane / 4); }
        r[q] = (unsigned)lo | ((unsigned)hi << 16);
    }
    __syncthreads();
}
template <class P> static void ldmatrix_x4(unsigned (&r)[4], const P* p) { ldmatrix_any(r, p, false); }
template <class P> static void ldmatrix_x4_trans(unsigned (&r)[4], const P* p) { ldmatrix_any(r, p, true); }
static inline float half_bits(unsigned short b) {
#if EMU_BF16
    unsigned u = (unsigned)b << 16; float f; memcpy(&f, &u, 4); return f;
#else
    _Float16 f; memcpy(&f, &b, 2); return (float)f;
#endif
}
static inline float reg_half(unsigned r, int h) { return half_bits((unsigned short)(h ? r >> 16 : r & 0xffff)); }
// mma.sync m16n8k16 row.col, fp32 accumulate: A 16x16 (a0..a3), B 16x8 (b0, b1), C 16x8.
static void mma_tile(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const unsigned t = threadIdx.x, w0 = t & ~31u, lane = t & 31u;
    for (int i = 0; i < 4; ++i) g_regs[t][i] = a[i];
    g_regs[t][4] = b0; g_regs[t][5] = b1;
    __syncthreads();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, tt = l % 4;
        const unsigned* R = g_regs[w0 + l];
        for (int h = 0; h < 2; ++h) {
            A[g][2 * tt + h] = reg_half(R[0], h); A[g + 8][2 * tt + h] = reg_half(R[1], h);
            A[g][2 * tt + 8 + h] = reg_half(R[2], h); A[g + 8][2 * tt + 8 + h] = reg_half(R[3], h);
            B[2 * tt + h][g] = reg_half(R[4], h); B[2 * tt + 8 + h][g] = reg_half(R[5], h);
        }
    }
    const int g = lane / 4, tt = lane % 4;
    for (int q = 0; q < 4; ++q) {
        const int row = g + (q / 2) * 8, col = 2 * tt + q % 2;
        float s = c[q];
        for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
        c[q] = s;
    }
    __syncthreads();
}

// mma.sp m16n8k32 row.col, fp32 accumulate, sparsity selector 0 (PTX ISA, sparse mma.m16n8k32 for
// .f16/.bf16): A is 16x32 and 2:4 sparse, given as its kept values (lane (g, t): a[0] row g, kept
// columns 2t, 2t+1; a[1] row g+8; a[2], a[3] the same at kept columns 8+2t) and their positions (lanes
// 4g + h, h = 0, 1: bits 15..0 row g, 31..16 row g+8, columns 16h..16h+15, four bits a group of four,
// first position low); B 32x8 (b[r] rows 8r+2t, +1 of column g). A metadata code that repeats a
// position or lists them out of order (the kernels use ::ordered_metadata) stops the program.
static unsigned g_sp[1024][9];
static void mma_sp_tile(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[4], unsigned e) {
    const unsigned t = threadIdx.x, w0 = t & ~31u, lane = t & 31u;
    for (int i = 0; i < 4; ++i) { g_sp[t][i] = a[i]; g_sp[t][4 + i] = b[i]; }
    g_sp[t][8] = e;
    __syncthreads();
    float A[16][32] = {}, B[32][8];
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, tt = l % 4;
        const unsigned* R = g_sp[w0 + l];
        for (int r = 0; r < 4; ++r)
            for (int h = 0; h < 2; ++h) B[8 * r + 2 * tt + h][g] = reg_half(R[4 + r], h);
        for (int r = 0; r < 4; ++r) {
            const int row = g + (r % 2) * 8, group = tt + (r / 2) * 4;  // kept columns 2*group, 2*group+1
            const unsigned word = g_sp[w0 + 4 * g + group / 4][8];
            const unsigned code = (word >> (16 * (r % 2) + 4 * (group % 4))) & 0xFu;
            const unsigned p0 = code & 3u, p1 = code >> 2;
            if (p0 >= p1) { fprintf(stderr, "mma.sp: metadata code %x of row %d group %d is not ordered\n", code, row, group); exit(7); }
            A[row][4 * group + p0] = reg_half(R[r], 0);
            A[row][4 * group + p1] = reg_half(R[r], 1);
        }
    }
    const int g = lane / 4, tt = lane % 4;
    for (int q = 0; q < 4; ++q) {
        const int row = g + (q / 2) * 8, col = 2 * tt + q % 2;
        float s = c[q];
        for (int k = 0; k < 32; ++k) s += A[row][k] * B[k][col];
        c[q] = s;
    }
    __syncthreads();
}

// wmma: every lane holds its whole 16x16 tile and does the whole product (the results agree, so
// the emulation needs no warp exchange; lane 0 alone stores); fragments keep floats, row-major.
static inline float emu_f(float v) { return v; }
static inline float emu_f(__half v) { return __half2float(v); }
static inline float emu_f(__nv_bfloat16 v) { return __bfloat162float(v); }
namespace nvcuda { namespace wmma {
struct matrix_a {}; struct matrix_b {}; struct accumulator {}; struct row_major {}; struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class U, int M, int N, int K, class E, class L = void> struct fragment {
    static constexpr int num_elements = 256;
    float x[256];
};
template <class U, int M, int N, int K> constexpr int rows_of() { return std::is_same<U, matrix_b>::value ? K : M; }
template <class U, int M, int N, int K> constexpr int cols_of() { return std::is_same<U, matrix_a>::value ? K : N; }
template <class U, int M, int N, int K, class E, class L, class P>
void load_matrix_sync(fragment<U, M, N, K, E, L>& f, const P* p, unsigned ldm) {
    constexpr int R = rows_of<U, M, N, K>(), C = cols_of<U, M, N, K>();
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) f.x[r * C + c] = emu_f(std::is_same<L, row_major>::value ? p[r * ldm + c] : p[c * ldm + r]);
}
template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t l) {
    for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) f.x[r * N + c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}
template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t l) {
    if (threadIdx.x % 32) return;  // lane 0 stores for the warp: a later lane's load (a read-modify-write
                                   // of slice-K) must not see the tile twice
    for (int r = 0; r < M; ++r)
        for (int c = 0; c < N; ++c) (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[r * N + c];
}
template <class F> void fill_fragment(F& f, float v) { for (float& e : f.x) e = v; }
template <int M, int N, int K, class E, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, E, LA>& a,
              const fragment<matrix_b, M, N, K, E, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
    float out[M * N];
    for (int r = 0; r < M; ++r)
        for (int n = 0; n < N; ++n) {
            float s = c.x[r * N + n];
            for (int k = 0; k < K; ++k) s += a.x[r * K + k] * b.x[k * N + n];
            out[r * N + n] = s;
        }
    memcpy(d.x, out, sizeof(out));
}
}}  // namespace nvcuda::wmma
"""

#: C types of the index arrays a plan passes (RP, CI: int32; the 2:4 metadata WE: uint32); others are T.
_C_TYPES = {np.dtype(np.int32).str: "int", np.dtype(np.uint32).str: "unsigned"}
_EXTERN_SMEM = re.compile(r"extern __shared__ __align__\(\d+\) ([\w ]+?) (\w+)\[\];")
_FUNC_START = re.compile(r"^(template <[^>]*>\s*)?__device__ __forceinline__ ")


def available() -> bool:
    return shutil.which("g++") is not None


def _cpu_source(source: str) -> tuple[str, int]:
    """The kernel source with what g++ cannot take removed: toolkit includes and the functions
    spelled in inline PTX (the shim defines them); the cp.async width those used."""
    cp_bytes = 16
    lines, out, i = source.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#include <") or (_FUNC_START.match(line) and "asm" in line):
            i += 1
            continue
        if _FUNC_START.match(line) and line.count("{") > line.count("}"):
            j = i
            while lines[j] != "}":
                j += 1
            body = "\n".join(lines[i:j + 1])
            if "asm" in body:
                m = re.search(r"cp\.async\.\w+\.shared\.global \[%0\], \[%1\], (\d+), %2", body)
                if m and "cp_async(" in line:
                    cp_bytes = int(m.group(1))
                i = j + 1
                continue
        out.append(line)
        i += 1
    text = "\n".join(out)
    text = _EXTERN_SMEM.sub(lambda m: f"{m.group(1)}* {m.group(2)} = reinterpret_cast<{m.group(1)}*>(g_smem);", text)
    text = text.replace("__shared__ ", "static ")
    return text, cp_bytes


def run_plan(source: str, plan: LaunchPlan, problem: Problem, inputs: dict[str, np.ndarray],
             outputs: dict[str, tuple[int, ...]], workdir: Path) -> dict[str, np.ndarray]:
    """Run ``plan`` of ``source`` on ``problem`` with the given input arrays (storage format); every
    output starts as NaN poison (zeroed first where the plan says). Returns the outputs."""
    if problem.dtype is DType.tf32:
        raise ValueError("the CPU emulation takes fp32, bf16 and fp16, not tf32")
    body, cp_bytes = _cpu_source(source)
    dims = {"M": problem.m, "N": problem.n, "K": problem.k}
    arrays = dict(inputs)
    poison = NAN16.get(problem.dtype, NAN32_HALVES)
    for name, shape in outputs.items():
        arrays[name] = np.full(int(np.prod(shape)) * problem.dtype.itemsize // 2, poison, dtype=np.uint16)
    if plan.workspace_bytes:
        arrays["WS"] = np.zeros(plan.workspace_bytes // 4, dtype=np.float32)
    if plan.counters:  # zero before the first launch; the plan must leave them zero (checked below)
        arrays["CT"] = np.zeros(plan.counters, dtype=np.int32)
    workdir.mkdir(parents=True, exist_ok=True)
    names = sorted(arrays)
    main = ["int main() {", "    std::vector<std::vector<unsigned char>> bufs;"]
    for idx, name in enumerate(names):
        a = np.ascontiguousarray(arrays[name])
        (workdir / f"{name}.bin").write_bytes(a.tobytes())
        main += [f"    std::vector<unsigned char> b{idx}({a.nbytes} + 16);",
                 f"    {{ FILE* f = fopen(\"{workdir / name}.bin\", \"rb\"); if (fread(b{idx}.data(), 1, {a.nbytes}, f) != "
                 f"{a.nbytes}) return 3; fclose(f); }}",
                 f"    auto* p_{name} = reinterpret_cast<{_C_TYPES.get(a.dtype.str, 'T')}*>(b{idx}.data());"]
    first = next(iter(outputs))
    if plan.zero_output:
        main.append(f"    memset(p_{first}, 0, {int(np.prod(outputs[first])) * problem.dtype.itemsize});")
    for step in plan.launches:
        args = []
        for a in step.args:
            if a in dims:
                args.append(str(dims[a]))
            elif a in arrays:
                args.append(f"reinterpret_cast<float*>(p_{a})" if a == "WS" else f"p_{a}")
            else:
                args.append("nullptr")
        main.append(f"    run_grid({{{step.grid[0]}, {step.grid[1]}, {step.grid[2]}}}, {step.block[0]}, {step.smem}, "
                    f"[&] {{ {step.symbol}({', '.join(args)}); }});")
    for name in [*outputs, *(["CT"] if plan.counters else [])]:
        idx = names.index(name)
        main.append(f"    {{ FILE* f = fopen(\"{workdir / name}.out\", \"wb\"); fwrite(b{idx}.data(), 1, "
                    f"{arrays[name].nbytes}, f); fclose(f); }}")
    main += ["    return 0;", "}"]
    defines = f"#define EMU_CP_BYTES {cp_bytes}\n#define EMU_BF16 {int(problem.dtype is DType.bf16)}\n"
    cpp = workdir / "kernel.cpp"
    cpp.write_text(defines + SHIM + body + "\n" + "\n".join(main) + "\n")
    exe = workdir / "kernel"
    subprocess.run(["g++", "-std=c++17", "-O1", "-w", "-o", str(exe), str(cpp)], check=True, capture_output=True,
                   text=True, timeout=300)
    subprocess.run([str(exe)], check=True, timeout=300, cwd=workdir)
    if plan.counters and np.fromfile(workdir / "CT.out", dtype=np.int32).any():
        raise AssertionError(f"{plan.launches[0].symbol} left tile counters non-zero")
    return {name: np.fromfile(workdir / f"{name}.out", dtype=STORAGE[problem.dtype]).reshape(shape)
            for name, shape in outputs.items()}
