"""Quality of sparse pruning, measured: held-out bits per byte of a small byte-level GPT, dense,
pruned by block magnitude or 2:4 by magnitude (one-shot), and fine-tuned under the pattern.

    python3 -m benchmarks.sparse_quality [--out DIR] [--device cuda] [--layers 6] [--width 512] [--heads 8]
        [--context 256] [--batch 64] [--pretrain-tokens 40M] [--finetune-tokens 6M] [--eval-tokens 1M]
        [--patterns block 2:4] [--densities 0.5 0.25 0.1] [--blocks 64 32] [--kernels seeds|none|BUNDLE|URL]
        [--max-seconds S] [--checkpoint FILE] [--no-dense-control]

1. The corpus: Python's standard library sources as bytes, every 20th file held out
   (benchmarks.tiny_gpt.stdlib_corpus; the JSON records the Python version, files, bytes, sha256).
2. A GPT (benchmarks.tiny_gpt.TinyGPT) trained from scratch on the training files for
   ``--pretrain-tokens`` bytes (AdamW, warm-up and cosine decay, bf16 autocast on CUDA, seeded).
3. Its held-out bits per byte: mean next-byte cross-entropy / ln 2 over ``--eval-tokens`` bytes of
   fixed windows (one seed, the same windows for every model).
4. ``--patterns`` chooses the pruned copies (default both): ``block``, for each block x density a
   copy with both MLP ``nn.Linear`` of every block pruned by block magnitude
   (codegen.nn.pruned.prune_model: ``BlockSparseLinear``, only the kept blocks are parameters);
   ``2:4``, one copy with them pruned 2:4 by magnitude, two kept of every four along in_features
   (prune_model with ``pattern="2:4"``, as ``codegen prune --pattern 2:4``: ``Sparse24Linear``, only
   the kept halves are parameters; density 0.5, ``--densities`` and ``--blocks`` do not apply).
   Each copy is measured one-shot; then fine-tuned for ``--finetune-tokens`` (the same budget, the
   same batches, for every copy), the kept values learning and the others zero by construction
   (checked after: the dense W of every pruned layer is zero outside the blocks, or the positions
   of each group of four, kept at pruning, no group of four of a 2:4 W holds more than two
   non-zeros, and the pattern is unchanged), and measured again. Every copy is measured one-shot
   before the first fine-tune, and its kernels are compared with torch on one batch (the logits and
   the kept values' gradients, relative error). The pruned layers run gemmscape's block-sparse or
   sparse24 kernels where ``--kernels`` has them (default: the families' built-in seeds, untuned; on
   the CPU every GEMM runs torch; a 2:4 layer's backward always runs torch), else torch; the records
   count which GEMMs ran ours and which torch (with why), and the wall time of each fine-tune (host
   clock). A record's problem names its pattern: ``"sparsity"`` is ``"block"`` (with ``block`` and
   ``density``), ``"2:4"`` (``block`` null, ``density`` 0.5) or ``"none"`` (the dense control).
5. As a control, the dense model fine-tuned with the same budget (``--no-dense-control`` leaves it out).

One JSON (DESIGN.md's format, suite ``sparse-quality``) goes to ``--out`` (default benchmarks/results/)
as ``sparse-quality-<device>-<UTC date-time>.json``, written after every phase (``complete`` says
whether all ran). ``--max-seconds`` bounds the whole run: a fine-tune that would not fit in what is
left (estimated from the last one) is skipped and recorded so, and one running past the budget
stops and is recorded as cut short. Exit status: 0 when every phase ran in full, 3 when one was skipped
or cut short, 130 when interrupted (SIGINT; the JSON keeps what finished), 2 for a usage error or no
GPU, 1 for an error of ours. ``--checkpoint FILE`` keeps the pretrained model: a second run
of the same settings and seeds loads it instead of pretraining again.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import functools
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The patterns ``--patterns`` takes: block-sparse (every ``--blocks`` x ``--densities``) and 2:4.
PATTERNS = ("block", "2:4")
RESULTS = ROOT / "benchmarks" / "results"
SUITE = "sparse-quality"
MODEL = "tiny-gpt-bytes"
#: The layers pruned: both Linear of every block's MLP.
MLP_LAYERS = r"(^|\.)mlp\.(fc|proj)$"
SEEDS = {"model": 0, "data": 1, "finetune": 2, "eval": 3}
TIMING_NOTE = ("a quality study, not a kernel timing: held-out bits per byte of each model; the seconds "
               "recorded are the host's wall clock around training (synchronized at the end), the first step "
               "apart since it compiles and loads kernels")


def tokens_arg(text: str) -> int:
    """A token count: an integer, optionally with k, M or G (``40M``)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r} (e.g. 40M, 500k, 1000000)")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"a token count must be at least 1, got {text!r}")
    return int(value)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.sparse_quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=RESULTS, help="folder of the results JSON (default benchmarks/results/)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (every GEMM on torch)")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--context", type=int, default=256, help="bytes per window")
    p.add_argument("--batch", type=int, default=64, help="windows per step (also per evaluation batch)")
    p.add_argument("--pretrain-tokens", type=tokens_arg, default=tokens_arg("40M"))
    p.add_argument("--finetune-tokens", type=tokens_arg, default=tokens_arg("6M"), help="per fine-tune, the same for each")
    p.add_argument("--eval-tokens", type=tokens_arg, default=tokens_arg("1M"), help="held-out bytes per measurement")
    p.add_argument("--lr", type=float, default=1.5e-3, help="pretraining's peak learning rate")
    p.add_argument("--finetune-lr", type=float, default=5e-4, help="fine-tuning's peak learning rate")
    p.add_argument("--patterns", nargs="+", choices=PATTERNS, default=list(PATTERNS),
                   help="the pruned copies: block (every block x density), 2:4 (one copy, density 0.5); default both")
    p.add_argument("--densities", type=float, nargs="+", default=[0.5, 0.25, 0.1], help="of the block-sparse copies")
    p.add_argument("--blocks", type=int, nargs="+", default=[64, 32], help="of the block-sparse copies")
    p.add_argument("--holdout-every", type=int, default=20, help="every N-th file of the corpus is held out")
    p.add_argument("--kernels", default="seeds",
                   help="seeds (the families' built-in seeds, default), none (torch), a bundle folder or a store URL")
    p.add_argument("--dense-control", action=argparse.BooleanOptionalAction, default=True,
                   help="also fine-tune the dense model with the same budget (default on)")
    p.add_argument("--max-seconds", type=float, default=None, help="time budget of the whole run (see above)")
    p.add_argument("--checkpoint", type=Path, default=None, help="the pretrained model's file: loaded if it fits, else written")
    for name, value in SEEDS.items():
        p.add_argument(f"--{name}-seed", type=int, default=value)
    return p


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    for name in ("layers", "width", "heads", "context", "batch", "holdout_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.width % args.heads:
        p.error(f"--width ({args.width}) must be a multiple of --heads ({args.heads})")
    if any(not 0 < d <= 1 for d in args.densities):
        p.error("--densities must lie in (0, 1]")
    bad = [b for b in args.blocks if b not in (16, 32, 64) or b > args.width]
    if bad and "block" in args.patterns:
        p.error(f"--blocks must be 16, 32 or 64 and at most --width: {bad}")
    args.patterns = [q for q in PATTERNS if q in args.patterns]  # each once, block first
    return args


def configs(args: argparse.Namespace) -> list[tuple[str, int | None, float]]:
    """The pruned copies ``--patterns`` asks for: (sparsity, block, density) each."""
    out = [("block", b, d) for b in args.blocks for d in args.densities] if "block" in args.patterns else []
    return out + ([("2:4", None, 0.5)] if "2:4" in args.patterns else [])


def describe(sparsity: str, block: int | None, density: float) -> str:
    return {"block": f"block {block} density {density}", "2:4": "2:4"}.get(sparsity, "dense control")


def sparsity_of(prob: dict) -> str:
    """A record's pattern: its ``sparsity``, or for records from before 2:4 rows, "block" or "none"."""
    return prob.get("sparsity") or ("block" if prob.get("block") else "none")


# ---- records ----------------------------------------------------------------------------------------
def problem(args: argparse.Namespace, sparsity: str, block: int | None, density: float, phase: str, dtype: str) -> dict:
    """A record's problem: ``sparsity`` "block" (``block``, ``density``), "2:4" (density 0.5) or "none"."""
    return {"model": MODEL, "layers": args.layers, "width": args.width,
            "pruned": "mlp" if sparsity != "none" else "none", "sparsity": sparsity,
            "block": block, "density": density, "phase": phase, "dtype": dtype}


def record(prob: dict, bpb: float | None, dense_bpb: float, status: str = "ok", **ours) -> dict:
    """One record: ours (bits/byte, status and what else is given), the dense model's bits/byte as the
    baseline, ``ratio.dense`` = dense ÷ ours (above 1: ours predicts better) and the difference."""
    return {"problem": prob, "timing": "quality",
            "ours": {"bits_per_byte": bpb, "status": status, **ours},
            "baselines": {"dense": {"bits_per_byte": dense_bpb}},
            "ratio": {"dense": dense_bpb / bpb if bpb else None},
            "delta_bits_per_byte": bpb - dense_bpb if bpb is not None else None}


def table(doc: dict) -> str:
    """The console table: one line per pattern (block and density, 2:4), one-shot and fine-tuned side by side."""
    dense = doc.get("dense", {}).get("bits_per_byte")
    lines = [f"dense: {dense:.4f} bits/byte" if dense is not None else "dense: not measured",
             f"{'pattern':>7s} {'density':>7s} {'kept':>6s} {'one-shot':>9s} {'fine-tuned':>10s} {'status':>9s} "
             f"{'ft s':>7s} {'ft tok/s':>9s} {'GEMMs ours/torch':>16s}"]
    by = {}
    for r in doc["records"]:
        p = r["problem"]
        by.setdefault((sparsity_of(p), p["block"], p["density"]), {})[p["phase"]] = r
    for (sparsity, block, density), phases in by.items():
        one, ft = phases.get("one-shot"), phases.get("fine-tuned")
        o = (ft or one)["ours"]
        g = o.get("gemms") or {}
        f = o.get("finetune") or {}

        def bpb(r):
            return f"{r['ours']['bits_per_byte']:.4f}" if r and r["ours"]["bits_per_byte"] is not None else "-"
        name = {"block": f"block {block}", "2:4": "2:4"}.get(sparsity, "dense")
        lines.append(f"{name:>7} {density:7.3g} {o.get('kept_density', 1.0):6.3f} {bpb(one):>9s} {bpb(ft):>10s} "
                     f"{(ft or one)['ours']['status']:>9s} {f.get('seconds') or 0:7.1f} "
                     f"{(f.get('tokens_per_s') or 0) / 1e3:8.1f}k {g.get('ours', 0):>7}/{g.get('torch', 0):<8}")
    return "\n".join(lines)


def git_commit() -> dict:
    """The tree's git commit and whether it has changes; ``$GEMMSCAPE_COMMIT`` where git cannot tell."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10)
        if head.returncode == 0:
            return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip()), "from": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    env = os.environ.get("GEMMSCAPE_COMMIT")
    return {"commit": env or None, "dirty": None, "from": "$GEMMSCAPE_COMMIT" if env else "unknown (no git here)"}


# ---- the study ----------------------------------------------------------------------------------------
class Study:
    """One run: its settings, the JSON document as it grows (written after each phase), and the clock."""

    def __init__(self, args: argparse.Namespace, argv: list[str]) -> None:
        import torch

        self.args, self.t0 = args, time.monotonic()
        self.deadline = self.t0 + args.max_seconds if args.max_seconds else None
        self.device = torch.device(args.device)
        cuda = self.device.type == "cuda"
        name = torch.cuda.get_device_name(self.device) if cuda else "cpu"
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
        self.path = args.out / f"{SUITE}-{re.sub(r'[^A-Za-z0-9]+', '_', name)}-{stamp}.json"
        self.dtype = "bf16" if cuda else "fp32"
        from codegen.versions import versions

        extra = {}
        if cuda:
            extra["sm"] = "sm_{}{}".format(*torch.cuda.get_device_capability(self.device))
            try:
                from codegen.compile import nvrtc_version
                from codegen.cuda import _driver_release

                extra.update(nvrtc=nvrtc_version(), driver=_driver_release())
            except Exception as e:  # no NVRTC here: our kernels cannot build, torch runs them (recorded per GEMM)
                extra["nvrtc"] = f"unavailable: {type(e).__name__}"
        self.doc = {"suite": SUITE, "date": stamp, "device": name,
                    "versions": {**versions(), "torch": torch.__version__, "python": platform.python_version(),
                                 "git": git_commit(), **extra},
                    "command": "python3 -m benchmarks.sparse_quality " + " ".join(argv),
                    "timing": {"method": "quality", "note": TIMING_NOTE}, "complete": False, "records": []}

    def left(self) -> float:
        return self.deadline - time.monotonic() if self.deadline else float("inf")

    def write(self) -> None:
        self.args.out.mkdir(parents=True, exist_ok=True)
        part = self.path.with_suffix(".part")
        doc = {**{k: v for k, v in self.doc.items() if k != "records"}, "records": self.doc["records"]}  # records last
        part.write_text(json.dumps(doc, indent=1) + "\n")
        part.replace(self.path)

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f} s] {text}", flush=True)


def kernels_source(args: argparse.Namespace, device):
    """What BlockSparseLinear takes as ``kernels`` for ``--kernels``, and its description."""
    if args.kernels == "none":
        return None, "none: every GEMM on torch"
    if device.type != "cuda":
        return None, f"{args.kernels} asked, but on {device.type} every GEMM runs torch"
    if args.kernels == "seeds":
        import torch

        from codegen.nn.bundle import SeedKernels

        arch = "sm_{}{}".format(*torch.cuda.get_device_capability(device))
        return SeedKernels(arch=arch), f"the families' built-in seeds for {arch} (untuned)"
    return args.kernels, f"{args.kernels} (tuned)"


def pretrained(study: Study, cfg, corpus, steps: int):
    """The dense model: from ``--checkpoint`` when it holds these settings, else trained (and saved there)."""
    import torch

    from benchmarks.tiny_gpt import Schedule, TinyGPT, train

    args = study.args
    schedule = Schedule(lr=args.lr)
    key = {"config": cfg.__dict__, "steps": steps, "batch": args.batch, "schedule": schedule.__dict__,
           "seeds": {"model": args.model_seed, "data": args.data_seed}, "corpus": corpus.info["sha256"],
           "holdout_every": args.holdout_every, "compute": study.dtype}
    key = json.loads(json.dumps(key))
    torch.manual_seed(args.model_seed)
    model = TinyGPT(cfg).to(study.device)
    if args.checkpoint and args.checkpoint.is_file():
        saved = torch.load(args.checkpoint, map_location=study.device, weights_only=True)
        if saved.get("key") == key:
            model.load_state_dict(saved["state"])
            study.say(f"pretrain: loaded from {args.checkpoint} (same settings and seeds)")
            return model, {**saved["stats"], "loaded_from": str(args.checkpoint)}, schedule
        study.say(f"pretrain: {args.checkpoint} holds other settings; training anew")
    study.say(f"pretrain: {steps} steps of {args.batch}x{cfg.context} bytes ({millions(steps * args.batch * cfg.context)} tokens)")
    stats = train(model, corpus.train, steps, args.batch, schedule, args.data_seed, label="pretrain",
                  log_every=max(1, steps // 20))
    if args.checkpoint:
        torch.save({"key": key, "state": model.state_dict(), "stats": stats}, args.checkpoint)
    return model, stats, schedule



def millions(tokens: int) -> str:
    return f"{tokens / 1e6:.1f}M" if tokens >= 100_000 else f"{tokens / 1e3:.1f}k"


class Phases:
    """The study's phases over one corpus, model and set of held-out windows."""

    def __init__(self, study: Study) -> None:
        import torch

        from benchmarks.tiny_gpt import GPTConfig, Schedule, autocast_for, eval_starts, stdlib_corpus
        from codegen.nn.layer import DTYPES

        self.study, args = study, study.args
        self.corpus = stdlib_corpus(args.holdout_every)
        info = self.corpus.info
        study.say(f"corpus: {info['files']} files, {info['bytes'] / 1e6:.1f} MB of Python {info['python']}'s stdlib "
                  f"(train {len(self.corpus.train) / 1e6:.1f} MB, held out {len(self.corpus.heldout) / 1e6:.2f} MB), "
                  f"sha256 {info['sha256'][:16]}")
        self.corpus.train = self.corpus.train.to(study.device)
        self.corpus.heldout = self.corpus.heldout.to(study.device)
        self.cfg = GPTConfig(args.layers, args.width, args.heads, args.context)
        self.rows = args.batch * args.context  # rows of every GEMM: a batch of windows, training or evaluating
        self.pre_steps = max(1, round(args.pretrain_tokens / self.rows))
        self.ft_steps = max(1, round(args.finetune_tokens / self.rows))
        self.source, described = kernels_source(args, study.device)
        self.ft_schedule = Schedule(lr=args.finetune_lr, warmup=0.05)
        self.starts = eval_starts(len(self.corpus.heldout), args.eval_tokens, args.batch, args.context,
                                  args.eval_seed).to(study.device)
        self.autocast = functools.partial(autocast_for, study.device)
        self.dtype = DTYPES[torch.bfloat16 if study.dtype == "bf16" else torch.float32]
        n = len(configs(args))
        study.say(f"plan: pretrain {millions(self.pre_steps * self.rows)} tokens ({self.pre_steps} steps of "
                  f"{args.batch}x{args.context}); {n} pruned copies ({', '.join(args.patterns)}), each measured one-shot and after "
                  f"{millions(self.ft_steps * self.rows)} tokens of fine-tuning ({self.ft_steps} steps)"
                  + (", and the dense control" if args.dense_control else "")
                  + f"; {millions(len(self.starts) * args.context)} held-out bytes per measurement; kernels: {described}"
                  + (f"; budget {args.max_seconds:g} s" if args.max_seconds else ""))
        study.doc.update(corpus=info, kernels=described,
                         patterns=args.patterns, seeds={"model": args.model_seed, "data": args.data_seed, "finetune": args.finetune_seed,
                                "eval": args.eval_seed},
                         tokens={"pretrain": self.pre_steps * self.rows, "finetune_per_config": self.ft_steps * self.rows,
                                 "eval": len(self.starts) * args.context})

    def measure(self, model) -> tuple[float, float]:
        from benchmarks.tiny_gpt import bits_per_byte

        t = time.perf_counter()
        bpb, _ = bits_per_byte(model, self.corpus.heldout, self.starts, self.study.args.batch)
        return bpb, time.perf_counter() - t

    def dense(self):
        """Pretrain (or load) the dense model and measure it."""
        study, doc = self.study, self.study.doc
        model, stats, schedule = pretrained(study, self.cfg, self.corpus, self.pre_steps)
        mlp = sum(p.numel() for n, p in model.named_parameters() if re.search(r"mlp\.(fc|proj)\.", n))
        doc["model"] = {**self.cfg.__dict__, "parameters": sum(p.numel() for p in model.parameters()),
                        "mlp_parameters": mlp, "pruned_layers": MLP_LAYERS,
                        "compute": "bf16 autocast, fp32 weights" if study.dtype == "bf16" else "fp32"}
        doc["training"] = {"pretrain": {"schedule": schedule.__dict__, "batch": study.args.batch, **stats},
                           "finetune": {"schedule": self.ft_schedule.__dict__, "batch": study.args.batch,
                                        "steps": self.ft_steps, "trained": "every parameter; of the pruned layers, "
                                        "the kept blocks (block-sparse) or the kept halves (2:4)"}}
        self.dense_bpb, s = self.measure(model)
        doc["dense"] = {"bits_per_byte": self.dense_bpb, "eval_seconds": s}
        rate = stats.get("tokens_per_s") or float("nan")
        n = len(configs(study.args)) + bool(study.args.dense_control)
        study.say(f"dense: {self.dense_bpb:.4f} bits/byte over {doc['tokens']['eval']} held-out bytes ({s:.1f} s). "
                  f"Pretraining ran {rate / 1e3:.0f}k tokens/s: {n} fine-tunes of {millions(self.ft_steps * self.rows)} "
                  f"tokens would take about {n * self.ft_steps * self.rows / rate:.0f} s at that rate (the sparse layers "
                  f"and loading their kernels change it)")
        study.write()
        return model

    def one_shot(self, model, sparsity: str, block: int | None, density: float):
        """``model``'s MLP layers pruned (a copy) to ``sparsity`` ("block": ``block`` x ``density``; "2:4"),
        measured, and its kernels checked against torch; recorded."""
        from benchmarks.pruned_checks import gemm_report, kept_density, kernel_check, snapshot
        from benchmarks.tiny_gpt import windows
        from codegen.nn import kernels_from
        from codegen.nn.pruned import prune_model

        study = self.study
        kernels = kernels_from(self.source)
        if sparsity == "2:4":  # gemmscape's 2:4 prune (codegen prune --pattern 2:4): Sparse24Linear by magnitude
            pruned = prune_model(copy.deepcopy(model), None, None, MLP_LAYERS, kernels=kernels, pattern="2:4")
        else:
            pruned = prune_model(copy.deepcopy(model), density, block, MLP_LAYERS, kernels=kernels)
        bpb, s = self.measure(pruned)
        gemms = gemm_report(pruned, self.rows, self.dtype, ("forward",))
        check = kernel_check(pruned, *windows(self.corpus.heldout, self.starts[:study.args.batch], self.cfg.context),
                             self.autocast)
        study.doc["records"].append(record(problem(study.args, sparsity, block, density, "one-shot", study.dtype), bpb,
                                           self.dense_bpb, kept_density=kept_density(pruned), eval_seconds=s,
                                           gemms=gemms, check=check))
        study.say(f"one-shot {describe(sparsity, block, density)}: {bpb:.4f} bits/byte ({s:.1f} s; forward GEMMs "
                  f"ours/torch {gemms['ours']}/{gemms['torch']}; ours against torch on one batch: logits rel. error "
                  f"{check['logits_rel_error']:.2g}, kept values' gradients {check['kept_grad_rel_error']:.2g})")
        study.write()
        return pruned, snapshot(pruned)

    def fine_tune(self, model, sparsity: str, block: int | None, density: float, before: dict,
                  estimate: float | None) -> float | None:
        """Fine-tune ``model`` (pruned, or the dense control where ``sparsity`` is "none") with the same budget,
        measure and record it; skipped where ``estimate`` (s) exceeds what the budget has left. Returns
        the estimate for the next one (None: none yet)."""
        from benchmarks.pruned_checks import gemm_report, kept_density, pattern_check
        from benchmarks.tiny_gpt import train

        study, args = self.study, self.study.args
        prob = problem(args, sparsity, block, density, "fine-tuned", study.dtype)
        what, pruned = describe(sparsity, block, density), sparsity != "none"
        if (estimate or 0.0) + 5.0 > study.left():
            why = (f"the time budget (--max-seconds {args.max_seconds:g}) had {study.left():.0f} s left"
                   + (f"; a fine-tune takes about {estimate:.0f} s (the last one's, kernels loaded)" if estimate else ""))
            study.doc["records"].append(record(prob, None, self.dense_bpb, "skipped", reason=why))
            study.say(f"fine-tune {what}: skipped: {why}")
            study.write()
            return estimate
        deadline = study.deadline - 5.0 if study.deadline else None  # leave time to measure and write
        stats = train(model, self.corpus.train, self.ft_steps, args.batch, self.ft_schedule, args.finetune_seed,
                      label=f"fine-tune {what}", log_every=max(1, self.ft_steps // 5), deadline=deadline)
        bpb, s = self.measure(model)
        extra = {"finetune": stats, "eval_seconds": s}
        if pruned:
            extra.update(kept_density=kept_density(model), pattern=pattern_check(model, before),
                         gemms=gemm_report(model, self.rows, self.dtype, ("forward", "grad_input", "grad_weight")))
        study.doc["records"].append(record(prob, bpb, self.dense_bpb, "ok" if stats["completed"] else "cut_short", **extra))
        study.write()
        g = extra.get("gemms", {})
        study.say(f"fine-tuned {what}: {bpb:.4f} bits/byte after {millions(stats['tokens'])} tokens in "
                  f"{stats['seconds']:.1f} s (first step {stats['first_step_seconds']:.1f} s)"
                  + (f", GEMMs ours/torch {g['ours']}/{g['torch']}" if g else ""))
        if pruned and not extra["pattern"]["ok"]:
            raise AssertionError(f"{what}: a pruned weight is no longer zero or the pattern changed in fine-tuning: "
                                 f"{extra['pattern']} (recorded in {study.path})")
        if not stats["completed"]:
            return estimate
        # the next one's estimate: this one's steady steps, two steps more (the first loads kernels), its evaluation
        return stats["seconds"] - stats["first_step_seconds"] + 2 * stats["seconds"] / stats["steps"] + s


def run(study: Study) -> dict:
    """The whole study (see the module); returns the document, also written to ``study.path``."""
    args, doc = study.args, study.doc
    phases = Phases(study)
    model = phases.dense()
    todo = configs(args)
    pruned = {c: phases.one_shot(model, *c) for c in todo}  # first: each has it even if fine-tunes run out of time
    estimate = None
    for c in todo:
        m, before = pruned.pop(c)
        estimate = phases.fine_tune(m, *c, before, estimate)
        del m, before
    if args.dense_control:
        phases.fine_tune(copy.deepcopy(model), "none", None, 1.0, {}, estimate)
    doc["complete"] = all(r["ours"]["status"] == "ok" for r in doc["records"])
    doc["seconds"] = time.monotonic() - study.t0
    study.write()
    return doc


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    try:
        import torch
    except ImportError:
        print("benchmarks.sparse_quality: needs torch (pip install -e \".[torch]\")", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("benchmarks.sparse_quality: no CUDA GPU visible to torch (--device cpu runs on the CPU, every GEMM "
              "on torch)", file=sys.stderr)
        return 2
    study = Study(args, argv)
    try:
        doc = run(study)
    except KeyboardInterrupt:
        study.doc.update(complete=False, stopped="interrupted (SIGINT): what is recorded ran in full",
                         seconds=time.monotonic() - study.t0)
        study.write()
        print(table(study.doc))
        print(f"interrupted; wrote {study.path}")
        return 130
    print(table(doc))
    print(f"wrote {study.path}")
    return 0 if doc["complete"] else 3


if __name__ == "__main__":
    raise SystemExit(main())
