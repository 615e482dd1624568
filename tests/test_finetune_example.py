"""CPU tier: examples/finetune_pruned.py prunes a small model and fine-tunes it with its pattern
fixed (torch runs the GEMMs here): the pattern holds, the kept blocks learn, the loss falls. The GPU
tier runs it on gemmscape's kernels (tests/gpu/test_nn_sparse.py)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "finetune_pruned.py"


def load_example():
    spec = importlib.util.spec_from_file_location("finetune_pruned", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(600)
def test_fine_tuning_keeps_the_pattern_and_learns_on_the_cpu():
    report = load_example().main(["--device", "cpu", "--pretrain", "30", "--steps", "8", "--density", "0.3",
                                  "--block", "16", "--kernels", "none"])
    assert report["pattern_kept"] and report["kept_blocks_learned"] and report["kernels_ran"] == 0
    assert set(report["layers"]) == {"0", "2", "4"} and len(report["losses"]) == 9
    assert all(math.isfinite(v) for v in report["losses"])
    assert report["final_loss"] < report["pruned_loss"]


def test_a_broken_pattern_is_noticed():
    """The example's own check: a block outside the pattern that is not zero."""
    example = load_example()
    from codegen.nn.pruned import prune_model, pruned_layers

    model = prune_model(example.mlp(0, "cpu", torch.float32), 1.0, 16)  # every block: the padded ones too
    layers = pruned_layers(model)
    before = {name: (lay.indptr.numpy(), lay.indices.numpy()) for name, lay in layers.items()}
    assert example.pattern_kept(model, before)
    first = layers["0"]  # W 200x96 in blocks of 16: its last block row is half padding
    last_row = (first.rows == first.pattern.block_rows - 1).nonzero()
    assert len(last_row)
    with torch.no_grad():
        first.blocks[last_row[0, 0], -1, 0] = 1.0  # a row past out_features
    assert not example.pattern_kept(model, before)
    with torch.no_grad():
        first.blocks[last_row[0, 0], -1, 0] = 0.0
    assert example.pattern_kept(model, before)
    before["2"] = (before["2"][0], before["2"][1] + 1)
    assert not example.pattern_kept(model, before)
