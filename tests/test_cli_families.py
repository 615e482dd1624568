"""``codegen search`` without --family searches every family that fits, with one budget; --family
narrows it (measured by a synthetic measurer: test data, no GPU)."""

from __future__ import annotations

import json

import pytest

from codegen import cli
from tests.search.synthetic import Synthetic

BF16 = ["--m", "2048", "--n", "6144", "--k", "4096", "--dtype", "bf16"]


@pytest.fixture
def synthetic(monkeypatch):
    made = []

    def gpu_measurer(problem, gpus, **kw):
        made.append(Synthetic({"hopper": 600.0, "tensorcore": 300.0, "simt": 30.0, "direct": 100.0}))
        return made[-1]

    monkeypatch.setattr("search.parallel.gpu_measurer", gpu_measurer)
    return made


def search(capsys, *args):
    code = cli.main(["search", *args, "--no-store", "--quiet", "--json"])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip() else None), out.err


def test_the_default_search_takes_every_family_that_fits(synthetic, capsys):
    code, doc, err = search(capsys, *BF16, "--budget", "30")
    assert code == 0
    assert set(doc["families"]) == {"hopper", "tensorcore"} and doc["family"] == "hopper"
    assert doc["evaluated"] == 30 == sum(f["evaluated"] for f in doc["families"].values())
    assert doc["best"]["family"] == "hopper" and doc["best"]["kernel"].startswith("hp_")
    assert "families: hopper, tensorcore, one budget of 30 trials" in err and "(hopper family)" in err
    assert "hopper seeds: " in err and "tensorcore seeds: " in err
    assert len(set(synthetic[0].measured)) == 30


def test_family_narrows_the_search_and_repeats(synthetic, capsys):
    code, doc, err = search(capsys, *BF16, "--budget", "12", "--family", "tensorcore")
    assert code == 0 and list(doc["families"]) == ["tensorcore"] and doc["best"]["kernel"].startswith("tc_")
    assert ":tensorcore-full:" in doc["study"]  # one family: the plain study, as before
    code, doc, _ = search(capsys, *BF16, "--budget", "12", "--family", "simt", "--family", "tensorcore")
    assert code == 0 and list(doc["families"]) == ["simt", "tensorcore"] and doc["family"] == "tensorcore"


def test_fp32_searches_simt_alone(synthetic, capsys):
    code, doc, _ = search(capsys, "--m", "64", "--n", "64", "--k", "64", "--budget", "5")
    assert code == 0 and list(doc["families"]) == ["simt"] and doc["seeds"]["source"]


def test_a_family_that_cannot_compute_the_problem_is_one_line(synthetic, capsys):
    code, doc, err = search(capsys, *BF16, "--budget", "5", "--family", "direct")
    assert code == 2 and doc is None and not synthetic
    assert err.count("\n") == 1 and "direct" in err and "block-sparse" in err


@pytest.mark.parametrize(("args", "family"), [
    (["--dtype", "fp32"], "simt"),
    (["--dtype", "tf32"], "tensorcore"),
    (["--dtype", "bf16", "--arch", "sm_90"], "hopper"),
    (["--dtype", "fp16", "--arch", "sm_80"], "tensorcore"),
    (["--dtype", "bf16", "--arch", "sm_90", "--m", "33", "--n", "4095", "--k", "4097", "--layout", "grad_weight"],
     "tensorcore"),  # Hopper's weight gradient reads 16-byte rows
])
def test_compile_without_family_takes_the_default_spec_of_the_best_family(args, family, capsys):
    assert cli.main(["compile", *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"].startswith({"simt": "simt_", "tensorcore": "tc_",
                                                                    "hopper": "hp_"}[family])
    assert cli.family_asked(["compile", *args]) == family


def test_a_family_that_does_not_take_the_dtype_names_the_one_that_does(capsys):
    assert cli.main(["compile", "--dtype", "tf32", "--family", "simt"]) == 2
    assert capsys.readouterr().err == ("codegen compile: the simt family generates no tf32 kernels; choose --family "
                                       "tensorcore\n")


def test_the_variant_options_are_the_default_family_s(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--dtype", "bf16", "--arch", "sm_90", "--help"])
    assert "kernel variant (hopper family" in capsys.readouterr().out
