"""Searching a family's space: samplers, runner, measurers, sweeps, warm starts."""

from search import samplers

#: The samplers a search can use, in their listing order (``search.samplers`` finds them).
SAMPLERS = samplers.names()
#: The sampler a search uses unless told otherwise: the one that needed the fewest trials on the
#: replay recordings (docs, "Search and samplers").
DEFAULT_SAMPLER = "local"
#: Candidates compiling ahead of the GPU in a real search (codegen search, tune-linear, tune-model):
#: enough that a 16-core host's NVRTC keeps up with the GPU (the measurement is in
#: benchmarks/NOTES.md, "lookahead 12"). run_search's own default (4) stays, for the replays whose
#: recorded search-quality figures were taken with it.
GPU_LOOKAHEAD = 12
