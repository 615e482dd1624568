"""The phases benchmarks.sparse_model times, and what they share: building the pruned model and its
dense twin (and the stand-in without GEMMs), a decode step of the decoder layers on transformers' static
KV cache (captured in a CUDA graph where it can be), a prefill of the decoder layers, one pruned layer's
train step, the timing of the sides in alternating rounds, and the checks of ours against the dense twin. Needs torch (and transformers for the model); the GPU where
``device`` is one, else everything runs eagerly on the CPU (every GEMM on torch there).
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable

__all__ = ["SCOPE", "DecodeError", "alternate", "cache_argument", "check", "decode_call", "decoder", "graphed",
           "kernel_profile", "layer_train_call", "no_gemm_model", "no_gemm_stub", "per_kernel", "prefill_call",
           "pruned_pair", "rewind",
           "static_cache", "stub_linears"]

#: The final hidden states of ours against the dense twin's (the same masked W): close elementwise at
#: bf16's rounding (2^-6 relative, and as much of the largest value absolute), or the ratio is not recorded.
RTOL = 2.0 ** -6
#: What the decode and prefill phases time (``problem["scope"]`` of their records).
SCOPE = "decoder layers (no embedding, no lm_head)"
#: How, in words (the result file's ``scope``).
SCOPE_NOTE = ("decode, prefill: the base model (LlamaModel, model.model) called on token embeddings computed once "
              "outside the timed step (inputs_embeds): rotary embedding, causal mask, the decoder layers "
              "(model.layers) and the final RMSNorm, returning last_hidden_state; the embedding lookup and the "
              "lm_head (vocab x hidden GEMM, the same on both sides) are not timed, and the final hidden states "
              "are what is compared")


class DecodeError(RuntimeError):
    """The installed transformers cannot run the decode step as asked; the message is one line."""


def pruned_pair(dense, density: float, block: int, layers: str, kernels, device):
    """(the dense twin, the pruned model, its pruned layers by name): ``dense`` (a model with weights, on
    the CPU) copied twice; in one copy the ``nn.Linear`` layers ``layers`` matches pruned by block
    magnitude (codegen.nn.pruned.prune_model, on ``kernels``), in the other the same layers' W masked
    to the kept blocks, so both compute the same function; both moved to ``device``, in eval mode."""
    import torch

    from codegen.nn.pruned import prune_model, pruned_layers

    ours = prune_model(copy.deepcopy(dense), density, block, layers, kernels=kernels)
    twin = copy.deepcopy(dense)
    pruned = pruned_layers(ours)
    with torch.no_grad():
        for name, layer in pruned.items():
            twin.get_submodule(name).weight.copy_(layer.dense_weight())
    return twin.to(device).eval(), ours.to(device).eval(), pruned_layers(ours)


def decoder(model):
    """The base model (LlamaModel: the decoder layers and the final norm) of a causal LM (``model.model``)."""
    return getattr(model, "base_model", model)


# ---- the non-GEMM part ------------------------------------------------------------------------------------
@functools.cache
def no_gemm_stub():
    """The class of the stand-in for a linear layer that does no GEMM (``NoGemmLinear(in, out)``): its
    forward returns zeros of the output's shape and of the input's dtype (one memset), and counts its calls."""
    import torch

    class NoGemmLinear(torch.nn.Module):
        """Zeros of ``[..., out_features]`` for an input of ``[..., in_features]``: a linear layer's place
        without its GEMM (``calls``: forwards run, a capture's included)."""

        def __init__(self, in_features: int, out_features: int):
            super().__init__()
            self.in_features, self.out_features, self.calls = in_features, out_features, 0

        def forward(self, x):
            self.calls += 1
            return x.new_zeros(*x.shape[:-1], self.out_features)

        def extra_repr(self) -> str:
            return f"in_features={self.in_features}, out_features={self.out_features}, no GEMM"

    return NoGemmLinear


def stub_linears(root) -> dict[str, object]:
    """Each linear layer under ``root`` (``nn.Linear``, and gemmscape's layers: any leaf module with
    ``in_features`` and ``out_features``) replaced in place by ``no_gemm_stub()``: the stubs by name."""
    import torch

    stub = no_gemm_stub()
    found = [(name, m) for name, m in root.named_modules() if name and not isinstance(m, stub) and (
        isinstance(m, torch.nn.Linear) or (hasattr(m, "in_features") and hasattr(m, "out_features")
                                           and not any(True for _ in m.children())))]
    out = {}
    for name, m in found:
        parent, _, leaf = name.rpartition(".")
        out[name] = stub(m.in_features, m.out_features)
        setattr(root.get_submodule(parent) if parent else root, leaf, out[name])
    return out


def no_gemm_model(dense, device):
    """(the model, its stubs by name): ``dense`` (on the CPU) copied, every linear layer of its decoder
    layers (``model.layers``: q, k, v, o, gate, up, down) replaced by a stand-in without GEMM
    (``stub_linears``), moved to ``device`` in eval mode. The embedding, norms, rotary embedding,
    attention over the cache and activations stay: its decode or prefill step times the non-GEMM work."""
    model = copy.deepcopy(dense)
    layers = decoder(model).layers
    stubs = {f"model.layers.{name}": s for name, s in stub_linears(layers).items()}
    return model.to(device).eval(), stubs


# ---- timing ----------------------------------------------------------------------------------------------
def alternate(calls: dict[str, Callable[[], object]], reps: int, rounds: int, cuda: bool,
              back_to_back: int = 1) -> dict[str, list[float]]:
    """ms per call of each of ``calls`` (two sides, or more), in ``rounds`` rounds of ``reps // rounds``
    samples per side, the sides' order reversed every other round (with two, each goes first in half of
    them, since clocks fall under sustained load; with more, each pair swaps its order every other
    round), each side called once untimed at the start of its turn. A sample is ``back_to_back`` calls
    issued one after another (as a training loop issues its steps: the host queues the next while the
    GPU runs this one), its time divided by their number; with 1, the host's time to the first kernel
    counts in full. CUDA events around each sample on the GPU, the wall clock on the CPU."""
    import torch

    labels = list(calls)
    times: dict[str, list[float]] = {label: [] for label in labels}
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(rounds):
        for label in (labels if r % 2 == 0 else labels[::-1]):
            fn = calls[label]
            fn()
            for _ in range(max(1, reps // rounds)):
                if cuda:
                    start.record()
                    for _ in range(back_to_back):
                        fn()
                    end.record()
                    end.synchronize()
                    times[label].append(start.elapsed_time(end) / back_to_back)
                else:
                    t0 = time.perf_counter()
                    for _ in range(back_to_back):
                        fn()
                    times[label].append((time.perf_counter() - t0) * 1e3 / back_to_back)
    return times


def graphed(fn: Callable[[], object], cuda: bool) -> tuple[Callable[[], object], object, str | None]:
    """(call, output, why not): on the GPU ``fn`` captured in a CUDA graph (warmed up on a side stream
    first, which also compiles our kernels) and the call replays it, its output rewritten by each
    replay; where the capture fails, ``fn`` itself (eager) with the reason in one line; on the CPU
    ``fn`` itself."""
    if not cuda:
        return fn, fn(), "no CUDA graphs on the CPU"
    import torch

    from codegen.nn.step import capture

    try:
        graph, out = capture(fn)
    except Exception as e:  # noqa: BLE001  (what the installed transformers does under capture varies)
        torch.cuda.synchronize()
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return fn, fn(), f"CUDA graph capture failed ({type(e).__name__}: {first}): timed as eager calls"
    graph.replay()
    torch.cuda.synchronize()
    return graph.replay, out, None


# ---- decode: one token on a static KV cache ----------------------------------------------------------------
def static_cache(model, batch: int, length: int, device, dtype):
    """transformers' static KV cache of ``length`` positions for ``batch`` sequences of ``model``. Its
    constructor's arguments changed between releases (4.x: ``max_batch_size``/``batch_size``, device
    and dtype; 5.x: the config and the length, the rest taken at first use): each is tried in turn;
    DecodeError where none fits or the class is missing."""
    try:
        from transformers import StaticCache
    except ImportError as e:
        raise DecodeError(f"this transformers has no StaticCache ({e}); the decode phase needs one") from None
    tries = ({"config": model.config, "max_cache_len": length},
             {"config": model.config, "max_batch_size": batch, "max_cache_len": length, "device": device,
              "dtype": dtype},
             {"config": model.config, "batch_size": batch, "max_cache_len": length, "device": device, "dtype": dtype})
    why = []
    for kwargs in tries:
        try:
            return StaticCache(**kwargs)
        except (TypeError, ValueError) as e:
            why.append(f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
    raise DecodeError("transformers' StaticCache takes none of the argument sets tried (" + "; ".join(why) + ")")


def decode_call(model, batch: int, context: int, vocab: int, device, seed: int) -> Callable[[], object]:
    """A decode step of ``model``'s decoder layers: the base model (``decoder``: the decoder layers and the
    final norm; no embedding, no lm_head) on one new token per sequence (``batch`` of them) at position
    ``context``, given as its embedding (looked up once, outside the step), on a static KV cache of
    ``context + 1`` positions whose first ``context`` hold a prefill of random tokens (seeded: the same
    prompt for every model), under no_grad; it returns the final hidden states [batch, 1, hidden]. Every
    call writes the same cache slot, so it can be replayed. DecodeError (one line) where the installed
    transformers does not run it."""
    import torch

    base = decoder(model)
    dtype = next(model.parameters()).dtype
    cache = static_cache(base, batch, context + 1, device, dtype)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    prompt = torch.randint(0, vocab, (batch, context), generator=gen).to(device)
    token = torch.randint(0, vocab, (batch, 1), generator=gen).to(device)
    position = torch.full((batch, 1), context, dtype=torch.long, device=device)
    at = torch.tensor([context], dtype=torch.long, device=device)
    named = {cache_argument(base): cache}
    try:
        with torch.no_grad():
            embeds = base.get_input_embeddings()(token)
            base(input_ids=prompt, cache_position=torch.arange(context, device=device), use_cache=True, **named)
    except Exception as e:  # noqa: BLE001
        raise DecodeError(f"the prefill of the static cache failed: {type(e).__name__}: "
                          f"{(str(e).strip().splitlines() or [''])[0][:200]}") from None

    def step():
        rewind(cache, context)
        with torch.no_grad():
            return base(inputs_embeds=embeds, cache_position=at, position_ids=position, use_cache=True,
                        **named).last_hidden_state

    return step


def prefill_call(model, tokens: int, vocab: int, device, seed: int) -> Callable[[], object]:
    """A prefill of ``model``'s decoder layers: the base model (``decoder``) on the embeddings (looked up
    once, outside the step) of ``tokens`` random tokens (batch 1, seeded), no cache, under no_grad; it
    returns the final hidden states [1, tokens, hidden]."""
    import torch

    base = decoder(model)
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(seed)).to(device)
    with torch.no_grad():
        embeds = base.get_input_embeddings()(ids)

    def step():
        with torch.no_grad():
            return base(inputs_embeds=embeds, use_cache=False).last_hidden_state

    return step


def cache_argument(model) -> str:
    """The name the model's forward takes its KV cache by: ``cache`` (transformers 5.2x) or
    ``past_key_values`` (before, and deprecated since)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def rewind(cache, position: int) -> None:
    """Set each layer of a static cache back to ``position`` filled slots, so that a step writes the same
    slot every time: transformers 5 keeps the count in the cache layers (``cumulative_length``, a tensor:
    set on the stream, so a captured graph does it on every replay; or an int) and ignores the
    ``cache_position`` given; before, the position given was the slot and there is nothing to do."""
    import torch

    for layer in getattr(cache, "layers", ()) or ():
        for name in ("cumulative_length", "cumulative_length_int"):
            value = getattr(layer, name, None)
            if isinstance(value, torch.Tensor):
                value.fill_(position)
            elif isinstance(value, int) and not isinstance(value, bool):
                setattr(layer, name, position)


# ---- one pruned layer's train step ----------------------------------------------------------------------
def layer_train_call(layer, weight, tokens: int, device, dtype, seed: int) -> tuple[Callable[[], tuple], tuple]:
    """(step, (x, dY)): the forward of ``layer`` on ``tokens`` rows of random input and
    ``torch.autograd.grad`` of it for the input and ``weight`` (its W, or a BlockSparseLinear's blocks);
    the step returns (Y, dX, dW)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(tokens, layer.in_features, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    dy = torch.randn(tokens, layer.out_features, generator=gen).to(device=device, dtype=dtype)

    def step():
        y = layer(x)
        dx, dw = torch.autograd.grad(y, (x, weight), dy)
        return y, dx, dw

    return step, (x, dy)


# ---- where a step's GPU time goes ---------------------------------------------------------------------------
#: Kernels listed per side (the rest are summed under ``others_us``).
PROFILE_TOP = 8


def per_kernel(events, steps: int, top: int = PROFILE_TOP) -> dict:
    """The GPU kernels among profiler averages (``key``, ``device_type``, ``device_time_total`` in µs and
    ``count``; CPU ops, which also carry their kernels' time, are left out): µs and launches per step of
    the ``top`` longest, the rest summed, and the total."""
    rows = sorted(((e.key, e.device_time_total / steps, e.count / steps) for e in events
                   if str(e.device_type).endswith("CUDA") and e.device_time_total > 0), key=lambda r: -r[1])
    return {"kernels": [{"kernel": k, "us_per_step": round(us, 2), "calls_per_step": round(n, 2)}
                        for k, us, n in rows[:top]],
            "others_us": round(sum(us for _, us, _ in rows[top:]), 2),
            "total_us": round(sum(us for _, us, _ in rows), 2)}


def kernel_profile(fn: Callable[[], object], steps: int = 10) -> dict:
    """``fn`` run ``steps`` times (after one untimed call) under torch's profiler: its GPU kernels' time
    per step (``per_kernel``); the launches of gemmscape's kernels through the driver are traced like
    torch's."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    return per_kernel(prof.key_averages(), steps)


# ---- checks ----------------------------------------------------------------------------------------------
def check(reference, got) -> dict:
    """``got`` (ours) against ``reference`` (the dense twin's): max and mean abs difference, relative
    Frobenius error, whether bit-identical, all finite, and close elementwise (``RTOL`` relative, and
    ``RTOL`` of the largest reference value absolute); ``ok`` is finite and close."""
    import torch

    a, b = reference.detach().float(), got.detach().float()
    diff = (a - b).abs()
    scale = float(a.abs().max()) if a.numel() else 0.0
    finite = bool(torch.isfinite(b).all())
    close = finite and bool(torch.allclose(b, a, rtol=RTOL, atol=RTOL * max(scale, 1e-30)))
    return {"max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
            "mean_abs_diff": float(diff.mean()) if diff.numel() else 0.0,
            "rel_error": float((a - b).norm() / a.norm().clamp_min(1e-30)), "max_abs_reference": scale,
            "bit_identical": bool(torch.equal(reference, got)), "finite": finite, "allclose": close,
            "rtol": RTOL, "ok": close}
