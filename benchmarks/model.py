"""A whole model on the GPU: HF transformers' LlamaForCausalLM at LLaMA-3-8B layer sizes, its nn.Linear
layers on cuBLAS against the same model with ``replace_linear(model, bundle)``, in one run.

    python3 -m benchmarks.model --bundle DIR [--phases prefill train] [--layers 2] [--tokens 2048] [--batch 1]
                                [--vocab 32000] [--reps 20] [--rounds 5] [--ours-everywhere] [--tiny] [--out DIR]

The model is built from a config (no weights are downloaded): hidden 4096, MLP 14336, 32 heads, 8 KV
heads, ``--layers`` decoder layers, ``--vocab`` tokens, random init seeded, in bf16. A deep copy gets
gemmscape's layer (codegen.nn.replace_linear with the bundle's kernels: where a kernel's verdict says
cuBLAS won, that GEMM runs torch's op, unless ``--ours-everywhere``). Before timing, both models'
logits on one batch of random tokens are compared (max abs difference, and whether bit-identical).
Each phase is timed as eager calls between CUDA events, the dense model and ours in alternating rounds:
``prefill``, the forward of ``--batch`` x ``--tokens`` tokens under no_grad; ``train``, the LM loss's
forward and backward (gradients dropped between steps). Records (DESIGN.md's format, suite ``model``)
give the median with p20/p80 and range, ``baselines.dense``, ``ratio.dense`` = dense ÷ ours, which GEMMs
ran ours and which torch's op (with why), the fallbacks counted, and the bundle's verdict summary.
Written to ``model-<device>-<UTC date-time>.json`` under benchmarks/results/ or ``--out``.

``llama3_8b_dims`` is the model factory ``codegen tune-model benchmarks/model.py:llama3_8b_dims`` takes;
``llama3_8b_decode_layers`` the decode shapes' (benchmarks/device/model.sh tunes both).
``--tiny`` (a model of the same structure, hidden 64) with ``--device cpu`` runs the whole benchmark
where there is no GPU: every GEMM falls back to torch's op there.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import re
import sys
from pathlib import Path

from codegen.nn.timing import stats

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "llama3-8b-dims"
PHASES = ("prefill", "train")
#: LLaMA-3-8B's layer sizes (transformers.LlamaConfig's names); layers and vocabulary are options.
LLAMA3_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
             "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192}
#: The same structure, small: for --tiny (tests, CPU runs).
TINY = {"hidden_size": 64, "intermediate_size": 224, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 256}
DEFAULTS = {"layers": 2, "vocab": 32000, "tokens": 2048, "batch": 1, "dtype": "bf16", "seed": 0}
TINY_DEFAULTS = {"vocab": 128, "tokens": 32}


def config_dict(layers: int = DEFAULTS["layers"], vocab: int = DEFAULTS["vocab"], tiny: bool = False) -> dict:
    """The LlamaConfig's arguments: LLaMA-3-8B's layer sizes (or ``TINY``), ``layers`` decoder layers,
    ``vocab`` tokens, no biases, untied embeddings, eager-free attention (torch's SDPA)."""
    return {**(TINY if tiny else LLAMA3_8B), "num_hidden_layers": layers, "vocab_size": vocab,
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def build(config: dict, *, seed: int = 0, dtype: str = "bf16", device=None):
    """LlamaForCausalLM from ``config`` (random init, seeded), in ``dtype``, on ``device`` (None: the
    current default device, e.g. meta inside ``torch.device("meta")``). Needs transformers."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**config)
    if device is None:
        model = LlamaForCausalLM(cfg)
    else:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    return model.to(torch_dtype(dtype)).eval()


def llama3_8b_dims():
    """The factory for ``codegen tune-model benchmarks/model.py:llama3_8b_dims``: this benchmark's default
    model (2 decoder layers, vocabulary 32000, bf16), built where torch's default device says (tune-model
    builds it on the meta device: shapes only)."""
    return build(config_dict())


def llama3_8b_decode_layers():
    """The factory for tuning LLaMA-3-8B's decode-time forward GEMMs (``codegen tune-model
    benchmarks/model.py:llama3_8b_decode_layers --batch 1 16 64 --layout forward``): its three linear
    layer shapes that benchmarks.engine times (MLP up/gate, MLP down, the fused QKV projection), bf16,
    no bias. No transformers needed."""
    import torch

    from benchmarks.engine import LAYERS

    return torch.nn.Sequential(*[torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16) for n, k in LAYERS])


# ---- records ------------------------------------------------------------------------------------


def problem(args: argparse.Namespace, phase: str) -> dict:
    """DESIGN.md's problem of a model record."""
    return {"model": MODEL + ("-tiny" if args.tiny else ""), "layers": args.layers, "phase": phase,
            "batch": args.batch, "tokens": args.tokens, "dtype": args.dtype, "density": 1.0}


