"""CPU tier: benchmarks.sparse_quality end to end at a tiny size (2 layers of width 64, a few thousand
tokens), every GEMM on torch: the JSON's structure, finite figures, the pruned blocks (and the pruned
halves of the 2:4 rows) still zero after fine-tuning, the pattern checks failing where a W is corrupted,
``--patterns``, the time budget's skips, the checkpoint, and the measurements page's table.
The figures are whatever the tiny run gives; only their form and the checks' verdicts are asserted."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from benchmarks import measurements, sparse_quality  # noqa: E402
from benchmarks.pruned_checks import gemm_report, kept_density, pattern_check, snapshot  # noqa: E402
from codegen import sparse24  # noqa: E402
from codegen.nn.pruned import prune_model, sparse24_layers  # noqa: E402

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
    assert doc["patterns"] == ["block", "2:4"]
    records = {(r["problem"]["sparsity"], r["problem"]["block"], r["problem"]["density"], r["problem"]["phase"]): r
               for r in doc["records"]}
    phases = ("one-shot", "fine-tuned")
    assert set(records) == ({("block", 32, d, p) for d in (0.5, 0.25) for p in phases}
                            | {("2:4", None, 0.5, p) for p in phases} | {("none", None, 1.0, "fine-tuned")})
    assert all(r["problem"]["pruned"] == ("none" if key[0] == "none" else "mlp") for key, r in records.items())
    for r in records.values():
        bpb = r["ours"]["bits_per_byte"]
        assert r["ours"]["status"] == "ok" and math.isfinite(bpb) and 0 < bpb < 9
        assert r["baselines"]["dense"]["bits_per_byte"] == dense
        assert r["ratio"]["dense"] == pytest.approx(dense / bpb) and r["delta_bits_per_byte"] == pytest.approx(bpb - dense)
    for (sparsity, _block, density, phase), r in records.items():
        if phase == "fine-tuned":
            ft = r["ours"]["finetune"]
            assert ft["completed"] and ft["tokens"] == doc["tokens"]["finetune_per_config"] and ft["seconds"] > 0
        if sparsity != "none":
            assert r["ours"]["kept_density"] == pytest.approx(density)


def test_pruned_blocks_stayed_zero_the_kept_ones_learned_and_torch_ran_every_gemm(run):
    blocks_per_layer = 2 * (4 * WIDTH // 32) * (WIDTH // 32)  # fc and proj, blocks of 32
    for r in run["doc"]["records"]:
        p, ours = r["problem"], r["ours"]
        if p["sparsity"] != "block":
            continue
        if p["phase"] == "fine-tuned":
            check = ours["pattern"]
            assert check["ok"] and check["nonzero_blocks_outside_pattern"] == 0 and check["pattern_unchanged"]
            assert check["kept_blocks"] == round(p["density"] * blocks_per_layer) * LAYERS
            assert check["kept_blocks_changed"] == check["kept_blocks"]
        else:  # one-shot: our kernels compared with torch on one batch (on the CPU both are torch)
            assert ours["check"]["finite"] and ours["check"]["logits_rel_error"] == 0.0
            assert ours["check"]["block_grad_rel_error"] == ours["check"]["kept_grad_rel_error"] == 0.0
        layouts = 3 if p["phase"] == "fine-tuned" else 1
        gemms = ours["gemms"]
        assert (gemms["ours"], gemms["torch"], gemms["not_run"]) == (0, LAYERS * 2 * layouts, 0)
        assert all("cpu" in why for why in gemms["torch_reasons"])


def test_the_2_4_rows_kept_two_of_four_the_kept_values_learned_and_torch_ran_every_gemm(run):
    rows = {r["problem"]["phase"]: r for r in run["doc"]["records"] if r["problem"]["sparsity"] == "2:4"}
    assert set(rows) == {"one-shot", "fine-tuned"}
    kept = LAYERS * 2 * (4 * WIDTH * WIDTH) // 2  # fc and proj, half of each W
    for phase, r in rows.items():
        p, ours = r["problem"], r["ours"]
        assert (p["block"], p["density"], p["pruned"]) == (None, 0.5, "mlp") and ours["kept_density"] == 0.5
        gemms = ours["gemms"]
        if phase == "fine-tuned":
            check = ours["pattern"]
            assert check["sparsity"] == "2:4" and check["ok"] and check["pattern_unchanged"]
            assert check["groups_over_two_nonzero"] == check["nonzero_outside_pattern"] == 0
            assert check["groups"] == 2 * kept // 4 and check["kept_values"] == kept
            assert check["kept_values_changed"] > 0.99 * kept  # the kept values learned
            assert gemms["by_layout"] == {layout: {"ours": 0, "torch": LAYERS * 2, "not_run": 0}
                                          for layout in ("forward", "grad_input", "grad_weight")}
            assert sum(n for why, n in gemms["torch_reasons"].items() if "backward runs torch" in why) == LAYERS * 4
        else:  # ours against torch on one batch: on the CPU both are torch
            check = ours["check"]
            assert check["finite"] and check["logits_rel_error"] == check["kept_grad_rel_error"] == 0.0
            assert "block_grad_rel_error" not in check
            assert gemms["by_layout"] == {"forward": {"ours": 0, "torch": LAYERS * 2, "not_run": 0}}
        assert (gemms["ours"], gemms["not_run"]) == (0, 0)
        assert any("no 2:4" in why for why in gemms["torch_reasons"])  # fp32 on the CPU: no 2:4 kernels


def _pruned24():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32, bias=False)
    model = prune_model(torch.nn.Sequential(linear), None, None, pattern="2:4")
    (name, layer), = sparse24_layers(model).items()
    assert torch.equal(layer.mask(), torch.from_numpy(sparse24.mask24(linear.weight.detach().numpy())))  # magnitude
    return model, name, layer


def test_the_2_4_pattern_check_passes_a_trained_layer_and_names_a_corrupted_w():
    model, name, layer = _pruned24()
    before = snapshot(model)
    assert before[name]["sparsity"] == "2:4" and kept_density(model) == 0.5
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 64)).square().sum().backward()
    opt.step()
    got = pattern_check(model, before)
    assert got["ok"] and got["kept_values_changed"] == got["kept_values"] == 32 * 64 // 2
    assert got["groups_over_two_nonzero"] == got["nonzero_outside_pattern"] == 0
    # a kept value of group 1 moved into group 0, at the position group 0 pruned: three non-zeros there
    row = layer.columns[0]
    free = next(c for c in range(4) if c not in row[:2].tolist())
    with torch.no_grad():
        layer.columns[0, 2] = free
    got = pattern_check(model, before)
    assert not got["ok"] and got["groups_over_two_nonzero"] == 1 and got["nonzero_outside_pattern"] == 1
    assert got["pattern_unchanged"]  # the metadata is as pruned: the dense W is what the check reads
    # the positions kept at pruning other than the layer's: its non-zeros lie outside them
    with torch.no_grad():
        layer.columns[0, 2] = before[name]["mask"][0].nonzero()[2, 0]  # as pruned again
    assert pattern_check(model, before)["ok"]
    planted = {name: {**before[name], "mask": before[name]["mask"].clone()}}
    planted[name]["mask"][0, row[0]] = False
    got = pattern_check(model, planted)
    assert not got["ok"] and got["nonzero_outside_pattern"] == 1 and got["groups_over_two_nonzero"] == 0
    # another metadata than pruning's
    other = {name: {**before[name], "metadata": before[name]["metadata"] ^ 1}}
    got = pattern_check(model, other)
    assert not got["ok"] and not got["pattern_unchanged"]


def test_the_2_4_gemm_report_counts_torch_for_fp32_and_nothing_before_a_forward():
    from codegen.problem import DType

    model, _, layer = _pruned24()
    layouts = ("forward", "grad_input", "grad_weight")
    assert gemm_report(model, 8, DType("fp32"), layouts)["not_run"] == 3
    model(torch.randn(8, 64)).sum().backward()
    got = gemm_report(model, 8, DType("fp32"), layouts)
    assert (got["ours"], got["torch"], got["not_run"]) == (0, 3, 0)
    assert gemm_report(model, 8, DType("bf16"), layouts)["not_run"] == 3  # a bf16 problem never ran here


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
    assert len(skipped) == 4 and all(r["ours"]["status"] == "skipped" and "--max-seconds" in r["ours"]["reason"]
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
    if "### Sparsity: quality" in page:  # the page as it was before a quality result was committed
        end = "<!-- measurements:sparse-quality end -->\n\n"
        page = page[:page.index("### Sparsity: quality")] + page[page.index(end) + len(end):]
    (root / "docs" / "measurements.md").write_text(page)
    (root / "README.md").write_text((measurements.ROOT / "README.md").read_text())
    assert "sparse-quality" not in measurements.tables(results)  # nothing committed: no section
    (results / run["path"].name).symlink_to(run["path"])
    assert measurements.main(["--root", str(root), "--results", str(results)]) == 0
    text = (root / "docs" / "measurements.md").read_text()
    assert "### Sparsity: quality" in text and "<!-- measurements:sparse-quality end -->" in text
    assert text.index("### Sparsity: quality") < text.index("## The linear layer")
    doc = run["doc"]
    rows = [line for line in text.splitlines() if run["path"].name in line and line.startswith("| ")]
    assert len(rows) == 3 and all(f"{doc['dense']['bits_per_byte']:.4f}" in row for row in rows)
    assert [row.split(" | ")[1] for row in rows] == ["blocks of 32", "blocks of 32", "2:4"]
    for r in doc["records"]:
        assert f"{r['ours']['bits_per_byte']:.4f}" in text
    assert measurements.main(["--root", str(root), "--results", str(results), "--check"]) == 0  # placed once


def test_token_counts():
    assert [sparse_quality.tokens_arg(t) for t in ("40M", "500k", "7", "1.5M")] == [40_000_000, 500_000, 7, 1_500_000]
    with pytest.raises(Exception, match="token count"):
        sparse_quality.tokens_arg("lots")


def test_patterns_chooses_the_pruned_copies():
    args = sparse_quality.parse(["--patterns", "2:4", "block", "2:4"])
    assert args.patterns == ["block", "2:4"]
    assert len(sparse_quality.configs(args)) == 6 + 1
    args = sparse_quality.parse(["--patterns", "2:4", "--blocks", "128"])  # the blocks do not apply to 2:4
    assert sparse_quality.configs(args) == [("2:4", None, 0.5)]
    assert sparse_quality.configs(sparse_quality.parse(["--blocks", "32", "--densities", "0.5"])) == [
        ("block", 32, 0.5), ("2:4", None, 0.5)]
    with pytest.raises(SystemExit):
        sparse_quality.parse(["--patterns", "3:4"])


def test_a_2_4_only_run_prunes_2_4_and_fine_tunes_the_dense_control(run):
    out = run["folder"] / "only-24"
    rc = sparse_quality.main([*TINY, "--patterns", "2:4", "--out", str(out), "--checkpoint", str(run["checkpoint"])])
    (path,) = out.glob("sparse-quality-cpu-*.json")
    doc = json.loads(path.read_text())
    assert rc == 0 and doc["complete"] and doc["patterns"] == ["2:4"]
    got = [(r["problem"]["sparsity"], r["problem"]["phase"]) for r in doc["records"]]
    assert got == [("2:4", "one-shot"), ("2:4", "fine-tuned"), ("none", "fine-tuned")]
    before = {(r["problem"]["sparsity"], r["problem"]["phase"]): r["ours"]["bits_per_byte"] for r in run["doc"]["records"]}
    assert all(r["ours"]["bits_per_byte"] == pytest.approx(before[k]) for k, r in zip(got, doc["records"], strict=True))
    assert "2:4" in sparse_quality.table(doc)


def test_the_quality_table_shows_2_4_rows_of_the_committed_results_and_a_made_up_one(tmp_path):
    """The committed results (block-sparse rows, some written before records named their sparsity, and
    2:4 rows) and a made-up file of 2:4 rows: all on the table, one row per pruned one-shot record."""
    committed = sorted(measurements.RESULTS.glob("sparse-quality-*.json"))
    assert committed
    for f in committed:
        (tmp_path / f.name).symlink_to(f)
    doc = json.loads(committed[0].read_text())
    fake = {**doc, "date": "2099-01-01T000000Z", "records": []}
    problem = {**doc["records"][0]["problem"], "sparsity": "2:4", "block": None, "density": 0.5}
    gemms = {"ours": 12, "torch": 24, "not_run": 0}
    for phase, bpb in (("one-shot", 1.2345), ("fine-tuned", 1.0789)):
        ours = {"bits_per_byte": bpb, "status": "ok", "gemms": gemms}
        fake["records"].append({"problem": {**problem, "phase": phase}, "timing": "quality", "ours": ours})
    control = {"bits_per_byte": 1.0555, "status": "ok"}
    fake["records"].append({"problem": {**problem, "sparsity": "none", "pruned": "none", "density": 1.0,
                                        "phase": "fine-tuned"}, "timing": "quality", "ours": control})
    name = "sparse-quality-fake-2099-01-01T000000Z.json"
    (tmp_path / name).write_text(json.dumps(fake))
    text = measurements.sparse_quality(tmp_path, "../benchmarks/results")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "byte GPT" in line]
    old = [row for row in rows if name not in row]
    assert len(old) == sum(1 for f in committed for r in json.loads(f.read_text())["records"]
                           if r["problem"].get("sparsity") != "none" and r["problem"].get("pruned") != "none"
                           and r["problem"]["phase"] == "one-shot")
    assert all(row.split(" | ")[1].startswith("blocks of ") or row.split(" | ")[1] == "2:4" for row in old)
    (new,) = [row.split(" | ") for row in rows if name in row]
    assert new[1:7] == ["2:4", "0.50", f"{doc['dense']['bits_per_byte']:.4f}", "1.2345", "1.0789", "1.0555"]
    assert new[8] == "12 / 24"
