"""CPU tier: the command line's --family and the variant options each family's spec declares."""

from __future__ import annotations

import pytest

from codegen import cli
from codegen.cli import options
from codegen.families.simt import Spec as SimtSpec

PROBLEM = ["--m", "64", "--n", "64", "--k", "64"]


def parse(argv: list[str]):
    return cli.build_parser(cli.family_asked(argv)).parse_args(argv)


def test_variant_options_are_typed_from_the_spec_fields():
    args = parse(["bench", *PROBLEM, "--copy", "async", "--stages", "3", "--bk", "16", "--split-k", "2",
                  "--reduce", "two_pass"])
    assert (args.copy, args.stages, args.bk, args.split_k, args.reduce) == ("async", 3, 16, 2, "two_pass")
    spec = options.spec_from_args(args, options.problem_from_args(args))
    assert spec == SimtSpec(copy="async", stages=3, bk=16, split_k=2, reduce="two_pass")
    assert parse(["compile", "--wm", "16"]).tm is None  # unset options take the spec's defaults


@pytest.mark.parametrize("flag,value", [("--reduce", "bogus"), ("--copy", "tma"), ("--bm", "big"), ("--family", "nope")])
def test_bad_values_exit_2_with_a_message(flag, value, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", *PROBLEM, flag, value])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "invalid" in err and value in err and flag.lstrip("-").replace("-", "_") in err.replace("-", "_")


def test_help_shows_the_choices(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "--copy {reg,async}" in out and "--reduce {none,atomic,two_pass,cluster,last}" in out
    assert "kernel variant (simt family" in out and "--family" in out


@pytest.mark.parametrize("command", ["compile", "bench", "search", "sweep", "export"])
def test_every_spec_command_takes_family(command, toy_family):
    base = {"compile": [], "bench": PROBLEM, "search": PROBLEM, "sweep": [*PROBLEM, "--out", "x.json"],
            "export": ["--out", "x"]}[command]
    asked = parse([command, *base, "--family", "toy"]).family
    assert asked == (["toy"] if command == "search" else "toy")  # a search takes several families
    assert parse([command, *base]).family is None  # the default, not asked for explicitly


def test_a_family_s_own_options_come_with_it(toy_family, capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--family", "toy", "--help"])
    out = capsys.readouterr().out
    assert "kernel variant (toy family" in out and "--mode {plain,fancy}" in out and "--swizzle" in out
    assert "--bm" not in out
    args = parse(["compile", "--family", "toy", "--tile", "32", "--mode", "fancy", "--swizzle"])
    assert options.spec_from_args(args) == toy_family.Spec(tile=32, mode="fancy", swizzle=True)
    with pytest.raises(SystemExit) as stop:
        cli.main(["bench", *PROBLEM, "--family", "toy", "--bm", "64"])  # a simt option
    assert stop.value.code == 2


def test_a_kernel_of_another_family_is_refused(toy_family, capsys):
    simt_name = SimtSpec().name
    args = parse(["bench", *PROBLEM, "--kernel", simt_name, "--family", "toy"])
    with pytest.raises(ValueError, match="of the simt family, not toy"):
        options.spec_from_args(args)
    assert cli.main(["compile", simt_name, "--family", "toy"]) == 2
    assert "of the simt family, not toy" in capsys.readouterr().err
    toy = toy_family.Spec(tile=8)
    assert options.spec_from_args(parse(["bench", *PROBLEM, "--kernel", toy.name])) == toy  # dispatched by name
    with pytest.raises(ValueError, match="not a kernel name of any family"):
        options.spec_from_args(parse(["bench", *PROBLEM, "--kernel", "nothing_like_a_name"]))


def test_searching_a_family_without_a_space_is_a_clear_error(toy_family, capsys):
    from search.space import space_for

    with pytest.raises(ValueError, match="'toy' has no search space"):
        space_for("toy", toy_family.Spec().dtype)
    with pytest.raises(ValueError, match="unknown kernel family 'nope'"):
        space_for("nope", toy_family.Spec().dtype)


def test_compile_prints_the_source_of_a_variant(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMSCAPE_CACHE", str(tmp_path))
    assert cli.main(["compile", "--copy", "async", "--stages", "3", "--bk", "16", "--arch", "sm_90", "--source"]) == 0
    out = capsys.readouterr().out
    assert "cp.async" in out and SimtSpec(copy="async", stages=3, bk=16).name in out


def test_a_sparse_problem_needs_a_family_with_sparse_variants(toy_family, capsys):
    code = cli.main(["compile", *PROBLEM, "--block", "32", "--density", "0.5", "--family", "toy"])
    err = capsys.readouterr().err
    assert code == 2 and "the toy family has no block-sparse variants" in err and "simt" in err and "tensorcore" in err
