"""A pruned model on the GPU: HF transformers' LlamaForCausalLM at LLaMA-3-8B layer sizes, its MLP pruned
to block-sparse W and run on gemmscape's kernels, against the dense model on cuBLAS, in one run.

    python3 -m benchmarks.sparse_model [--bundle DIR | --db URL | --seeds FAMILY ...] [--ours-everywhere]
        [--phases decode prefill train engine] [--densities 0.25 0.1] [--block 64] [--layers 2]
        [--decode-batches 1 16] [--context 1024] [--tokens 2048] [--engine-batches 1 16 64]
        [--reps 30] [--rounds 6] [--tiny --device cpu] [--write-pruned DIR] [--out DIR]

The model is benchmarks.model's (``config_dict``, ``build``: hidden 4096, MLP 14336, 32 heads, 8 KV
heads, ``--layers`` decoder layers, vocabulary ``--vocab``, random init seeded, bf16), built on the
CPU (so its weights, and the patterns pruned from them, are those ``codegen prune
benchmarks/model.py:llama3_8b_dims --layers mlp`` gets). For each density its ``nn.Linear`` layers
that ``--prune`` matches (default the MLP's gate, up and down projections) are pruned by block
magnitude to ``codegen.nn.sparse.BlockSparseLinear`` (codegen.nn.pruned.prune_model); its dense twin
holds the same W masked to the kept blocks, so both compute the same function and their outputs are
compared before anything is timed. The other layers stay ``nn.Linear`` (cuBLAS) in both.

Decode and prefill time the decoder layers only (``problem["scope"]``: "decoder layers (no embedding,
no lm_head)"): the base model (``model.model``, LlamaModel) called on token embeddings looked up once
outside the timed step (``inputs_embeds``), which runs the rotary embedding, the causal mask, the
decoder layers and the final RMSNorm and returns ``last_hidden_state``; the embedding and the LM head
(a vocab x 4096 GEMM, the same on both sides) are not timed, and the final hidden states are compared
(bf16 rounding, sparse_phases.check). Beside the two models, in the same alternating rounds, the same
step runs on a third copy whose decoder layers' linear layers (q, k, v, o, gate, up, down) are stand-ins
without GEMM (sparse_phases.no_gemm_stub: zeros of the output's shape and dtype): the non-GEMM work
(norms, rope, attention over the cache, activations, residuals), recorded as ``non_gemm`` (median,
p20/p80, range) with ``gemm_share_dense`` = 1 - non_gemm ÷ dense (and ``gemm_share_ours``); it is no
baseline and no ratio is taken to it.

Phases (each a record of DESIGN.md's format; model records ``ratio.dense`` = dense ÷ ours):

- ``decode``: one new token per sequence at each ``--decode-batches`` batch, on transformers' static
  KV cache of ``--context`` positions already filled (HF ``StaticCache``), captured in a CUDA graph
  after warm-up and timed as replays (the cache rewound in the step, so each replay writes the same
  slot); where the installed transformers cannot run it, one line says why (a failed capture is timed
  eagerly and says so). ``non_gemm`` likewise.
- ``prefill``: the forward of ``--tokens`` tokens (batch 1) under no_grad, eager calls; ``non_gemm`` likewise.
  On a GPU a second prefill record times the same three steps captured in CUDA graphs (``"timing": "graph"``,
  as the decode records are, or eager with the reason where a capture fails): the GPU's time without the
  host's launches, which eager HF layers can leave the GPU waiting on.
- ``train``: one pruned layer (``--train-layer``, default layer 0's MLP up projection: 2048x14336x4096 at 2048 tokens) against
  ``nn.Linear`` of the same masked W: forward and ``autograd.grad`` for X and W at ``--tokens`` rows,
  eager calls (each timed alone: the host's time to its first kernel counts), and under ``back_to_back`` the
  same steps issued ``TRAIN_QUEUED`` at a time without waiting, as a training loop issues them (per step);
  Y, dX and dW (at the kept blocks) checked against the dense layer's. On a GPU the record's
  ``kernel_profile`` says where each side's GPU time goes: its kernels' µs per step under torch's profiler
  (benchmarks.sparse_phases.kernel_profile), apart from the timing.
- ``engine``: the sparse GEMMs alone in engine timing (codegen.nn.timing: many BlockSparseLinear
  copies, their kept blocks together past L2, called back to back in one CUDA graph, against
  ``F.linear`` on each copy's dense W), M = ``--engine-batches`` for layer 0's up (14336x4096) and
  down (4096x14336) projections on their pruned patterns; records ``"timing": "engine"``, ``ratio.cublas``.

The two sides alternate which goes first per round (median and p20-p80 of ``--reps`` calls in
``--rounds`` rounds). Kernels come from ``--bundle`` / ``--db`` (tuned on these patterns: ``codegen
tune-model benchmarks/model.py:llama3_8b_dims --pruned FILE``, FILE from ``--write-pruned`` or
``codegen prune``), else the families' built-in seeds (``SeedKernels``; ``--seeds`` orders the
families). Every record says which of the pruned layers' GEMMs ran ours and which torch's op (and
why), with the bundle's verdict of each. Written to ``sparse_model-<device>-<UTC date-time>.json``
under benchmarks/results/ or ``--out``, after each phase. ``--tiny --device cpu`` runs the harness on
the CPU (hidden 64, blocks of 16; every GEMM on torch there, no graphs, no engine phase).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path

from benchmarks.model import RESULTS, config_dict
from benchmarks.sparse_phases import SCOPE, SCOPE_NOTE
from codegen.nn.timing import stats

MODEL = "llama3-8b-dims"
PHASES = ("decode", "prefill", "train", "engine")
DEFAULTS = {"densities": [0.25, 0.1], "block": 64, "layers": 2, "vocab": 32000, "decode_batches": [1, 16],
            "context": 1024, "tokens": 2048, "engine_batches": [1, 16, 64], "train_layer": "model.layers.0.mlp.up_proj"}
TINY_DEFAULTS = {"block": 16, "vocab": 128, "context": 16, "tokens": 32, "engine_batches": [1, 16]}
#: The pruned layers whose GEMMs the engine phase times: layer 0's MLP up (14336x4096) and down (4096x14336).
ENGINE_LAYERS = ("model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj")
#: Train steps per sample of the train record's ``back_to_back`` timing, and what that timed.
TRAIN_QUEUED = 10
QUEUED = (f"{TRAIN_QUEUED} train steps issued one after another between two CUDA events (the host queues each step "
          f"while the GPU runs the one before, as a training loop does), the time divided by {TRAIN_QUEUED}; same "
          f"reps and alternating rounds as the record's eager timing")
#: What a record's ``non_gemm`` timed.
NON_GEMM = ("the same step (same scope, same timing) on the dense model with every linear layer of its decoder "
            "layers (q, k, v, o, gate, up, down) replaced by a stand-in returning zeros of the output's shape "
            "without a GEMM: norms, rope, attention over the cache, activations, residuals")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.sparse_model", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--bundle", type=Path, help="kernels from this bundle (codegen tune-model --pruned ... --bundle)")
    src.add_argument("--db", help="kernels from this store URL")
    src.add_argument("--seeds", nargs="+", metavar="FAMILY",
                     help="without a bundle: the families whose built-in seeds serve each GEMM, first first (default: "
                          "SeedKernels' own order: tensorcore, and hopper first at 256 rows or more on sm_90)")
    p.add_argument("--ours-everywhere", action="store_true",
                   help="run our kernel wherever one is found, also where its verdict says dense cuBLAS won")
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    p.add_argument("--densities", nargs="+", type=float, default=None, help="fractions of W's blocks kept (0.25 0.1)")
    p.add_argument("--block", type=int, choices=(16, 32, 64), default=None, help="block side (64; --tiny 16)")
    p.add_argument("--prune", default="mlp", metavar="REGEX", help="the nn.Linear layers pruned (re.search on their "
                   "qualified names; default mlp: gate, up and down projections)")
    p.add_argument("--layers", type=int, default=DEFAULTS["layers"], help="decoder layers")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary (32000; --tiny 128)")
    p.add_argument("--decode-batches", nargs="+", type=int, default=None, help="sequences per decode step (1 16)")
    p.add_argument("--context", type=int, default=None, help="positions already in the KV cache at decode (1024)")
    p.add_argument("--tokens", type=int, default=None, help="tokens of the prefill and of the train step (2048)")
    p.add_argument("--train-layer", default=DEFAULTS["train_layer"], help="the pruned layer the train phase times")
    p.add_argument("--engine-batches", nargs="+", type=int, default=None, help="rows of the engine phase (1 16 64)")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the tokens")
    p.add_argument("--reps", type=int, default=30, help="timed calls per side and phase (at least 6 rounds' worth)")
    p.add_argument("--rounds", type=int, default=6, help="alternating rounds the calls are split into")
    p.add_argument("--tiny", action="store_true", help="a small model of the same structure (hidden 64)")
    p.add_argument("--device", default="cuda", help="where the models run (cpu with --tiny: everything on torch)")
    p.add_argument("--write-pruned", type=Path, metavar="DIR", default=None,
                   help="also write each density's pruned model (codegen prune's format) to DIR/pruned-d<D>.safetensors, "
                        "for codegen tune-model --pruned")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the results JSON")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with --tiny's defaults for what was not given; a usage error exits 2."""
    p = parser()
    args = p.parse_args(argv)
    for name, value in DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, TINY_DEFAULTS.get(name, value) if args.tiny else value)
    for name in ("layers", "vocab", "context", "tokens", "reps", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("decode_batches", "engine_batches"):
        if min(getattr(args, name)) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not all(0.0 < d <= 1.0 for d in args.densities):
        p.error("--densities lie in (0, 1]")
    if (args.rounds < 6 or args.reps < args.rounds) and not args.tiny:
        p.error("--rounds at least 6, and --reps at least --rounds (a median and p20-p80 of 6 rounds or more)")
    if args.device != "cuda" and not args.device.startswith("cuda:") and not args.tiny:
        p.error("--device other than cuda only with --tiny (LLaMA-3-8B's layers on the CPU take minutes per call)")
    return args


# ---- records -----------------------------------------------------------------------------------------------
def problem(args: argparse.Namespace, phase: str, density: float, batch: int, tokens: int, **extra) -> dict:
    """DESIGN.md's problem of a model record (decode and prefill: with their ``scope``, the decoder layers)."""
    scope = {"scope": SCOPE} if phase in ("decode", "prefill") else {}
    return {"model": MODEL + ("-tiny" if args.tiny else ""), "layers": args.layers, "phase": phase, "batch": batch,
            "tokens": tokens, "dtype": args.dtype, "density": density, "block": args.block, **scope, **extra}


def record(prob: dict, ours: list[float], dense: list[float], timing: str, gemms: dict, checks: dict,
           note: str | None = None, non_gemm: list[float] | None = None) -> dict:
    """A model record: ours and the dense twin (median, p20/p80, range), ratio dense ÷ ours (None where a
    check failed: speed bought with wrong results is not reported), what ran and the checks; with
    ``non_gemm`` (the times of the step without GEMMs), its stats and the GEMM share of each side's step
    (1 - non_gemm ÷ side, medians; ours' None where a check failed), under ``non_gemm``: not a baseline."""
    mine, theirs = stats(ours), stats(dense)
    ok = all(c.get("ok", False) for c in checks.values())
    named = sorted(set(gemms.get("ours", {}).values()))
    out = {"problem": prob, "timing": timing,
           "ours": {"kernel": " + ".join(named) if named else None, **mine, "gemms": gemms, "check": checks,
                    "status": "ok" if ok else "wrong_result", **({"note": note} if note else {})},
           "baselines": {"dense": theirs},
           "ratio": {"dense": theirs["median_ms"] / mine["median_ms"] if ok else None}}
    if non_gemm is not None:
        rest = stats(non_gemm)
        out["non_gemm"] = {**rest, "gemm_share_dense": 1.0 - rest["median_ms"] / theirs["median_ms"],
                           "gemm_share_ours": 1.0 - rest["median_ms"] / mine["median_ms"] if ok else None,
                           "what": NON_GEMM}
    return out


def gemm_report(kernels, layers: dict, phase: str, batch: int, device, dtype: str = "bf16") -> dict:
    """Which GEMMs of the pruned ``layers`` (name -> BlockSparseLinear) ran ours and which torch's op at
    ``batch`` rows in ``phase`` (the forward; a train step also dX and dW), and each one's verdict where
    the kernels come from a bundle or a store (None: it holds none for the GEMM; the built-in seeds have
    no verdicts): {"ours": {key: kernel}, "torch": {key: reason}, "verdicts": {key: verdict}}."""
    from codegen.nn.bundle import Bundle, StoreKernels
    from codegen.problem import Layout

    layouts = tuple(Layout) if phase == "train" else (Layout.forward,)
    source = kernels.source
    name = _device_name(device)
    out: dict = {"ours": {}, "torch": {}, "verdicts": {}}
    for layer in layers.values():
        for layout in layouts:
            prob = layer.problem(layout, batch, dtype)
            used = kernels.used(prob, device)
            if used is None:
                out["torch"][prob.key] = kernels.fallbacks.get((prob.key, str(device)), "not asked")
            elif used.startswith("torch"):
                out["torch"][prob.key] = used.removeprefix("torch: ")
            else:
                out["ours"][prob.key] = used
            if isinstance(source, Bundle):
                entry = source.entry(prob, name)
                out["verdicts"][prob.key] = (entry or {}).get("verdict")
            elif isinstance(source, StoreKernels):
                found = source.find(prob, name)
                verdict = getattr(found, "verdict", None)
                out["verdicts"][prob.key] = verdict.to_dict() if verdict is not None else None
    return out


def _device_name(device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def line(r: dict) -> str:
    """One line of the table for a record."""
    p, o = r["problem"], r["ours"]
    ratio = next(iter(r["ratio"].values()))
    base = next(iter(r["baselines"].values()))
    what = (f"{p['m']}x{p['n']}x{p['k']} engine" if "m" in p else
            f"{p['phase']} {p['batch']}x{p['tokens']}" + (f" {p['layer']}" if p.get("layer") else ""))
    ran = (f"ours {len(o['gemms']['ours'])} torch {len(o['gemms']['torch'])}" if "gemms" in o else o.get("ran", ""))
    rest = r.get("non_gemm")
    tail = (f"  non-GEMM {rest['median_ms'] * 1e3:.1f} us (GEMM share: dense {rest['gemm_share_dense']:.0%}"
            + (f", ours {rest['gemm_share_ours']:.0%})" if rest["gemm_share_ours"] is not None else ")")
            if rest else "")
    return (f"d{p['density']:<5g} {what:42s} ours {o['median_ms'] * 1e3:9.1f} us  dense {base['median_ms'] * 1e3:9.1f}"
            f" us  {'WRONG' if ratio is None else f'{ratio:.2f}x':>6s}  {r['timing']:6s} {ran[:60]}{tail}")


# ---- the run -----------------------------------------------------------------------------------------------
def kernels_of(args: argparse.Namespace):
    from codegen.nn import kernels_from
    from codegen.nn.bundle import SeedKernels

    if args.bundle or args.db:
        return kernels_from(str(args.bundle or args.db), ours_everywhere=args.ours_everywhere)
    seeds = SeedKernels({d: tuple(args.seeds) for d in ("fp16", "bf16")}) if args.seeds else SeedKernels()
    return kernels_from(seeds, ours_everywhere=args.ours_everywhere)


def run_density(args, density: float, dense_cpu, kernels, device, say, save=None, no_gemm=None) -> list[dict]:
    """Every phase asked for at one density: the records (``save`` is given them after each phase).
    ``no_gemm``: the model without GEMMs in its decoder layers (sparse_phases.no_gemm_model; built from
    ``dense_cpu`` where not given, if decode or prefill is asked for)."""
    import torch

    from benchmarks import sparse_phases as ph
    from codegen.nn.pruned import save_pruned

    twin, ours, layers = ph.pruned_pair(dense_cpu, density, args.block, args.prune, kernels, device)
    say(f"density {density:g}: {len(layers)} layers pruned to blocks of {args.block}, patterns "
        + ", ".join(f"{n.removeprefix('model.')} {lay.pattern_hash[:8]}" for n, lay in list(layers.items())[:3])
        + (", ..." if len(layers) > 3 else ""))
    if args.write_pruned:
        args.write_pruned.mkdir(parents=True, exist_ok=True)
        save_pruned(ours, args.write_pruned / f"pruned-d{density:g}.safetensors", {"density": repr(density),
                                                                                    "block": str(args.block)})
    cuda = device.type == "cuda"
    if no_gemm is None and {"decode", "prefill"} & set(args.phases):
        no_gemm = ph.no_gemm_model(dense_cpu, device)[0]
    records = []
    for phase in args.phases:
        if phase == "engine":
            if not cuda:
                say("engine: needs a GPU (engine timing replays CUDA graphs); skipped")
                continue
            records += engine_records(args, density, layers, kernels, say)
            continue
        if phase == "decode":
            for batch in args.decode_batches:
                try:
                    calls = {side: ph.decode_call(model, batch, args.context, args.vocab, device, args.seed)
                             for side, model in (("dense", twin), ("ours", ours), ("no_gemm", no_gemm))}
                except ph.DecodeError as e:
                    say(f"decode at batch {batch}: {e}")
                    break
                records.append(model_record(args, density, "decode", batch, 1, calls, layers, kernels, device, say))
        elif phase == "prefill":
            calls = {side: ph.prefill_call(model, args.tokens, args.vocab, device, args.seed)
                     for side, model in (("dense", twin), ("ours", ours), ("no_gemm", no_gemm))}
            records.append(model_record(args, density, "prefill", 1, args.tokens, calls, layers, kernels, device, say,
                                        graph=False))
            if cuda:  # and the same prefill replayed as one CUDA graph a side: the GPU's time, no host in it
                if save is not None:
                    save(records)  # the eager record is kept whatever the graphs do
                records.append(model_record(args, density, "prefill", 1, args.tokens, calls, layers, kernels, device,
                                            say))
        elif phase == "train":
            records.append(train_record(args, density, twin, layers, kernels, device, say))
        if save is not None:
            save(records)
    del twin, ours
    if cuda:
        torch.cuda.empty_cache()
    return records


def model_record(args, density, phase, batch, tokens, calls, layers, kernels, device, say, graph=True) -> dict:
    """Check ours' final hidden states against the dense twin's, then time both, and ``calls["no_gemm"]``
    (the step without GEMMs) where given, in the same rounds (graph replays where ``graph``)."""
    from benchmarks import sparse_phases as ph

    cuda = device.type == "cuda"
    note = None
    if graph:  # all captured, or (where any capture fails, or on the CPU) all called eagerly
        graphs = {side: ph.graphed(fn, cuda) for side, fn in calls.items()}
        note = next((g[2] for g in graphs.values() if g[2]), None)
        outputs = {side: g[1] for side, g in graphs.items()}
        timed = {side: g[0] for side, g in graphs.items()} if note is None else calls
        timing = "graph" if note is None else "eager"
    else:
        outputs = {side: fn() for side, fn in calls.items()}
        timed, timing = calls, "eager"
    checks = {"hidden": ph.check(outputs["dense"], outputs["ours"])}
    if "no_gemm" in outputs and tuple(outputs["no_gemm"].shape) != tuple(outputs["dense"].shape):
        raise RuntimeError(f"benchmarks.sparse_model: the step without GEMMs gave {tuple(outputs['no_gemm'].shape)}, "
                           f"the dense step {tuple(outputs['dense'].shape)}")
    times = ph.alternate(timed, args.reps, args.rounds, cuda)
    r = record(problem(args, phase, density, batch, tokens), times["ours"], times["dense"], timing,
               gemm_report(kernels, layers, phase, batch * tokens, device, args.dtype), checks, note,
               times.get("no_gemm"))
    say(line(r) + (f"  ({note})" if note else ""))
    return r


def train_record(args, density, twin, layers, kernels, device, say) -> dict:
    """One pruned layer's forward and backward against nn.Linear of the same masked W."""
    from benchmarks import sparse_phases as ph
    from codegen.nn.sparse import dense_to_blocks

    name = args.train_layer
    if name not in layers:
        raise SystemExit(f"benchmarks.sparse_model: --train-layer {name} is not a pruned layer (pruned: "
                         f"{', '.join(list(layers)[:4])}, ...)")
    sparse_layer, dense_layer = layers[name], twin.get_submodule(name)
    sparse_layer.train()
    dtype = sparse_layer.blocks.dtype
    ours, _ = ph.layer_train_call(sparse_layer, sparse_layer.blocks, args.tokens, device, dtype, args.seed)
    dense, _ = ph.layer_train_call(dense_layer, dense_layer.weight, args.tokens, device, dtype, args.seed)
    (y0, dx0, dw0), (y1, dx1, dw1) = dense(), ours()
    kept = dense_to_blocks(dw0, sparse_layer.rows, sparse_layer.cols, sparse_layer.block)
    checks = {"y": ph.check(y0, y1), "dx": ph.check(dx0, dx1), "dw_kept_blocks": ph.check(kept, dw1)}
    cuda = device.type == "cuda"
    times = ph.alternate({"dense": dense, "ours": ours}, args.reps, args.rounds, cuda)
    queued = ph.alternate({"dense": dense, "ours": ours}, args.reps, args.rounds, cuda, back_to_back=TRAIN_QUEUED)
    profiled = {"ours": ph.kernel_profile(ours), "dense": ph.kernel_profile(dense)} if cuda else None
    sparse_layer.eval()
    prob = problem(args, "train", density, 1, args.tokens, layer=name)
    prob["layers"] = 1  # one layer's step, not the model's
    r = record(prob, times["ours"], times["dense"], "eager",
               gemm_report(kernels, {name: sparse_layer}, "train", args.tokens, device, args.dtype), checks)
    mine, theirs = stats(queued["ours"]), stats(queued["dense"])
    r["back_to_back"] = {"steps_per_sample": TRAIN_QUEUED, "what": QUEUED, "ours": mine, "dense": theirs,
                         "ratio_dense": theirs["median_ms"] / mine["median_ms"] if r["ratio"]["dense"] else None}
    say(line(r))
    say(f"  back to back ({TRAIN_QUEUED} steps a sample): ours {mine['median_ms'] * 1e3:.1f} us, dense "
        f"{theirs['median_ms'] * 1e3:.1f} us" + (f", {r['back_to_back']['ratio_dense']:.2f}x" if r["ratio"]["dense"] else ""))
    if profiled:  # where each side's GPU time goes (torch's profiler; not the timing above)
        r["kernel_profile"] = profiled
        for side, got in profiled.items():
            say(f"  {side}: kernels {got['total_us']:.1f} us a step: " + ", ".join(
                f"{k['kernel'][:48]} {k['us_per_step']:.1f}" for k in got["kernels"][:5]))
    return r


def engine_records(args, density, layers, kernels, say) -> list[dict]:
    """The sparse GEMMs alone in engine timing (codegen.nn.timing.engine_timing), as benchmarks.engine records."""
    import torch

    from benchmarks.engine import record as engine_record
    from codegen.nn.timing import engine_timing

    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    out = []
    for name in [n for n in ENGINE_LAYERS if n in layers] or list(layers)[:2]:
        for m in args.engine_batches:
            prob = layers[name].problem("forward", m, args.dtype)
            got = engine_timing(prob, kernels, l2_bytes=l2, reps=max(args.reps, 48), rounds=args.rounds)
            r = engine_record(prob.to_dict(), got.ours, got.torch, got.ran, got.rel_error, got.engine)
            r["problem"]["layer"] = name
            out.append(r)
            say(line(r))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        import transformers
    except ImportError:
        print("benchmarks.sparse_model: needs HF transformers (pip install transformers)", file=sys.stderr)
        return 2
    import torch

    from benchmarks.model import build
    from codegen.versions import versions

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks.sparse_model: no CUDA GPU visible to torch (--tiny --device cpu runs on the CPU)",
              file=sys.stderr)
        return 2
    if device.type == "cuda" and device.index is None:  # as tensors name it: codegen.nn keys what ran by it
        device = torch.device("cuda", torch.cuda.current_device())
    kernels = kernels_of(args)
    config = config_dict(args.layers, args.vocab, args.tiny)
    dense = build(config, seed=args.seed, dtype=args.dtype, device="cpu")  # on the CPU: codegen prune's weights
    name = _device_name(device)
    extra = {}
    if device.type == "cuda":
        from codegen.compile import nvrtc_version

        extra = {"sm": "sm_{}{}".format(*torch.cuda.get_device_capability(device)), "nvrtc": nvrtc_version()}
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    path = args.out / f"sparse_model-{re.sub(r'[^A-Za-z0-9]+', '_', name)}-{stamp}.json"
    doc = {"suite": "sparse_model", "date": stamp, "device": name,
           "versions": {**versions(), "torch": torch.__version__, "transformers": transformers.__version__, **extra},
           "command": "python3 -m benchmarks.sparse_model " + " ".join(argv if argv is not None else sys.argv[1:]),
           "timing": {"rounds": args.rounds, "reps": args.reps,
                      "note": "the dense twin (same masked W on cuBLAS) and ours in alternating rounds, each first "
                              "in half of them (decode, prefill: the step without GEMMs third, before them in "
                              "half of the rounds: the records' non_gemm); decode: CUDA graph replays of one step "
                              "(eager where the record says so); prefill, train: eager calls between CUDA events; "
                              "engine: codegen.nn.timing"},
           "scope": {"decode": SCOPE, "prefill": SCOPE, "how": SCOPE_NOTE, "non_gemm": NON_GEMM},
           "config": config, "pruned": {"layers": args.prune, "block": args.block, "densities": args.densities},
           "kernels": kernels_source(args, kernels), "dense_layers": "nn.Linear (cuBLAS) in both models",
           "records": []}

    done: list[dict] = []

    def save(records: list[dict]) -> None:  # after each phase: nothing measured is lost to a crash
        doc["records"], doc["fallbacks"] = done + records, len(kernels.fallbacks)
        args.out.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(".part")
        part.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        part.replace(path)

    no_gemm = None
    if {"decode", "prefill"} & set(args.phases):
        from benchmarks.sparse_phases import no_gemm_model

        no_gemm = no_gemm_model(dense, device)[0]  # built once: it holds no pruned W
    for density in args.densities:
        done += run_density(args, density, dense, kernels, device, lambda text: print(text, flush=True), save,
                            no_gemm)
    save([])
    print(f"wrote {path}")
    return 0 if all(next(iter(r["ratio"].values())) is not None for r in done) else 1


def kernels_source(args: argparse.Namespace, kernels) -> dict:
    """Where the kernels came from, and a bundle's verdict summary."""
    from codegen.nn.bundle import Bundle, verdict_summary

    info: dict = {"bundle": str(args.bundle) if args.bundle else None, "db": args.db, "seeds": args.seeds,
                  "ours_everywhere": bool(args.ours_everywhere),
                  "location": getattr(kernels.source, "location", None)}
    if isinstance(kernels.source, Bundle):
        info["verdicts"] = verdict_summary(kernels.source.index)
    return info


if __name__ == "__main__":
    raise SystemExit(main())
