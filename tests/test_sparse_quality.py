"""CPU tier: benchmarks.sparse_quality end to end at a tiny size (2 layers of width 64, a few thousand
tokens), every GEMM on torch: the JSON's structure, finite figures, the pruned blocks still zero
after fine-tuning, the time budget's skips, the checkpoint, and the measurements page's table.
The figures are whatever the tiny run gives; only their form and the checks' verdicts are asserted."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from benchmarks import measurements, sparse_quality  # noqa: E402
from benchmarks.pruned_checks import pattern_check, snapshot  # noqa: E402
from codegen.nn.pruned import prune_model  # noqa: E402

LAYERS, WIDTH, CONTEXT, BATCH = 2, 64, 32, 4
TINY = ["--device", "cpu", "--layers", str(LAYERS), "--width", str(WIDTH), "--heads", "4", "--context", str(CONTEXT),
        "--batch", str(BATCH), "--pretrain-tokens", "4k", "--finetune-tokens", "1k", "--eval-tokens", "512",
        "--densities", "0.5", "0.25", "--blocks", "32"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sparse-quality")
    checkpoint = folder / "dense.pt"
    out = folder / "out"
    rc = sparse_quality.main([*TINY, "--out", str(out), "--checkpoint", str(checkpoint)])
    (path,) = out.glob("sparse-quality-cpu-*.json")
    return {"rc": rc, "path": path, "doc": json.loads(path.read_text()), "checkpoint": checkpoint, "folder": folder}


def test_one_complete_result_in_design_s_format(run):
    doc = run["doc"]
    assert run["rc"] == 0 and doc["complete"] is True
    assert (doc["suite"], doc["device"], doc["timing"]["method"]) == ("sparse-quality", "cpu", "quality")
    assert {"gemmscape", "torch", "python", "git"} <= set(doc["versions"])
    assert doc["command"].startswith("python3 -m benchmarks.sparse_quality --device cpu --layers 2")
    corpus = doc["corpus"]
    train, held = corpus["split"]["train"], corpus["split"]["heldout"]
    assert corpus["files"] == train["files"] + held["files"] and corpus["bytes"] == train["bytes"] + held["bytes"]
    assert held["files"] == corpus["files"] // 20 == len(corpus["heldout_files"])
    assert all(len(h) == 64 for h in (corpus["sha256"], train["sha256"], held["sha256"]))
    rows = BATCH * CONTEXT
    assert doc["tokens"] == {"pretrain": round(4000 / rows) * rows, "finetune_per_config": round(1000 / rows) * rows,
                             "eval": math.ceil(512 / rows) * rows}
    assert doc["training"]["pretrain"]["tokens"] == doc["tokens"]["pretrain"]
    assert doc["seeds"] == {"model": 0, "data": 1, "finetune": 2, "eval": 3}
    assert doc["model"]["mlp_parameters"] == LAYERS * 2 * 4 * WIDTH * WIDTH


def test_every_block_density_and_phase_has_finite_bits_per_byte(run):
    doc = run["doc"]
    dense = doc["dense"]["bits_per_byte"]
    assert 0 < dense < 9
    records = {(r["problem"]["block"], r["problem"]["density"], r["problem"]["phase"]): r for r in doc["records"]}
    assert set(records) == {(32, d, p) for d in (0.5, 0.25) for p in ("one-shot", "fine-tuned")} | {(None, 1.0, "fine-tuned")}
    for r in records.values():
        bpb = r["ours"]["bits_per_byte"]
        assert r["ours"]["status"] == "ok" and math.isfinite(bpb) and 0 < bpb < 9
        assert r["baselines"]["dense"]["bits_per_byte"] == dense
        assert r["ratio"]["dense"] == pytest.approx(dense / bpb) and r["delta_bits_per_byte"] == pytest.approx(bpb - dense)
    for (block, density, phase), r in records.items():
        if phase == "fine-tuned":
            ft = r["ours"]["finetune"]
            assert ft["completed"] and ft["tokens"] == doc["tokens"]["finetune_per_config"] and ft["seconds"] > 0
        if block:
            assert r["ours"]["kept_density"] == pytest.approx(density)


def test_pruned_blocks_stayed_zero_the_kept_ones_learned_and_torch_ran_every_gemm(run):
    blocks_per_layer = 2 * (4 * WIDTH // 32) * (WIDTH // 32)  # fc and proj, blocks of 32
    for r in run["doc"]["records"]:
        p, ours = r["problem"], r["ours"]
        if not p["block"]:
            continue
        if p["phase"] == "fine-tuned":
            check = ours["pattern"]
            assert check["ok"] and check["nonzero_blocks_outside_pattern"] == 0 and check["pattern_unchanged"]
            assert check["kept_blocks"] == round(p["density"] * blocks_per_layer) * LAYERS
            assert check["kept_blocks_changed"] == check["kept_blocks"]
        else:  # one-shot: our kernels compared with torch on one batch (on the CPU both are torch)
            assert ours["check"]["finite"] and ours["check"]["logits_rel_error"] == 0.0
        layouts = 3 if p["phase"] == "fine-tuned" else 1
        gemms = ours["gemms"]
        assert (gemms["ours"], gemms["torch"], gemms["not_run"]) == (0, LAYERS * 2 * layouts, 0)
        assert all("cpu" in why for why in gemms["torch_reasons"])


def test_pattern_check_names_a_block_outside_the_pattern():
    torch.manual_seed(0)
    model = prune_model(torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False)), 0.5, 16)
    before = snapshot(model)
    assert pattern_check(model, before)["ok"]
    name = next(iter(before))
    planted = {name: {**before[name], "mask": before[name]["mask"].copy()}}
    rows, cols = before[name]["mask"].nonzero()
    planted[name]["mask"][rows[0], cols[0]] = False  # as if this kept block had been pruned: it is not zero
    got = pattern_check(model, planted)
    assert got["nonzero_blocks_outside_pattern"] == 1 and not got["ok"]
    got = pattern_check(model, {name: {**before[name], "hash": "another"}})
    assert not got["pattern_unchanged"] and not got["ok"]


def test_a_second_run_loads_the_checkpoint_and_a_spent_budget_skips_fine_tunes(run):
    out = run["folder"] / "again"
    rc = sparse_quality.main([*TINY, "--out", str(out), "--checkpoint", str(run["checkpoint"]), "--max-seconds", "0.01"])
    (path,) = out.glob("sparse-quality-cpu-*.json")
    doc = json.loads(path.read_text())
    assert rc == 3 and doc["complete"] is False
    assert doc["training"]["pretrain"]["loaded_from"] == str(run["checkpoint"])
    assert doc["dense"]["bits_per_byte"] == run["doc"]["dense"]["bits_per_byte"]
    skipped = [r for r in doc["records"] if r["problem"]["phase"] == "fine-tuned"]
    assert len(skipped) == 3 and all(r["ours"]["status"] == "skipped" and "--max-seconds" in r["ours"]["reason"]
                                     and r["ours"]["bits_per_byte"] is None for r in skipped)
    one_shot = [r for r in doc["records"] if r["problem"]["phase"] == "one-shot"]
    assert [r["ours"]["bits_per_byte"] for r in one_shot] == [r["ours"]["bits_per_byte"] for r in run["doc"]["records"]
                                                               if r["problem"]["phase"] == "one-shot"]


def test_the_quality_table_lands_on_the_measurements_page_once_a_result_exists(run, tmp_path):
    results, root = tmp_path / "results", tmp_path / "root"
    results.mkdir()
    (root / "docs").mkdir(parents=True)
    for f in measurements.RESULTS.iterdir():  # the committed results but the quality study's
        if not f.name.startswith("sparse-quality-"):
            (results / f.name).symlink_to(f)
    page = (measurements.ROOT / "docs" / "measurements.md").read_text()
    if "### Block sparsity: quality" in page:  # the page as it was before a quality result was committed
        end = "<!-- measurements:sparse-quality end -->\n\n"
        page = page[:page.index("### Block sparsity: quality")] + page[page.index(end) + len(end):]
    (root / "docs" / "measurements.md").write_text(page)
    (root / "README.md").write_text((measurements.ROOT / "README.md").read_text())
    assert "sparse-quality" not in measurements.tables(results)  # nothing committed: no section
    (results / run["path"].name).symlink_to(run["path"])
    assert measurements.main(["--root", str(root), "--results", str(results)]) == 0
    text = (root / "docs" / "measurements.md").read_text()
    assert "### Block sparsity: quality" in text and "<!-- measurements:sparse-quality end -->" in text
    assert text.index("### Block sparsity: quality") < text.index("## The linear layer")
    doc = run["doc"]
    rows = [line for line in text.splitlines() if run["path"].name in line and line.startswith("| ")]
    assert len(rows) == 2 and all(f"{doc['dense']['bits_per_byte']:.4f}" in row for row in rows)
    for r in doc["records"]:
        assert f"{r['ours']['bits_per_byte']:.4f}" in text
    assert measurements.main(["--root", str(root), "--results", str(results), "--check"]) == 0  # placed once


def test_token_counts():
    assert [sparse_quality.tokens_arg(t) for t in ("40M", "500k", "7", "1.5M")] == [40_000_000, 500_000, 7, 1_500_000]
    with pytest.raises(Exception, match="token count"):
        sparse_quality.tokens_arg("lots")
