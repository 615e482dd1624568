"""The sampler registry: one module per sampler, found by name; the loop names none of them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import search
from search import samplers
from search.space import space_for

ROOT = Path(__file__).resolve().parents[2]


def test_every_module_is_a_sampler_in_its_listing_order():
    assert search.SAMPLERS == samplers.names() == ("local", "cmaes", "tpe", "random", "grid", "gp")
    for name in samplers.names():
        module = samplers.get(name)
        assert module.NAME == name
        assert issubclass(module.Strategy, samplers.Strategy)
    assert search.DEFAULT_SAMPLER in samplers.names()


def test_an_unknown_sampler_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown sampler 'nope'; choose from local, cmaes, tpe"):
        samplers.get("nope")


@pytest.mark.parametrize("name", ["local", "cmaes", "tpe", "random", "grid"])
def test_each_sampler_builds_an_optuna_sampler(name):
    import optuna

    space = space_for("simt", "fp32", restricted=True)
    assert isinstance(samplers.make_sampler(name, 0, space), optuna.samplers.BaseSampler)


def test_only_the_gp_sampler_can_be_missing_a_library():
    assert all(samplers.missing(n) is None for n in samplers.names() if n != "gp")


@pytest.mark.parametrize("module", ["runner.py", "pool.py", "summary.py", "liveness.py"])
def test_the_search_loop_names_no_sampler(module):
    """No string in the loop's modules is a sampler's name: what a sampler does is its module's."""
    tree = ast.parse((ROOT / "search" / module).read_text())
    named = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and node.value in samplers.names()}
    assert not named, f"search/{module} names samplers {sorted(named)}"
