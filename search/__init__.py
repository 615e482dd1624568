"""Searching a family's space: samplers, runner, measurers, sweeps, warm starts."""

#: The samplers a search can use (search.runner.make_sampler builds them).
SAMPLERS = ("local", "cmaes", "tpe", "random", "grid", "gp")
#: The sampler a search uses unless told otherwise: the one that needed the fewest trials on the
#: replay recordings (README, "Search quality").
DEFAULT_SAMPLER = "local"
#: Candidates compiling ahead of the GPU in a real search (codegen search, tune-linear, tune-model). On
#: the H200's 16-core host, 1536x2560x1024 fp32, seed 0 (2026-12-04): 4 left 13 s of compile wait in a
#: 200-trial search and 147 s in a 1000-trial one (wall 51 s and 304 s, 5.95x); 12 left 3 s and 2 s
#: (43 s and 176 s, 4.10x), same best kernel. run_search's own default (4) stays, for the replays whose
#: recorded search-quality figures were taken with it.
GPU_LOOKAHEAD = 12
