"""codegen.nn's host cost per call, with the CUDA driver replaced by no-ops (runs on any CPU, no GPU).

    python3 -m benchmarks.probes.nn_overhead [--calls N] [--batches 32 4096] [--dtypes bf16 fp32]

Builds a gemmscape ``Linear`` (4096 -> 4096, with bias) whose three GEMMs are the families' built-in
seeds (codegen.nn.bundle.SeedKernels, as benchmarks/linear_train.py picks them), each set up as
codegen.nn sets up a loaded kernel but with no module behind it; then replaces the driver calls
(cuLaunchKernel, the tensor-map encoder, the current-context check, torch's current stream) and
torch's ``zero_`` by no-ops, and times on CPU tensors, per batch and dtype: codegen.nn's forward GEMM
called alone (``linear_forward``: lookup, output, launch), the layer's forward under no_grad, and a
train step (forward, then ``torch.autograd.grad`` for dX, dW, db). What is left is the Python
path a call takes before and around its launches (the layer, autograd, the lookups, filling the
arguments), plus torch's CPU allocator for the outputs and workspace; the driver's own launch cost
(a few µs per kernel on a GPU) is not in it. Prints µs per call, labelled "CPU path, driver replaced".
"""

from __future__ import annotations

import argparse
import ctypes
import time

FEATURES = 4096


def _patch_driver() -> None:
    """The driver calls codegen.nn makes per call, and torch's zero_, become no-ops (for this process)."""
    import torch

    from codegen import cuda
    from codegen.nn import layer as nn

    cuda.launch = lambda *a: None
    cuda.launch_prepared = lambda *a: None
    cuda.encode_tensor_map = lambda enc, address: (ctypes.c_ubyte * 128)()
    nn._make_current = lambda ctx: None
    nn._current_stream = lambda index: 0
    torch.cuda.current_stream = lambda device=None: type("S", (), {"cuda_stream": 0})()
    torch.Tensor.zero_ = lambda self: self  # on a GPU: one memset launch; on the CPU it would write the buffer


def _loaded(file, problem):
    """A codegen.nn kernel for ``file`` as __init__ leaves it after loading, with no module behind it."""
    import torch

    from codegen import cuda
    from codegen.nn import layer as nn

    k = nn._Compiled.__new__(nn._Compiled)
    k.cuda, k.manifest, k.problem, k.device, k.ctx, k.sms = cuda, file.manifest, problem, torch.device("cpu"), None, 132
    k.functions = [0] * len(file.manifest["kernels"])
    k.workspace, k.zero_first, k.maps = int(file.manifest["workspace_bytes"]), bool(file.manifest["zero_output_first"]), {}
    if hasattr(k, "prepare"):
        k.prepare()
    return k


def layer(batch: int, dtype: str):
    """A gemmscape Linear whose kernels are the built-in seeds, loaded as above; its input and dY."""
    import torch

    from codegen.nn import layer as nn
    from codegen.nn.bundle import SeedKernels
    from codegen.problem import DType, linear_problems

    seeds = SeedKernels()
    td = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    loaded = {}
    for problem in linear_problems(batch, FEATURES, FEATURES, DType(dtype), True).values():
        found = seeds.find(problem, "any")
        if isinstance(found, str):
            raise SystemExit(f"nn_overhead: no built-in seed for {problem.key}: {found}")
        loaded[problem] = _loaded(found, problem)
    kernels = nn.Kernels(seeds)
    kernels._load = lambda problem, device: loaded[problem]
    torch.manual_seed(0)
    lin = nn.Linear(FEATURES, FEATURES, dtype=td, kernels=kernels)
    x = torch.randn(batch, FEATURES, dtype=td, requires_grad=True)
    return lin, x, torch.randn(batch, FEATURES, dtype=td)


def per_call_us(fn, calls: int, repeats: int = 5) -> float:
    """The best of ``repeats`` runs of ``calls`` // ``repeats`` calls, in µs per call (after a warm-up)."""
    for _ in range(max(20, calls // 10)):
        fn()
    n, best = max(1, calls // repeats), float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.probes.nn_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=2000, help="timed calls per case")
    p.add_argument("--batches", type=int, nargs="+", default=[32, 4096])
    p.add_argument("--dtypes", nargs="+", choices=("bf16", "fp32"), default=["bf16", "fp32"])
    args = p.parse_args(argv)

    import torch

    from codegen.nn import layer as nn

    _patch_driver()
    print("CPU path, driver replaced (no-op launches; torch's CPU allocator for outputs and workspace)")
    print(f"{'batch':>6s} {'dtype':5s} {'GEMM call us':>13s} {'forward us':>11s} {'train step us':>14s}")
    for batch in args.batches:
        for dtype in args.dtypes:
            lin, x, dy = layer(batch, dtype)
            params = [x, lin.weight, lin.bias]

            def gemm(lin=lin, x=x):
                with torch.no_grad():
                    nn.linear_forward(lin.kernels, x, lin.weight, lin.bias)

            def forward(lin=lin, x=x):
                with torch.no_grad():
                    lin(x)

            def train(lin=lin, x=x, dy=dy, params=params):
                torch.autograd.grad(lin(x), params, dy)

            one, fwd = per_call_us(gemm, args.calls), per_call_us(forward, args.calls)
            step = per_call_us(train, args.calls // 4 or 1)
            print(f"{batch:6d} {dtype:5s} {one:13.1f} {fwd:11.1f} {step:14.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
