"""CPU tier: the command line's 2:4 W (--sparsity 2:4, with --weights or --n/--k).

Every command that takes a problem takes it; each misuse is one line on stderr, exit code 2, with
the database it names unchanged and no default store created. A valid command line builds the 2:4
problem, compile takes the sparse24 family for it, and a stored 2:4 kernel is listed and exported.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from codegen import cli, sparse24
from codegen.cli import options
from codegen.families.sparse24 import Spec
from codegen.problem import DType, Problem
from tests.test_cli_errors import DEVICE, add_ok, assert_usage, run

ODD = ["--m", "130", "--n", "264", "--k", "136", "--dtype", "bf16"]
COMMANDS = ["compile", "bench", "search", "sweep", "export"]


def command_line(command: str, tmp_path: Path) -> list[str]:
    """A command that takes a problem, with what it needs besides the problem (no recording: none is
    of a 2:4 W, and the problem's own mistakes are said before a GPU is looked for)."""
    return {"compile": ["compile", "--arch", "sm_90"], "bench": ["bench"], "search": ["search", "--budget", "3"],
            "sweep": ["sweep", "--out", str(tmp_path / "rec.json")],
            "export": ["export", "--best", "--out", str(tmp_path / "out")]}[command]


def parse(argv: list[str]):
    return cli.build_parser(cli.family_asked(argv)).parse_args(argv)


@pytest.fixture
def w24(tmp_path) -> Path:
    """A 40x37 W that is 2:4 sparse already."""
    w = sparse24.prune24(np.random.default_rng(0).standard_normal((40, 37)).astype(np.float32))
    np.save(tmp_path / "w24.npy", w)
    return tmp_path / "w24.npy"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flags,needle", [
    (["--dtype", "fp32"], "2:4 sparsity runs on sparse tensor cores in fp16 or bf16, not fp32"),
    (["--dtype", "tf32"], "in fp16 or bf16, not tf32"),
    (["--block", "32", "--density", "0.5"], "a W is either 2:4 sparse or block-sparse, not both: drop --block or "
                                            "--sparsity"),
    (["--density", "0.5"], "--density describes a block-sparse W; a 2:4 W keeps two of each four along K by "
                           "magnitude: drop it"),
    (["--pattern-seed", "1"], "--pattern-seed describes a block-sparse W"),
    (["--layout", "grad_input"], "2:4 sparsity is generated for the forward layout only, not grad_input"),
    (["--layout", "grad_weight"], "forward layout only, not grad_weight"),
    (["--sparsity", "1:4"], "argument --sparsity: invalid choice: '1:4'"),
])
def test_2_4_options_that_do_not_go_together(command, flags, needle, capsys, tmp_path, db, default_store):
    url, path = db
    extra = ["--db", url] if command != "compile" else []
    argv = [*command_line(command, tmp_path), "--m", "64", "--n", "64", "--k", "64", "--sparsity", "2:4",
            "--dtype", "bf16", *flags, *extra]
    line = assert_usage(argv, capsys, needle, db_path=path, default=default_store)
    assert line.startswith(f"codegen {command}: ")
    assert not (tmp_path / "rec.json").exists() and not (tmp_path / "out").exists()


def test_a_family_without_2_4_variants_is_refused_in_one_line(capsys, db, default_store):
    url, path = db
    assert_usage(["compile", *ODD, "--sparsity", "2:4", "--family", "tensorcore"], capsys,
                 "the tensorcore family has no 2:4 sparse variants; choose --family hopper_sp24 or sparse24", default=default_store)
    assert_usage(["search", *ODD, "--sparsity", "2:4", "--family", "simt", "--db", url], capsys,
                 "the simt family generates no kernel for 130x264x136_bf16_forward_sp24", db_path=path,
                 default=default_store)
    assert_usage(["compile", *ODD, "--family", "sparse24"], capsys,
                 "the sparse24 family computes a 2:4 sparse W only (give --sparsity 2:4)", default=default_store)
    assert_usage(["compile", *ODD, "--block", "32", "--density", "0.5", "--family", "sparse24"], capsys,
                 "the sparse24 family computes a 2:4 sparse W only", default=default_store)


def test_a_recording_of_a_dense_w_does_not_answer_for_a_2_4_one(capsys, db, default_store):
    from tests.test_cli_errors import RECORDING

    url, path = db
    assert_usage(["search", "--replay", str(RECORDING), "--sparsity", "2:4", "--budget", "3", "--db", url], capsys,
                 "--sparsity 2:4 does not match", "which records 4096x4096x4096_fp32_forward", db_path=path,
                 default=default_store)


