"""benchmarks/probes/nn_overhead.py on the CPU, in a process of its own."""

from __future__ import annotations

import pytest


def test_nn_overhead_prints_the_cpu_path_with_the_driver_replaced():
    """benchmarks/probes/nn_overhead.py in a process of its own (it replaces driver calls and torch's zero_)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torch")
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-m", "benchmarks.probes.nn_overhead", "--calls", "20", "--batches", "32",
                          "--dtypes", "bf16"], cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("CPU path, driver replaced") and "GEMM call us" in lines[1]
    cells = lines[2].split()
    assert cells[:2] == ["32", "bf16"] and all(float(c) > 0 for c in cells[2:5])
