"""The share of uniformly random points of each family's full space that are valid, and why the rest are not.

    python3 -m benchmarks.valid_share [--draws 20000] [--seed 0]

CPU only (``Spec.check`` with the H200's limits; nothing compiles). The problems are those of the
replay recordings in search/recordings/. Each reason is counted once per point that has it (the
checks stop at the first group of rules that fails, so later rules are counted only for points
that pass the earlier ones). A sampler's first proposals are uniform like these; the valid share of
a whole search is in its summary (``proposals: ... % valid``).
"""

from __future__ import annotations

import argparse
import collections
import random
import re

from codegen.problem import DType, Problem
from codegen.spec import DeviceLimits
from search.space import space_for

PROBLEMS = (("simt", Problem(4096, 4096, 4096, DType.fp32)), ("simt", Problem(32, 4096, 4096, DType.fp32)),
            ("tensorcore", Problem(4096, 4096, 4096, DType.bf16)))


def valid_share(family: str, problem: Problem, draws: int, seed: int = 0) -> tuple[float, collections.Counter]:
    """The valid share of ``draws`` uniform points, and each reason's share (numbers blanked)."""
    space = space_for(family, problem.dtype)
    limits = DeviceLimits.for_arch("sm_90")
    rng = random.Random(seed)
    valid, reasons = 0, collections.Counter()
    for _ in range(draws):
        why = space.spec({k: rng.choice(v) for k, v in space.dims.items()}, problem).check(problem, limits)
        valid += not why
        reasons.update({re.sub(r"\d+(\.\d+)?", "#", w) for w in why})
    return valid / draws, collections.Counter({w: n / draws for w, n in reasons.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=20000, help="uniform points per problem")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for family, problem in PROBLEMS:
        share, reasons = valid_share(family, problem, args.draws, args.seed)
        print(f"{family} {problem.key}: {share:.1%} of {args.draws} uniform points valid "
              f"(space of {space_for(family, problem.dtype).size} points)")
        for why, part in reasons.most_common(6):
            print(f"  {part:6.1%}  {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