def test_the_2_4_problem_of_the_options(w24, tmp_path, capsys):
    assert options.problem_from_args(parse(["search", *ODD, "--sparsity", "2:4", "--bias"])) == \
        Problem(130, 264, 136, DType.bf16, bias=True, sparsity="2:4")
    got = options.problem_from_args(parse(["search", "--m", "5", "--sparsity", "2:4", "--dtype", "fp16",
                                           "--weights", str(w24)]))
    assert got == Problem(5, 40, 37, DType.fp16, sparsity="2:4") and capsys.readouterr().err == ""
    dense = np.random.default_rng(1).standard_normal((8, 12)).astype(np.float32)
    np.save(tmp_path / "dense.npy", dense)
    got = options.problem_from_args(parse(["search", "--m", "5", "--sparsity", "2:4", "--dtype", "bf16",
                                           "--weights", str(tmp_path / "dense.npy")]))
    assert (got.n, got.k, got.sparsity) == (8, 12, "2:4")
    assert capsys.readouterr().err.strip() == (f"note: W in {tmp_path / 'dense.npy'} is not 2:4 sparse (24 of its 24 "
                                               f"groups of four along K hold more than two non-zeros): pruned by "
                                               f"magnitude")


def test_the_weights_shape_must_match_n_and_k(w24, capsys, default_store):
    assert_usage(["compile", "--m", "5", "--n", "41", "--sparsity", "2:4", "--dtype", "bf16", "--weights", str(w24)],
                 capsys, "--n 41 does not match W in", "which is 40x37 (N x K)", default=default_store)
    assert_usage(["compile", "--sparsity", "2:4", "--dtype", "bf16", "--weights", str(w24)], capsys,
                 "a problem with --weights needs --m", default=default_store)


def test_compile_takes_the_sparse24_family_for_a_2_4_problem(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMSCAPE_CACHE", str(tmp_path / "cache"))
    code, out, err = run(["compile", *ODD, "--sparsity", "2:4", "--bias", "--arch", "sm_80", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["name"] == Spec(bias=True).name and doc["problem"]["sparsity"] == "2:4"
    assert all(r["spill_stores"] == 0 for r in doc["report"].values())
    code, out, err = run(["compile", *ODD, "--sparsity", "2:4", "--bm", "32", "--wm", "16", "--arch", "sm_90",
                            "--family", "sparse24"], capsys)
    assert code == 0, err
    assert out.splitlines()[0].startswith("sp24_bf16_nobias_32x128x64_w16x32") and \
        "(W 264x136 2:4 sparse: two of each four along K kept)" in out
    code, out, err = run(["compile", *ODD, "--sparsity", "2:4", "--arch", "sm_90"], capsys)  # Hopper's own, first
    assert code == 0, err
    assert out.splitlines()[0].startswith("hsp24_bf16_nobias_"), out


def test_search_without_a_gpu_says_so_after_the_problem_checks(capsys, db, default_store, monkeypatch):
    monkeypatch.setattr("codegen.worker.why_no_gpu", lambda: "no NVIDIA driver here (nvidia-smi not found)")
    url, path = db
    line = assert_usage(["search", *ODD, "--sparsity", "2:4", "--db", url, "--budget", "3"], capsys,
                        db_path=path, default=default_store)
    assert "no NVIDIA driver here" in line


def test_a_stored_2_4_kernel_is_listed_and_exported_with_its_operands(tmp_path, capsys):
    from store import Store

    url = f"sqlite:///{tmp_path / 's.db'}"
    problem = Problem(130, 264, 136, DType.bf16, bias=True, sparsity="2:4")
    with Store(url) as store:
        add_ok(store, Spec(bias=True), problem, DEVICE, 0.02)
        add_ok(store, Spec(bias=True, bm=128, wm=64), problem, DEVICE, 0.01)
    code, out, err = run(["results", "--db", url, "--json"], capsys)
    assert code == 0 and json.loads(out)[0]["problem"] == problem.key
    code, out, err = run(["export", "--best", *ODD, "--bias", "--sparsity", "2:4", "--db", url, "--out",
                          str(tmp_path / "x")], capsys)
    assert code == 0, err
    name = Spec(bias=True, bm=128, wm=64).name
    doc = json.loads((tmp_path / "x" / f"{name}.json").read_text())
    assert doc["sparse"]["format"] == "2:4" and [a["name"] for a in doc["kernels"][0]["args"]] == \
        ["Y", "X", "WC", "B", "WS", "WE", "M", "N", "K"]
    code, out, err = run(["export", "--best", *ODD, "--bias", "--db", url, "--out", str(tmp_path / "y")], capsys)
    assert code == 1 and "no ok kernel stored for 130x264x136_bf16_forward_bias" in err  # the dense problem: none
    code, out, err = run(["export", "--bundle", str(tmp_path / "b"), "--sparsity", "2:4", "--db", url], capsys)
    assert code == 2 and "drop --sparsity" in err
    code, out, err = run(["export", "--bundle", str(tmp_path / "b"), "--db", url], capsys)  # Sparse24Linear's kernel
    assert code == 0, err
    index = json.loads((tmp_path / "b" / "index.json").read_text())
    assert [(e["key"], e["kernel"]) for e in index["kernels"]] == [(problem.key, name)] and not index["skipped"]
    from codegen.nn.bundle import Bundle

    found = Bundle(tmp_path / "b").find(problem, DEVICE["name"])
    assert found.manifest["name"] == name and [a["name"] for a in found.manifest["kernels"][0]["args"]] == \
        ["Y", "X", "WC", "B", "WS", "WE", "M", "N", "K"]
