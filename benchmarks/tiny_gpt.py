"""A small GPT-style byte-level language model, its corpus, its training loop and its held-out
bits per byte: what ``benchmarks.sparse_quality`` prunes and measures (needs torch).

The corpus is Python's standard library as bytes, available wherever Python is: every ``.py``
file under ``sysconfig.get_paths()["stdlib"]`` (site-packages and dist-packages left out), sorted
by path, concatenated. Every ``holdout_every``-th file of that order is held out, so held-out text
comes from files the model never trained on.

The model: token and position embeddings; pre-LayerNorm blocks, each causal self-attention
(torch's ``scaled_dot_product_attention``) and an MLP of two ``nn.Linear`` (``mlp.fc``: width ->
ratio x width, GELU, ``mlp.proj`` back), without biases; a final LayerNorm and a linear head over
the 256 byte values. Training: AdamW (fused on CUDA; no weight decay on norms), linear warm-up
then cosine decay, gradient clipping, bf16 autocast on CUDA; each batch is random windows of the
training text drawn by a seeded generator.
"""

from __future__ import annotations

import hashlib
import math
import sys
import sysconfig
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Corpus", "GPTConfig", "Schedule", "TinyGPT", "bits_per_byte", "eval_starts", "stdlib_corpus", "train"]

VOCAB = 256
LEFT_OUT = frozenset({"site-packages", "dist-packages", "__pycache__"})


# ---- the corpus -----------------------------------------------------------------------------------
@dataclass
class Corpus:
    """The training and held-out bytes (uint8 tensors) and what they are (``info``, for the record)."""

    train: torch.Tensor
    heldout: torch.Tensor
    info: dict


