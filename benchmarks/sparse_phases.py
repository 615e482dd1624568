"""The phases benchmarks.sparse_model times, and what they share: building the pruned model and its
dense twin, a decode step on transformers' static KV cache (captured in a CUDA graph where it can be),
a prefill, one pruned layer's train step, the timing of two sides in alternating rounds, and the
checks of ours against the dense twin. Needs torch (and transformers for the model); the GPU where
``device`` is one, else everything runs eagerly on the CPU (every GEMM on torch there).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

__all__ = ["DecodeError", "alternate", "cache_argument", "check", "decode_call", "graphed", "layer_train_call",
           "pruned_pair", "rewind", "static_cache"]

#: The logits of ours against the dense twin's (the same masked W): close elementwise at bf16's rounding
#: (2^-6 relative, and as much of the largest logit absolute), or the ratio is not recorded.
RTOL = 2.0 ** -6


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


# ---- timing ----------------------------------------------------------------------------------------------
def alternate(calls: dict[str, Callable[[], object]], reps: int, rounds: int, cuda: bool) -> dict[str, list[float]]:
    """ms per call of each of ``calls`` (two sides), in ``rounds`` rounds of ``reps // rounds`` calls
    per side, the sides' order reversed every other round (each goes first in half of them, since
    clocks fall under sustained load), each side called once untimed at the start of its turn.
    CUDA events around each call on the GPU, the wall clock on the CPU."""
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
                    fn()
                    end.record()
                    end.synchronize()
                    times[label].append(start.elapsed_time(end))
                else:
                    t0 = time.perf_counter()
                    fn()
                    times[label].append((time.perf_counter() - t0) * 1e3)
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
    """A decode step of ``model``: the forward of one new token per sequence (``batch`` of them) at
    position ``context``, on a static KV cache of ``context + 1`` positions whose first ``context``
    hold a prefill of random tokens (seeded: the same prompt for every model), under no_grad; it
    returns the logits [batch, 1, vocab]. Every call writes the same cache slot, so it can be replayed.
    DecodeError (one line) where the installed transformers does not run it."""
    import torch

    dtype = next(model.parameters()).dtype
    cache = static_cache(model, batch, context + 1, device, dtype)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    prompt = torch.randint(0, vocab, (batch, context), generator=gen).to(device)
    token = torch.randint(0, vocab, (batch, 1), generator=gen).to(device)
    position = torch.full((batch, 1), context, dtype=torch.long, device=device)
    at = torch.tensor([context], dtype=torch.long, device=device)
    named = {cache_argument(model): cache}
    try:
        with torch.no_grad():
            model(input_ids=prompt, cache_position=torch.arange(context, device=device), use_cache=True, **named)
    except Exception as e:  # noqa: BLE001
        raise DecodeError(f"the prefill of the static cache failed: {type(e).__name__}: "
                          f"{(str(e).strip().splitlines() or [''])[0][:200]}") from None

    def step():
        rewind(cache, context)
        with torch.no_grad():
            return model(input_ids=token, cache_position=at, position_ids=position, use_cache=True, **named).logits

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