def record(prob: dict, ours: list[float], dense: list[float], gemms: dict, check: dict, bundle: dict,
           fallbacks: int, timing: str = "eager") -> dict:
    """One record: ours (time stats, which GEMMs ran ours and which torch's op, fallbacks, the logits
    check, the bundle), the dense baseline, and the ratio dense ÷ ours."""
    mine, theirs = stats(ours), stats(dense)
    named = sorted({k for k in gemms.get("ours", {}).values()})
    return {
        "problem": prob,
        "timing": timing,
        "ours": {"kernel": " + ".join(named) if named else None, **mine, "gemms": gemms, "fallbacks": fallbacks,
                 "cublas_won": sum(str(why).startswith("cuBLAS won") for why in gemms.get("torch", {}).values()),
                 "check": check, "bundle": bundle, "status": "ok" if check.get("finite", True) else "wrong_result"},
        "baselines": {"dense": theirs},
        "ratio": {"dense": theirs["median_ms"] / mine["median_ms"] if check.get("finite", True) else None},
    }


def gemm_report(kernels, shapes: dict, phase: str, device) -> dict:
    """Which GEMMs of the model's linear layers (``shapes``: codegen.nn.tune.linear_layers) ran ours
    and which torch's op: {"ours": {problem key: kernel}, "torch": {problem key: reason}}; a prefill
    runs the forward GEMMs, a train step all three."""
    from codegen.problem import Layout

    layouts = (Layout.forward,) if phase == "prefill" else tuple(Layout)
    out: dict = {"ours": {}, "torch": {}}
    for shape in shapes:
        for layout, prob in shape.problems().items():
            if layout not in layouts:
                continue
            used = kernels.used(prob, device)
            if used is None:
                reason = kernels.fallbacks.get((prob.key, str(device)), "not asked")
                out["torch"][prob.key] = reason
            elif used.startswith("torch"):
                out["torch"][prob.key] = used.removeprefix("torch: ")
            else:
                out["ours"][prob.key] = used
    return out


def table(records: list[dict]) -> str:
    lines = [f"{'phase':8s} {'tokens':>6s} {'dense ms':>9s} {'ours ms':>9s} {'ratio':>6s} {'ours':>5s} {'torch':>5s}  check"]
    for r in records:
        p, o = r["problem"], r["ours"]
        check = o["check"]
        same = "bit-identical" if check.get("bit_identical") else f"max |diff| {check.get('max_abs_diff', float('nan')):.3g}"
        ratio = r["ratio"]["dense"]
        lines.append(f"{p['phase']:8s} {p['batch'] * p['tokens']:6d} {r['baselines']['dense']['median_ms']:9.3f} "
                     f"{o['median_ms']:9.3f} {(f'{ratio:.3f}' if ratio else '-'):>6s} {len(o['gemms']['ours']):5d} "
                     f"{len(o['gemms']['torch']):5d}  {same}"
                     + (f"  (control {r['control']['ratio']:.3f})" if "control" in r else ""))
    return "\n".join(lines)


# ---- on the GPU (or the CPU with --tiny) ------------------------------------------------------------
def logits_check(dense, ours, ids) -> dict:
    """Both models' logits on ``ids``: max abs difference, whether bit-identical, and all finite."""
    import torch

    with torch.no_grad():
        a = dense(input_ids=ids, use_cache=False).logits
        b = ours(input_ids=ids, use_cache=False).logits
    diff = (a.float() - b.float()).abs()
    return {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
            "bit_identical": bool(torch.equal(a, b)), "finite": bool(torch.isfinite(b).all()),
            "max_abs_logit": float(a.float().abs().max())}


