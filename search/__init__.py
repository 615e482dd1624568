"""Searching a family's space: samplers, runner, measurers, sweeps, warm starts."""

#: The samplers a search can use (search.runner.make_sampler builds them).
SAMPLERS = ("local", "cmaes", "tpe", "random", "grid", "gp")
#: The sampler a search uses unless told otherwise: the one that needed the fewest trials on the
#: replay recordings (README, "Search quality").
DEFAULT_SAMPLER = "local"
