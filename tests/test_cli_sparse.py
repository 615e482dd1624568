"""CPU tier: the command line's block-sparse W (--block, --density, --pattern-seed, --weights).

Each misuse goes through ``codegen.cli.main`` as the command line would and is one line on stderr,
exit code 2, with the database it names byte for byte unchanged and no default store created. A
valid sparse command line builds the problem ``codegen.sparse.problem_for`` gives.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from codegen import cli, sparse
from codegen.cli import errors, options
from codegen.families.simt import Spec as SimtSpec
from codegen.problem import Problem
from tests.test_cli_errors import DEVICE, RECORDING, add_ok, assert_usage, one_line, run

SMALL = ["--m", "64", "--n", "100", "--k", "200"]  # W in 32x32 blocks: 4 x 7
BIG = ["--m", "4096", "--n", "4096", "--k", "4096"]




@pytest.fixture
def weights(tmp_path) -> Path:
    """A 96x64 W whose 32x32 blocks (3 x 2) are non-zero in (0,0), (1,1), (2,1)."""
    w = np.zeros((96, 64), dtype=np.float32)
    w[0, 0], w[40, 40], w[95, 63] = 1.0, -2.0, 3.0
    np.save(tmp_path / "w.npy", w)
    return tmp_path / "w.npy"


def parse(argv: list[str]):
    return cli.build_parser(cli.family_asked(argv)).parse_args(argv)


def command_line(command: str, tmp_path: Path) -> list[str]:
    """A command that takes a problem, with what it needs besides the problem."""
    return {"compile": ["compile", "--arch", "sm_90"], "bench": ["bench"],
            "search": ["search", "--budget", "3", "--replay", str(RECORDING)],
            "sweep": ["sweep", "--out", str(tmp_path / "rec.json")],
            "export": ["export", "--best", "--out", str(tmp_path / "out")]}[command]


COMMANDS = ["compile", "bench", "search", "sweep", "export"]


# ---- the rules, each a one-line usage error with nothing written -----------------------------------
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flags,needle", [
    (["--density", "0.1"], "--density needs --block 16, 32 or 64"),
    (["--pattern-seed", "3"], "--pattern-seed needs --block 16, 32 or 64"),
    (["--weights", "W.npy"], "--weights needs --block 16, 32 or 64"),
    (["--density", "0.1", "--pattern-seed", "3"], "--density, --pattern-seed need --block"),
    (["--block", "32"], "--block 32 needs --density D (a random pattern with that fraction of blocks kept) or "
                        "--weights FILE"),
    (["--block", "32", "--weights", "W.npy", "--pattern-seed", "1"],
     "--pattern-seed seeds a random pattern, --weights takes the pattern of your W: give one of them, not both"),
])
def test_sparse_options_that_do_not_go_together(command, flags, needle, capsys, tmp_path, db, default_store):
    url, path = db
    extra = ["--db", url] if command != "compile" else []
    line = assert_usage([*command_line(command, tmp_path), *SMALL, *flags, *extra], capsys, needle, db_path=path,
                        default=default_store)
    assert line.startswith(f"codegen {command}: ")
    assert not (tmp_path / "rec.json").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("density", ["1.5", "-0.1", "nan", "lots"])
def test_a_density_outside_0_1(command, density, capsys, tmp_path, db, default_store):
    url, path = db
    extra = ["--db", url] if command != "compile" else []
    line = assert_usage([*command_line(command, tmp_path), *SMALL, "--block", "32", "--density", density, *extra],
                        capsys, "argument --density", density, db_path=path, default=default_store)
    assert ("must lie in [0, 1]" in line) != (density == "lots")


@pytest.mark.parametrize("flags,needle", [
    (["--block", "8", "--density", "0.5"], "argument --block: invalid choice: 8 (choose from 16, 32, 64)"),
    (["--block", "32", "--density", "0.5", "--pattern-seed", "-1"], "argument --pattern-seed: must be at least 0"),
    (["--block", "32", "--density", "0.5", "--pattern-seed", "x"], "argument --pattern-seed: 'x' is not a whole"),
])
def test_bad_values_of_block_and_pattern_seed(flags, needle, capsys, db, default_store):
    url, path = db
    assert_usage(["search", *SMALL, *flags, "--db", url], capsys, needle, db_path=path, default=default_store)


def _bad_weights(tmp_path: Path, kind: str) -> tuple[str, str]:
    if kind == "missing":
        return str(tmp_path / "nope.npy"), "--weights: no weights file"
    if kind == "extension":
        (tmp_path / "w.txt").write_text("1 2 3\n")
        return str(tmp_path / "w.txt"), "weights are .npy, .npz, .pt, .pth or .safetensors files"
    if kind == "not-2d":
        np.save(tmp_path / "v.npy", np.ones(10, np.float32))
        return str(tmp_path / "v.npy"), "is 1-D (shape 10); W of a linear layer is 2-D [N, K]"
    if kind == "corrupt":
        (tmp_path / "c.safetensors").write_bytes(b"\xff" * 12)
        return str(tmp_path / "c.safetensors"), "is not a safetensors file"
    np.savez(tmp_path / "m.npz", **{"a.weight": np.ones((8, 8)), "b.weight": np.ones((8, 8))})
    if kind == "unknown-name":
        return f"{tmp_path / 'm.npz'}:c.weight", "has no tensor 'c.weight'; its 2-D tensors: a.weight, b.weight"
    if kind == "several":
        return str(tmp_path / "m.npz"), "holds 2 2-D tensors, pick one with"
    (tmp_path / "w.pt").write_bytes(b"not a torch file at all")
    return str(tmp_path / "w.pt"), "is not a torch file"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", ["missing", "extension", "not-2d", "corrupt", "unknown-name", "several", "pt"])
def test_weights_that_cannot_be_used(command, kind, capsys, tmp_path, db, default_store):
    url, path = db
    spec, needle = _bad_weights(tmp_path, kind)
    extra = ["--db", url] if command != "compile" else []
    line = assert_usage([*command_line(command, tmp_path), "--m", "64", "--block", "32", "--weights", spec, *extra],
                        capsys, needle, db_path=path, default=default_store)
    assert line.startswith(f"codegen {command}: --weights") and "Traceback" not in line


@pytest.mark.parametrize("dims,needle", [
    (["--n", "95"], "--n 95 does not match W in"),
    (["--k", "65"], "--k 65 does not match W in"),
    (["--n", "64", "--k", "96"], "--n 64 and --k 96 do not match W in"),
])
def test_n_and_k_must_match_the_weights(dims, needle, capsys, weights, db, default_store):
    url, path = db
    line = assert_usage(["search", "--m", "64", *dims, "--block", "32", "--weights", str(weights), "--db", url],
                        capsys, needle, "which is 96x64 (N x K)", db_path=path, default=default_store)
    assert str(weights) in line


def test_a_problem_must_be_whole(capsys, weights, default_store):
    assert_usage(["compile", "--block", "32", "--weights", str(weights)], capsys,
                 "a problem with --weights needs --m (--n and --k come from the file)", default=default_store)
    assert_usage(["compile", "--block", "32", "--density", "0.5"], capsys,
                 "--block, --density describe the W of a problem: give --m, --n, --k too", default=default_store)
    assert_usage(["compile", "--m", "64", "--n", "100", "--block", "32", "--density", "0.5"], capsys,
                 "a problem needs all of --m, --n, --k: --m, --n given, --k missing", default=default_store)
    assert_usage(["search", "--m", "64", "--block", "32", "--density", "0.5"], capsys,
                 "a problem needs all of --m, --n, --k: --m given, --n, --k missing", default=default_store)
    assert_usage(["search", "--m", "64"], capsys, "--n, --k missing", default=default_store)
    code, _, err = run(["search", "--n", "64", "--k", "64"], capsys)  # --m stays required by argparse
    assert code == 2 and "the following arguments are required: --m" in one_line(err)


def test_debug_shows_the_traceback_of_a_sparse_mistake(tmp_path):
    with pytest.raises(errors.UsageError, match="--density needs --block"):
        cli.main(["--debug", "compile", *SMALL, "--density", "0.5"])
    with pytest.raises(errors.UsageError, match="no weights file"):
        cli.main(["compile", "--m", "8", "--block", "16", "--weights", str(tmp_path / "x.npy"), "--debug"])


# ---- valid command lines build the sparse problem ----------------------------------------------------
def test_the_problem_of_the_options():
    dense = options.problem_from_args(parse(["search", *SMALL, "--dtype", "bf16", "--bias"]))
    assert dense == Problem(64, 100, 200, "bf16", bias=True) and "_bsr" not in dense.key  # as before
    problem = options.problem_from_args(parse(["search", *SMALL, "--block", "32", "--density", "0.25",
                                           "--pattern-seed", "7", "--dtype", "bf16", "--bias"]))
    pattern = sparse.Pattern.random(100, 200, 32, 0.25, seed=7)
    assert problem == sparse.problem_for(64, pattern, "bf16", bias=True)
    assert (problem.block, problem.density, problem.pattern, pattern.nnzb) == (32, 0.25, pattern.hash, 7)
    assert problem.key == f"64x100x200_bf16_forward_bias_bsr32_d0.25_{pattern.hash[:8]}"
    assert sparse.lookup(problem).hash == pattern.hash  # registered in this process
    seed0 = options.problem_from_args(parse(["search", *SMALL, "--block", "32", "--density", "0.25"]))
    assert seed0.pattern == sparse.Pattern.random(100, 200, 32, 0.25, seed=0).hash != problem.pattern
    empty = options.problem_from_args(parse(["search", *SMALL, "--block", "16", "--density", "0"]))
    assert empty.density == 0.0 and sparse.lookup(empty).nnzb == 0  # an all-zero W is a problem too


def test_the_problem_of_a_weights_file(tmp_path, weights):
    w = np.load(weights)
    problem = options.problem_from_args(parse(["search", "--m", "8", "--block", "32", "--weights", str(weights)]))
    assert (problem.m, problem.n, problem.k, problem.block, problem.density) == (8, 96, 64, 32, 0.5)
    assert sparse.lookup(problem).mask().tolist() == [[True, False], [False, True], [False, True]]
    assert problem.pattern == sparse.from_dense(w, 32)[0].hash
    same = options.problem_from_args(parse(["search", "--m", "8", "--n", "96", "--k", "64", "--block", "32",
                                        "--weights", str(weights)]))
    assert same == problem  # matching --n, --k are fine
    pruned = options.problem_from_args(parse(["search", "--m", "8", "--block", "32", "--density", "0.2",
                                          "--weights", str(weights)]))
    assert pruned.density == pytest.approx(1 / 6)  # round(0.2 * 6) = 1 block: the largest, (2, 1)
    assert sparse.lookup(pruned).mask().tolist() == [[False, False], [False, False], [False, True]]
    assert pruned.pattern == sparse.prune_blocks(w, 32, 0.2)[0].hash
    st = tmp_path / "m.safetensors"  # a bf16 tensor picked by name from a file of several
    from tests.test_sparse import bf16_bits, write_safetensors

    write_safetensors(st, {"layer.weight": ("BF16", bf16_bits(w)), "other.weight": ("F32", np.ones((4, 4)))})
    named = options.problem_from_args(parse(["search", "--m", "8", "--block", "32", "--weights",
                                         f"{st}:layer.weight"]))
    assert named.pattern == problem.pattern


def test_compile_shows_the_sparse_problem(capsys, tmp_path, monkeypatch, weights):
    monkeypatch.setenv("GEMMSCAPE_CACHE", str(tmp_path / "cache"))
    variant = ["--wn", "32", "--tn", "4"]  # a block tile one 32-wide block row across (bn follows the block)
    code, out, err = run(["compile", "--arch", "sm_90", *SMALL, "--block", "32", "--density", "0.25",
                          "--pattern-seed", "7", *variant], capsys)
    pattern = sparse.Pattern.random(100, 200, 32, 0.25, seed=7)
    assert code == 0, err
    assert out.startswith("simt_fp32_nobias_128x32x8_w32x32_t8x4_") and "_bsr32 " in out.splitlines()[0]
    assert (f"  problem 64x100x200_fp32_forward_bsr32_d0.25_{pattern.hash[:8]} (W 100x200 block-sparse: 7 of 28 "
            f"32x32 blocks kept, density 0.25)\n") in out
    code, out, err = run(["compile", "--arch", "sm_90", "--m", "64", "--block", "32", "--weights", str(weights),
                          "--json", *variant], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["problem"] == {"m": 64, "n": 96, "k": 64, "dtype": "fp32", "layout": "forward", "bias": False,
                              "block": 32, "density": 0.5,
                              "pattern": sparse.from_dense(np.load(weights), 32)[0].hash}
    code, out, _ = run(["compile", "--arch", "sm_90", "--json"], capsys)
    assert code == 0 and "problem" not in json.loads(out)  # no problem given: none shown
    code, _, err = run(["compile", "--arch", "sm_90", *SMALL, "--block", "32", "--density", "0.25"], capsys)
    assert code == 2 and "bn must equal the block" not in err and "warp tile 32x64" in err  # bn follows the block


def test_search_builds_the_sparse_problem(capsys, db, default_store):
    url, path = db  # the recording is of the dense problem: the refusal names the sparse one
    pattern = sparse.Pattern.random(4096, 4096, 32, 0.1, seed=7)
    assert_usage(["search", *BIG, "--block", "32", "--density", "0.1", "--pattern-seed", "7", "--replay",
                  str(RECORDING), "--db", url], capsys,
                 f"records 4096x4096x4096_fp32_forward, not 4096x4096x4096_fp32_forward_bsr32_d0.09998_"
                 f"{pattern.hash[:8]}", db_path=path, default=default_store)
    assert pattern.nnzb == 1638  # round(0.1 * 128 * 128)


def test_export_best_looks_up_the_sparse_problem(capsys, tmp_path, db):
    url, path = db
    pattern = sparse.Pattern.random(64, 64, 16, 0.5, seed=2)
    assert_usage(["export", "--best", "--m", "64", "--n", "64", "--k", "64", "--block", "16", "--density", "0.5",
                  "--pattern-seed", "2", "--out", str(tmp_path / "out"), "--db", url], capsys,
                 f"no ok kernel stored for 64x64x64_fp32_forward_bsr16_d0.5_{pattern.hash[:8]}", code=1, db_path=path)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_results_widens_the_problem_column_for_sparse_keys(capsys, tmp_path):
    from store import Store

    problem = sparse.problem_for(4096, sparse.Pattern.random(4096, 4096, 32, 0.1, seed=7), "bf16", bias=True)
    url = f"sqlite:///{tmp_path / 's.db'}"
    with Store(url) as store:
        add_ok(store, SimtSpec(), Problem(64, 64, 64), DEVICE, 0.01)
        add_ok(store, SimtSpec(dtype="bf16", bias=True), problem, DEVICE, 0.5)
    code, out, _ = run(["results", "--db", url], capsys)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    column = lines[0].index("kernel")
    assert column == len(problem.key) + 1
    row = next(line for line in lines if line.startswith(problem.key))
    assert row[column:].startswith(SimtSpec(dtype="bf16", bias=True).name)
    assert lines[1 if lines[2] is row else 2][column:].startswith(SimtSpec().name)


def test_help_shows_the_sparse_options_and_their_defaults(capsys):
    for command in COMMANDS:
        code, out, _ = run([command, "--help"], capsys)
        assert code == 0
        text = " ".join(out.split())
        assert "block-sparse W (default: none of these, W is dense)" in text, command
        assert "--block {16,32,64}" in text and "(default: none, W dense)" in text
        assert "--pattern-seed S seed of the random pattern of --density (default: 0)" in text
        assert "--weights PATH[:NAME]" in text and "--density D" in text


@pytest.mark.parametrize("family", ["simt", "tensorcore", "hopper"])
@pytest.mark.parametrize("layout", ["forward", "grad_input"])
def test_search_and_tune_search_the_sparse_space_of_the_layout(family, layout, monkeypatch, capsys, db):
    """A sparse problem is searched over its family's sparse space for its layout (bn is the block,
    or in the tensor-core family a divisor of it), by ``codegen search`` and by ``tune``; the GPU is
    replaced by a stop right after."""
    from codegen.nn import tune
    from codegen.problem import DType, Layout
    from search import parallel
    from search import space as space_mod
    from search.measure import NoGpu

    dtype = "fp32" if family == "simt" else "bf16"
    asked = []
    real = space_mod.space_for

    def recording_space_for(*args, **kwargs):
        asked.append(real(*args, **kwargs))
        return asked[-1]

    def no_gpu(*args, **kwargs):
        raise NoGpu("stopped by the test")

    monkeypatch.setattr(space_mod, "space_for", recording_space_for)
    monkeypatch.setattr(parallel, "gpu_measurer", no_gpu)
    url, _ = db
    code, _, err = run(["search", "--family", family, "--dtype", dtype, *SMALL, "--layout", layout, "--block", "32",
                        "--density", "0.5", "--db", url], capsys)
    sparse_space = real(family, DType(dtype), block=32, layout=Layout(layout))
    assert sparse_space.dims.get("bn") == ((16, 32) if family == "tensorcore" else None)
    assert [s.dims for s in asked] == [sparse_space.dims]
    problem = options.problem_from_args(parse(["search", *SMALL, "--dtype", dtype, "--layout", layout, "--block", "32",
                                           "--density", "0.5"]))
    asked.clear()
    said = []
    if family == "hopper" and layout == "grad_input":  # blocks of 32: refused before any GPU is looked for
        assert code == 2 and "hopper family generates no kernel for" in err and "blocks of 64" in err
        results = tune.tune({problem: ["layer"]}, family, no_gpu, budget=1, store=None, say=said.append)
        assert results[0].skipped and "skip" in said[0]
    else:
        assert code == 2 and "stopped by the test" in err
        with pytest.raises(NoGpu):
            tune.tune({problem: ["layer"]}, family, no_gpu, budget=1, store=None, say=said.append)
    assert [s.dims for s in asked] == [sparse_space.dims]