def step_fn(model, ids, phase: str):
    """One call of ``phase``: the prefill forward (no_grad) or a train step (LM loss, backward)."""
    import torch

    if phase == "prefill":
        def call():
            with torch.no_grad():
                return model(input_ids=ids, use_cache=False).logits
    else:
        def call():
            model.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            return loss
    return call


def measure(dense, ours, ids, phase: str, reps: int, rounds: int) -> tuple[list[float], list[float]]:
    """ms per call of ``phase`` for the dense model and ours, in ``rounds`` alternating rounds (each
    warmed up once first, which also loads our kernels)."""
    import time

    import torch

    calls = {"dense": step_fn(dense, ids, phase), "ours": step_fn(ours, ids, phase)}
    cuda = ids.is_cuda
    for fn in calls.values():
        fn()
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times: dict[str, list[float]] = {"dense": [], "ours": []}
    for r in range(rounds):
        for label in (("dense", "ours") if r % 2 == 0 else ("ours", "dense")):  # each goes first in half the rounds
            for _ in range(max(1, reps // rounds)):
                if cuda:
                    start.record()
                    calls[label]()
                    end.record()
                    end.synchronize()
                    times[label].append(start.elapsed_time(end))
                else:
                    t0 = time.perf_counter()
                    calls[label]()
                    times[label].append((time.perf_counter() - t0) * 1e3)
    if phase == "train":
        for model in (dense, ours):
            model.zero_grad(set_to_none=True)
    return times["ours"], times["dense"]


def bundle_info(args: argparse.Namespace, kernels) -> dict:
    """The bundle's path, its verdict summary, and whether ours ran everywhere."""
    from codegen.nn.bundle import Bundle, verdict_summary

    info: dict = {"path": str(args.bundle) if args.bundle else None, "ours_everywhere": bool(args.ours_everywhere)}
    source = kernels.source
    if isinstance(source, Bundle):
        info["verdicts"] = verdict_summary(source.index)
        info["margin"] = sorted({(e.get("verdict") or {}).get("margin") for e in source.entries} - {None})
    else:
        info["source"] = getattr(source, "location", None)
    return info


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.model", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--bundle", type=Path, help="kernels from this bundle (codegen tune-model --bundle, export --bundle)")
    src.add_argument("--db", help="kernels from this store URL (default: the families' built-in seeds)")
    p.add_argument("--ours-everywhere", action="store_true",
                   help="run our kernel wherever one is found, also where its verdict says cuBLAS won")
    p.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    p.add_argument("--layers", type=int, default=DEFAULTS["layers"], help="decoder layers")
    p.add_argument("--vocab", type=int, default=None, help=f"vocabulary (default {DEFAULTS['vocab']}; --tiny "
                   f"{TINY_DEFAULTS['vocab']})")
    p.add_argument("--tokens", type=int, default=None, help=f"tokens per sequence (default {DEFAULTS['tokens']}; "
                   f"--tiny {TINY_DEFAULTS['tokens']})")
    p.add_argument("--batch", type=int, default=DEFAULTS["batch"], help="sequences per call")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=DEFAULTS["dtype"])
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="seed of the weights and the tokens")
    p.add_argument("--reps", type=int, default=20, help="timed calls per model and phase")
    p.add_argument("--rounds", type=int, default=None,
                   help="alternating rounds the calls are split into (default: as many as --reps, so the two "
                        "sides alternate call by call and a drift of the clocks falls on both alike)")
    p.add_argument("--no-control", dest="control", action="store_false",
                   help="skip the control: the dense model timed against a copy of itself, which shows how far "
                        "the harness alone can tell identical work apart")
    p.add_argument("--tiny", action="store_true", help="a small model of the same structure (hidden 64)")
    p.add_argument("--device", default="cuda", help="where the models run (cpu with --tiny: everything on torch)")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the results JSON")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, with --tiny's defaults for what was not given; a usage error exits 2."""
    p = parser()
    args = p.parse_args(argv)
    for name in ("vocab", "tokens"):
        if getattr(args, name) is None:
            setattr(args, name, TINY_DEFAULTS[name] if args.tiny else DEFAULTS[name])
    for name in ("layers", "vocab", "tokens", "batch", "reps", "rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.device != "cuda" and not args.device.startswith("cuda:") and not args.tiny:
        p.error("--device other than cuda only with --tiny (LLaMA-3-8B's layers on the CPU take minutes per call)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        import transformers
    except ImportError:
        print("benchmarks.model: needs HF transformers (pip install transformers)", file=sys.stderr)
        return 2
    import torch

    from codegen.nn import kernels_from, replace_linear
    from codegen.nn.bundle import SeedKernels
    from codegen.nn.tune import linear_layers
    from codegen.versions import versions

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks.model: no CUDA GPU visible to torch (--tiny --device cpu runs on the CPU)", file=sys.stderr)
        return 2
    if device.type == "cuda" and device.index is None:  # as tensors name it: codegen.nn keys what ran by it
        device = torch.device("cuda", torch.cuda.current_device())
    source = args.bundle or args.db or SeedKernels()
    kernels = kernels_from(source, ours_everywhere=args.ours_everywhere)
    config = config_dict(args.layers, args.vocab, args.tiny)
    dense = build(config, seed=args.seed, dtype=args.dtype, device=device)
    ours = replace_linear(copy.deepcopy(dense), kernels)
    control = copy.deepcopy(dense) if args.control else None
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    ids = torch.randint(0, args.vocab, (args.batch, args.tokens), generator=gen).to(device)
    check = logits_check(dense, ours, ids)
    print(f"logits: max |diff| {check['max_abs_diff']:.3g} (bit-identical: {check['bit_identical']}), "
          f"all finite: {check['finite']}", flush=True)
    shapes = linear_layers(dense, args.batch * args.tokens)
    info = bundle_info(args, kernels)
    extra = {}
    if device.type == "cuda":
        from codegen.compile import nvrtc_version

        name = torch.cuda.get_device_name(device)
        extra = {"sm": "sm_{}{}".format(*torch.cuda.get_device_capability(device)), "nvrtc": nvrtc_version()}
    else:
        name = "cpu"
    records = []
    for phase in args.phases:
        if phase == "train":
            for model in (dense, ours, control):
                if model is not None:
                    model.train()
        rounds = args.rounds or args.reps
        ours_ms, dense_ms = measure(dense, ours, ids, phase, args.reps, rounds)
        gemms = gemm_report(kernels, shapes, phase, device)
        records.append(record(problem(args, phase), ours_ms, dense_ms, gemms, check, info, len(kernels.fallbacks)))
        if args.control:
            copy_ms, again_ms = measure(dense, control, ids, phase, args.reps, rounds)
            records[-1]["control"] = {"ratio": stats(again_ms)["median_ms"] / stats(copy_ms)["median_ms"],
                                      "dense": stats(again_ms), "copy": stats(copy_ms)}
        print(table(records[-1:]).splitlines()[1], flush=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    doc = {"suite": "model", "date": stamp, "device": name,
           "versions": {**versions(), "torch": torch.__version__, "transformers": transformers.__version__,
                        **extra},
           "command": "python3 -m benchmarks.model " + " ".join(argv if argv is not None else sys.argv[1:]),
           "timing": {"method": "eager", "reps": args.reps, "rounds": args.rounds or args.reps,
                      "note": "CUDA events around each call (prefill: forward under no_grad; train: LM loss forward "
                              "and backward), the dense model and ours in alternating rounds, each warmed up once; "
                              "a record's control is the dense model against a deep copy of itself, timed alike"},
           "config": config, "bundle": info, "records": records}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"model-{re.sub(r'[^A-Za-z0-9]+', '_', name)}-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(records))
    print(f"bundle verdicts: {info.get('verdicts', info.get('source'))}; fallbacks {len(kernels.fallbacks)}")
    print(f"wrote {path}")
    return 0 if all(r["ratio"]["dense"] is not None for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