def stdlib_files(root: Path) -> list[Path]:
    """The ``.py`` files under ``root`` outside site-packages, dist-packages and __pycache__, sorted by path."""
    files = [p for p in root.rglob("*.py") if p.is_file() and not LEFT_OUT & set(p.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def stdlib_corpus(holdout_every: int = 20, root: Path | None = None) -> Corpus:
    """The standard library's sources as bytes, split by file: file i (0-based, sorted by path) is
    held out when ``i % holdout_every == holdout_every - 1``. ``info`` records the Python version,
    the folder, the counts of files and bytes and the sha256 of the whole concatenation and of
    each split."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    whole, parts = hashlib.sha256(), {"train": [], "heldout": []}
    held_names, unreadable = [], []
    for i, path in enumerate(stdlib_files(root)):
        try:
            data = path.read_bytes()
        except OSError:
            unreadable.append(path.relative_to(root).as_posix())
            continue
        whole.update(data)
        held = i % holdout_every == holdout_every - 1
        parts["heldout" if held else "train"].append(data)
        if held:
            held_names.append(path.relative_to(root).as_posix())
    text = {k: b"".join(v) for k, v in parts.items()}
    info = {"source": "the .py files of Python's standard library, sorted by path, concatenated as bytes",
            "python": sys.version.split()[0], "implementation": sys.implementation.name, "stdlib": str(root),
            "files": sum(len(v) for v in parts.values()), "bytes": sum(len(t) for t in text.values()),
            "sha256": whole.hexdigest(), "holdout_every": holdout_every,
            "split": {k: {"files": len(parts[k]), "bytes": len(text[k]), "sha256": hashlib.sha256(text[k]).hexdigest()}
                      for k in parts},
            "heldout_files": held_names, "unreadable_files": unreadable}
    if min(len(t) for t in text.values()) < 4096:
        raise ValueError(f"the standard library under {root} gives too little text ({info['split']})")
    return Corpus(*(torch.frombuffer(bytearray(text[k]), dtype=torch.uint8) for k in ("train", "heldout")), info)


# ---- the model ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPTConfig:
    layers: int = 6
    width: int = 512
    heads: int = 8
    context: int = 256
    mlp_ratio: int = 4
    vocab: int = VOCAB


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width, bias=False)
        self.proj = nn.Linear(cfg.width, cfg.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.width, cfg.mlp_ratio * cfg.width, bias=False)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.width, cfg.width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.width), Attention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.width), MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Byte-level GPT: ``forward(idx [batch, t])`` gives logits [batch, t, 256]."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if cfg.width % cfg.heads:
            raise ValueError(f"the width ({cfg.width}) must be a multiple of the heads ({cfg.heads})")
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Embedding(cfg.context, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        for name, p in self.named_parameters():  # N(0, 0.02); the projections into the residual stream smaller
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


# ---- training and evaluation ----------------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    """AdamW with linear warm-up over ``warmup`` of the steps, then cosine decay to ``min_ratio`` x ``lr``."""

    lr: float
    warmup: float = 0.02
    min_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)

    def lr_at(self, step: int, steps: int) -> float:
        warm = max(1, round(self.warmup * steps))
        if step < warm:
            return self.lr * (step + 1) / warm
        done = (step - warm) / max(1, steps - warm)
        return self.lr * (self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * done)))


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA; fp32 elsewhere."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def windows(data: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-byte targets [len(starts), context] of the windows starting at ``starts``."""
    chunk = data[starts.to(data.device)[:, None] + torch.arange(context + 1, device=data.device)].long()
    return chunk[:, :-1], chunk[:, 1:]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model: nn.Module, data: torch.Tensor, steps: int, batch: int, schedule: Schedule, seed: int, *,
          label: str = "train", log_every: int | None = None, deadline: float | None = None, out=print) -> dict:
    """``steps`` AdamW steps of ``batch`` random windows of ``data`` (on the model's device), drawn by
    a CPU generator seeded with ``seed``. Prints a line every ``log_every`` steps (mean loss, tokens/s,
    time left); stops early past ``deadline`` (time.monotonic()). Returns the steps and tokens run,
    the wall seconds (the first step's apart: it loads kernels), tokens/s after the first step, and
    the mean loss of the first and the last logged stretch."""
    device = next(model.parameters()).device
    context = model.cfg.context
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": schedule.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=schedule.lr, betas=schedule.betas, **({"fused": True} if device.type == "cuda" else {}))
    # every step's windows drawn up front on the CPU (the same on any device), moved once: no copy per step
    starts = torch.randint(0, len(data) - context - 1, (steps, batch),
                           generator=torch.Generator().manual_seed(seed)).to(device)
    log_every = log_every or max(1, steps // 10)
    model.train()
    running, logged, losses = torch.zeros((), device=device), 0, []
    start = time.perf_counter()
    first = None
    done = 0
    for step in range(steps):
        if deadline is not None and step and time.monotonic() > deadline:
            out(f"  {label}: stopped at step {step}/{steps}: past the time budget")
            break
        for g in opt.param_groups:
            g["lr"] = schedule.lr_at(step, steps)
        x, y = windows(data, starts[step], context)
        with autocast_for(device):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, schedule.clip)
        opt.step()
        running += loss.detach()
        logged += 1
        done = step + 1
        if step == 0:
            _sync(device)
            first = time.perf_counter() - start
        if done % log_every == 0 or done == steps:
            mean = float(running) / logged
            losses.append([done, mean])
            running.zero_()
            logged = 0
            elapsed = time.perf_counter() - start
            rate = (done - 1) * batch * context / max(elapsed - first, 1e-9) if done > 1 else float("nan")
            left = (steps - done) * batch * context / rate if done > 1 else float("nan")
            out(f"  {label}: step {done}/{steps}  loss {mean:.4f}  {rate / 1e3:8.1f}k tokens/s  "
                f"{elapsed:6.1f} s  about {left:5.0f} s left", flush=True)
    _sync(device)
    seconds = time.perf_counter() - start
    steady = seconds - (first or 0.0)
    return {"steps": done, "steps_planned": steps, "tokens": done * batch * context,
            "tokens_planned": steps * batch * context, "completed": done == steps, "seconds": seconds,
            "first_step_seconds": first,
            "tokens_per_s": (done - 1) * batch * context / steady if done > 1 and steady > 0 else None,
            "loss_first": losses[0][1] if losses else None, "loss_last": losses[-1][1] if losses else None,
            "losses": losses}


def eval_starts(length: int, tokens: int, batch: int, context: int, seed: int) -> torch.Tensor:
    """Start offsets of the held-out windows: ``tokens`` rounded up to whole batches of ``batch``
    windows of ``context`` bytes, drawn by a generator seeded with ``seed`` (the same windows for
    every model measured)."""
    n = -(-tokens // (batch * context)) * batch
    return torch.randint(0, length - context - 1, (n,), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def bits_per_byte(model: nn.Module, data: torch.Tensor, starts: torch.Tensor, batch: int) -> tuple[float, int]:
    """Mean next-byte cross-entropy over the windows at ``starts`` (every position of each), in bits:
    nats / ln 2. Returns it and the number of bytes predicted."""
    device = next(model.parameters()).device
    context = model.cfg.context
    was = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    for i in range(0, len(starts), batch):
        x, y = windows(data, starts[i:i + batch], context)
        with autocast_for(device):
            logits = model(x)
        total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").double()
    model.train(was)
    count = len(starts) * context
    return float(total) / count / math.log(2), count
