"""The Hopper family's block-sparse W on the CPU: spec identity and rules, space and seeds, launch
plans with the block array's tensor map and the BSR arrays, export manifests, the compiler tier
(NVRTC 13 for sm_90a: HGMMA of N = block, two TMA loads, no spills, registers that fit two blocks
per multiprocessor for ctas=2), and models of the two pieces of logic a GPU run cannot easily
pinpoint: the persistent grid's balanced tile ranges and the ring's mbarrier phases."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from codegen import sass, sparse
from codegen.evaluate import PROBE_ALIGNED_K, probe_for
from codegen.export import export_files
from codegen.families import spec_from_name, takes_sparse
from codegen.families.hopper import PRODUCER_REGS, SPARSE_ARGS, Spec, grid_rule, launch_regs, plan
from codegen.launch import LaunchPlan, TensorMapArg
from codegen.problem import DType, Problem
from codegen.render import render
from codegen.spec import DeviceLimits
from search.space import point_of, seeds, space_for, to_spec
from tests.compiled import compile_all


def _problem(m, n, k, block, density=0.1, dtype=DType.bf16, bias=False, seed=0):
    return sparse.problem_for(m, sparse.Pattern.random(n, k, block, density, seed=seed), dtype, bias)


BIG = {b: _problem(4096, 4096, 4096, b) for b in (16, 32, 64)}


def grid() -> list[Spec]:
    return [
        Spec(block=64, bn=64, stages=8, persistent=True),
        Spec(block=64, bn=64, bm=256, stages=5, bias=True),
        Spec(block=32, bn=32, bm=128, consumers=1, stages=4, ctas=2, dtype=DType.fp16),
        Spec(block=32, bn=32, bm=256, stages=12, persistent=True, group_m=16),
        Spec(block=16, bn=16, bm=128, stages=16, persistent=True, bias=True),
        Spec(block=16, bn=16, bm=64, consumers=1, stages=3, dtype=DType.fp16, group_m=1),
        Spec(block=64, bn=64, bm=128, consumers=2, stages=4, ctas=2),
    ]


GRID = grid()


# ---- spec --------------------------------------------------------------------------------------
def test_the_family_takes_sparse_problems_and_dense_names_are_unchanged():
    assert takes_sparse("hopper")
    assert Spec().name == "hp_bf16_nobias_128x256x64_c2_s4_g8"
    assert Spec(persistent=True, prepass="pack").name == "hp_bf16_nobias_128x256x64_c2_s4_g8_ps_pk"
    assert GRID[0].name == "hp_bf16_nobias_128x64x64_c2_s8_g8_ps_bsr64"
    assert GRID[2].name == "hp_fp16_nobias_128x32x32_c1_s4_g8_bsr32_o2"
    assert GRID[4].bk == 16 and GRID[4].row_bytes == 32 and GRID[1].row_bytes == 128


@pytest.mark.parametrize("spec", GRID, ids=lambda s: s.name)
def test_name_and_dict_round_trip(spec):
    assert not spec.check(), spec.check()
    assert Spec.from_name(spec.name) == spec and spec_from_name(spec.name) == spec
    assert Spec.from_dict(spec.to_dict()) == spec


def test_non_canonical_names_are_refused():
    for bad in ("hp_bf16_nobias_128x64x64_c2_s8_g8_bsr64_o1",  # ctas 1 is never spelled
                "hp_bf16_nobias_128x64x32_c2_s8_g8_bsr64",  # the k-tile is the block
                "hp_bf16_nobias_128x64x64_c2_s8_g8_o2_bsr64"):  # suffix order
        with pytest.raises(ValueError, match="hopper kernel name"):
            Spec.from_name(bad)


@pytest.mark.parametrize(
    "fields,reason",
    [
        (dict(block=48, bn=48), "block must be one of (16, 32, 64)"),
        (dict(block=64, bn=128), "bn must equal the block (64)"),
        (dict(block=64, bn=64, prepass="pack"), "prepass must be 'none'"),
        (dict(block=64, bn=64, stages=17), "stages must be 2 to 16"),
        (dict(stages=9, bn=64), "stages must be 2 to 8"),
        (dict(block=64, bn=64, ctas=3), "ctas must be one of (1, 2)"),
        (dict(block=64, bn=64, ctas=2, stages=5), "2 blocks (+1 KiB each) exceed"),
        (dict(block=64, bn=64, bm=256, ctas=2, consumers=2, stages=2), "registers a consumer gets"),
    ],
)
def test_check_names_each_broken_rule(fields, reason):
    why = Spec(**fields).check()
    assert any(reason in r for r in why), why


def test_check_against_sparse_problems():
    spec = Spec(block=64, bn=64)
    assert not spec.check(BIG[64])
    assert any("spec block 64 != problem block 32" in r for r in spec.check(BIG[32]))
    assert any("spec block 0 != problem block 64" in r for r in Spec().check(BIG[64]))
    assert any("spec block 64 != problem block 0" in r for r in spec.check(Problem(64, 64, 64, DType.bf16)))
    # K whose rows break TMA's 16-byte pitch: refused, and there is no pack prepass to fall back on
    (reason,) = spec.check(_problem(67, 200, 91, 64))
    assert "K=91" in reason and "182 bytes" in reason and "no pack prepass" in reason and "tensorcore" in reason
    assert not spec.check(_problem(67, 200, 136, 64))  # N and K not multiples of the block: TMA zero-fills


def test_two_blocks_per_multiprocessor_fit_in_registers_and_shared_memory():
    for consumers in (1, 2):
        spec = Spec(block=64, bn=64, bm=64 * consumers, consumers=consumers, stages=4, ctas=2)
        assert not spec.check(), spec.check()
        start = launch_regs(consumers, 2)
        assert start * spec.threads * 2 <= 65536  # both blocks' registers at launch
        # setmaxnreg only moves registers within the block's own allocation
        assert (PRODUCER_REGS + consumers * spec.consumer_regs) * 128 <= start * spec.threads
        assert 2 * (spec.smem_bytes + 1024) <= DeviceLimits().max_smem + 1024
    assert Spec(block=32, bn=32, consumers=1, ctas=2).consumer_regs == 216


def test_stages_are_aligned_to_the_swizzle_period():
    for spec in GRID:
        assert spec.stage_bytes % 1024 == 0 and spec.stage_bytes - spec.tx_bytes < 1024
        assert spec.tx_bytes == (spec.bm + spec.block) * spec.block * 2
        assert spec.smem_bytes == spec.stages * spec.stage_bytes + 16 * spec.stages + 1024


# ---- space and the odd probe -------------------------------------------------------------------
def test_sparse_space_fixes_bn_to_the_block_and_maps_back():
    space = space_for("hopper", DType.bf16, block=32)
    assert "bn" not in space.dims and space.dims["ctas"] == (1, 2) and max(space.dims["stages"]) == 12
    assert "ctas" not in space_for("hopper", DType.bf16).dims  # the dense space is unchanged
    rng = random.Random(1)
    for point in rng.sample(list(space.points()), 40):
        spec = to_spec("hopper", point, BIG[32])
        assert (spec.block, spec.bn, spec.bk, spec.prepass) == (32, 32, 32, "none")
        assert point_of(spec) == point


@pytest.mark.parametrize("block", (16, 32, 64))
def test_sparse_seeds_are_valid_points_for_every_dtype_and_shape(block):
    found = seeds("hopper", block=block)
    assert len(found) >= 4 and found != seeds("hopper")
    space = space_for("hopper", DType.bf16, block=block)
    for point in found:
        assert space.indices(point) is not None, point
        for dtype in (DType.bf16, DType.fp16):
            for m, n, k in ((4096, 4096, 4096), (32, 4096, 4096), (67, 200, 136)):
                problem = _problem(m, n, k, block, dtype=dtype, bias=True)
                spec = to_spec("hopper", point, problem)
                assert not spec.check(problem), (spec.name, spec.check(problem))


def test_the_odd_probe_of_a_sparse_problem_has_a_16_byte_k_and_an_empty_block_row():
    spec = Spec(block=32, bn=32)
    probe = probe_for(BIG[32], spec)
    assert (probe.m, probe.n, probe.k, probe.block) == (67, 45, PROBE_ALIGNED_K, 32) and not spec.check(probe)
    assert sparse.lookup(probe).row_counts[0] == 0 and probe.k % 32  # a partial last block column
    from codegen.families.tensorcore import Spec as TcSpec

    assert probe_for(BIG[32], TcSpec(bn=32, block=32)).k == 91  # families with a fallback keep the odd K


# ---- launch plans, manifests -----------------------------------------------------------------------
def test_plan_maps_x_and_the_block_array():
    spec = Spec(block=32, bn=32, bm=128, stages=8, persistent=True, bias=True)
    problem = _problem(130, 250, 72, 32, density=0.5, bias=True)
    p = plan(spec, problem)
    (main,) = p.launches
    assert main.args == SPARSE_ARGS == ("Y", "TX", "TW", "B", "RP", "CI", "M", "N", "K")
    assert main.grid == (2 * 8, 1, 1) and main.persistent and main.smem == spec.smem_bytes
    tx, tw = p.tensor_maps
    assert tx == TensorMapArg("TX", "X", "bf16", dims=(72, 130), pitch=144, box=(32, 128), swizzle=64)
    # every block W could keep: 8 block rows x 3 block columns, 32 rows each
    assert tw == TensorMapArg("TW", "W", "bf16", dims=(32, 8 * 3 * 32), pitch=64, box=(32, 32), swizzle=64)
    assert not tx.problems() and not tw.problems() and p.workspace_bytes == 0
    assert LaunchPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    for block, swizzle in ((16, 32), (64, 128)):
        maps = plan(Spec(block=block, bn=block), BIG[block]).tensor_maps
        assert {t.swizzle for t in maps} == {swizzle} and not any(t.problems() for t in maps)


def test_a_512_row_tile_loads_x_as_two_boxes_of_256_rows():
    spec = Spec(block=64, bn=64, bm=512, stages=3, persistent=True, grouped=True, group_m=1)
    assert not spec.check(BIG[64]) and spec.x_box_rows == 256 and spec.acc_regs == 128
    tx, _ = plan(spec, BIG[64]).tensor_maps
    assert tx.box == (64, 256) and not tx.problems()
    src = render(spec)
    assert "X_BOX_ROWS = 256" in src and "m0 + X_BOX_ROWS" in src
    assert "box (64, 256)" in grid_rule(spec)
    assert "X_BOX_ROWS" not in render(Spec(block=64, bn=64, bm=256, stages=4))
    # two boxes only for a block-sparse W's X tiles of 512 rows, in shared memory that fits
    for bad, why in ((dict(bm=512, bn=128, stages=3), "bm 512 > 256"),
                     (dict(block=64, bn=64, bm=384, stages=3), "bm 384 > 256"),
                     (dict(block=64, bn=64, bm=512, stages=4), "shared memory"),
                     (dict(block=64, bn=64, bm=512, consumers=1, stages=3), "accumulators per consumer thread")):
        assert any(why in w for w in Spec(**bad).check()), (bad, Spec(**bad).check())


def test_manifest_describes_both_tensor_maps_and_the_bsr_arrays():
    problem = _problem(67, 200, 136, 64, density=0.5, bias=True)
    spec = Spec(block=64, bn=64, bias=True, persistent=True, stages=6)
    cu, js = export_files(spec, problem, None, "sm_90")
    manifest = json.loads(js)
    (main,) = manifest["kernels"]
    assert [a["name"] for a in main["args"]] == list(SPARSE_ARGS)
    types = {a["name"]: a["type"] for a in main["args"]}
    assert types["RP"] == types["CI"] == "const int*" and types["TW"] == "const __grid_constant__ CUtensorMap"
    tw = main["args"][2]["tensor_map"]
    assert tw["operand"] == "W" and tw["global_dim"] == [64, 4 * 3 * 64] and tw["box_dim"] == [64, 64]
    assert tw["global_strides_bytes"] == [128] and tw["swizzle"] == "CU_TENSOR_MAP_SWIZZLE_128B"
    assert manifest["sparse"]["block"] == 64 and manifest["sparse"]["pattern"] == problem.pattern
    assert "RP[ceil(N/64)+1]" in manifest["sparse"]["arguments"]
    rule = manifest["grid_rule"]
    assert "block array W with dims (64, ceil(N/64)*ceil(K/64)*64)" in rule and "CI[nnzb]" in rule
    assert "const int* __restrict__ RP, const int* __restrict__ CI" in cu
    small = json.loads(export_files(Spec(block=16, bn=16, ctas=2, stages=4, consumers=1),
                                    _problem(64, 64, 64, 16), None, "sm_90")[1])
    assert "2 blocks share a multiprocessor" in small["grid_rule"] and "32-byte swizzle" in small["grid_rule"]


def test_rendered_source_spells_the_swizzle_of_the_block():
    for block, mode, sbo in ((64, 1, 1024), (32, 2, 512), (16, 3, 256)):
        src = render(Spec(block=block, bn=block))
        assert f"({mode}ull << 62)" in src and f"({sbo} >> 4) << 32" in src, block
        assert f"m64n{block}k16" in src and "RP + n0 / BN" in src and "Balanced" not in src
    assert "struct Balanced" in render(Spec(block=64, bn=64, persistent=True))
    assert "__launch_bounds__(THREADS, 2)" in render(Spec(block=64, bn=64, ctas=2, stages=4))
    assert "RP" not in render(Spec()) and "(1ull << 62)" in render(Spec())


# ---- compiler tier ---------------------------------------------------------------------------------
def _sample() -> list[Spec]:
    specs = list(GRID)
    for block in (16, 32, 64):
        for dtype in (DType.bf16, DType.fp16):
            problem = _problem(4096, 4096, 4096, block, dtype=dtype, bias=dtype is DType.fp16)
            specs += [to_spec("hopper", p, problem) for p in seeds("hopper", block=block)]
    specs += [Spec(block=64, bn=64, bm=128, ctas=2, persistent=True, grouped=True),
              Spec(block=16, bn=16, bm=64, consumers=1, stages=8, persistent=True, grouped=True, dtype=DType.fp16)]
    return [s for s in {s.name: s for s in specs}.values() if not s.check()]


SAMPLE = _sample()


@pytest.fixture(scope="module")
def compiled():
    return {name: built for (name, _), built in compile_all(SAMPLE).items()}


def test_sample_is_broad():
    assert len(SAMPLE) >= 30
    assert {s.block for s in SAMPLE} == {16, 32, 64} and {s.ctas for s in SAMPLE} == {1, 2}
    assert {s.persistent for s in SAMPLE} == {False, True} and {s.consumers for s in SAMPLE} == {1, 2}


@pytest.mark.timeout(900)
def test_every_sampled_sparse_spec_compiles_to_wgmma_fed_by_tma(compiled):
    for spec in SAMPLE:
        result, text = compiled[spec.name]
        assert "-arch=sm_90a" in result.options
        ops = sass.opcodes(text, spec.name)
        steps = spec.block // 16 * spec.frag_m
        shape = f"HGMMA.64x{spec.wg_n}x16.F32" + (".BF16" if spec.dtype is DType.bf16 else " ")  # wg_n: the block, or X's rows with swap
        assert ops["HGMMA"] == steps and sass.functions(text)[spec.name].count(shape) == steps, spec.name
        assert ops["UTMALDG"] == 2 + (spec.bm > spec.x_box_rows) and ops["USETMAXREG"] == 2, spec.name  # X: 1-2 boxes
        assert ops["LDL"] == 0 and ops["STL"] == 0, spec.name
        report = result.report[spec.name]
        assert report["spill_stores"] == report["spill_loads"] == report["stack"] == 0, (spec.name, report)
        need = (PRODUCER_REGS + spec.consumers * spec.consumer_regs) * 128
        assert need <= report["registers"] * spec.threads, (spec.name, report)
        assert report["registers"] * spec.threads * spec.ctas <= 65536, (spec.name, report)
        assert "serializ" not in result.log.lower() and "C7508" not in result.log and "warning" not in result.log


# ---- a model of the persistent grid's balanced ranges (templates/hopper.cu.j2, struct Balanced) ------
def balanced_tiles(indptr: np.ndarray, m_tiles: int, block: int, grid: int) -> list[tuple[int, int]]:
    """(block row, m-tile) pairs block ``block`` of ``grid`` takes, computed as the template does."""
    rows = len(indptr) - 1
    start = lambda r: m_tiles * (int(indptr[r]) + r)  # noqa: E731
    weight = lambda r: int(indptr[r + 1]) - int(indptr[r]) + 1  # noqa: E731
    total = m_tiles * (int(indptr[rows]) + rows)
    lo, hi = total * block // grid, total * (block + 1) // grid
    a, b = 0, rows - 1
    while a < b:
        mid = (a + b + 1) // 2
        if start(mid) <= lo:
            a = mid
        else:
            b = mid - 1
    r = a
    t = (lo - start(r) + weight(r) - 1) // weight(r)
    if t >= m_tiles:
        r, t = r + 1, 0
    out = []
    while r < rows and start(r) + t * weight(r) < hi:
        out.append((r, t))
        t += 1
        if t == m_tiles:
            r, t = r + 1, 0
    return out


def _counts_cases():
    rng = np.random.default_rng(5)
    yield rng.binomial(64, 0.1, 64), 32, 132  # 4096^3, block 64, density 0.1, bm 128
    yield rng.binomial(256, 0.05, 256), 16, 132
    yield np.array([64] + [0] * 63), 32, 132  # one full row, every other row empty
    yield np.array([0, 0, 5, 0]), 1, 4  # fewer tiles than... one tile per block
    yield np.array([3]), 1, 1
    yield np.array([0] * 10), 3, 7  # an all-zero W: every tile still written
    for _ in range(30):
        rows = int(rng.integers(1, 40))
        yield rng.integers(0, 9, rows) * (rng.random(rows) < 0.7), int(rng.integers(1, 9)), int(rng.integers(1, 140))


@pytest.mark.parametrize("case", range(36))
def test_balanced_ranges_cover_every_tile_once_with_equal_work(case):
    counts, m_tiles, sms = list(_counts_cases())[case]
    indptr = np.concatenate([[0], np.cumsum(counts)])
    tiles = len(counts) * m_tiles
    grid = min(tiles, sms)  # the launcher's persistent grid
    taken = [balanced_tiles(indptr, m_tiles, b, grid) for b in range(grid)]
    flat = [t for ts in taken for t in ts]
    assert sorted(flat) == [(r, t) for r in range(len(counts)) for t in range(m_tiles)]  # each once
    work = [sum(counts[r] + 1 for r, _ in ts) for ts in taken]
    mean = sum(work) / grid
    assert max(work) <= mean + max(counts) + 1, (max(work), mean)
    for ts in taken:  # contiguous: row by row, m-tiles in order
        assert all((r2, t2) > (r1, t1) for (r1, t1), (r2, t2) in zip(ts, ts[1:], strict=False))


def test_balanced_ranges_beat_striding_on_a_random_pattern():
    rng = np.random.default_rng(0)
    counts = rng.binomial(64, 0.1, 64)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    m_tiles, grid = 32, 132
    balanced = max(sum(counts[r] + 1 for r, _ in balanced_tiles(indptr, m_tiles, b, grid)) for b in range(grid))
    order = [(r, t) for r in range(64) for t in range(m_tiles)]
    strided = max(sum(counts[r] + 1 for r, _ in order[b::grid]) for b in range(grid))
    assert balanced < strided


# ---- a model of the ring's mbarrier phases (templates/hopper.cu.j2, producer and consumers) ---------
class Barrier:
    """An mbarrier: a phase completes after ``count`` arrivals; try_wait.parity(p) succeeds once the
    phase of parity p has completed, i.e. while the current phase's parity is not p."""

    def __init__(self, count: int) -> None:
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self) -> None:
        self.pending -= 1
        assert self.pending >= 0
        if self.pending == 0:
            self.phase, self.pending = self.phase + 1, self.count

    def ready(self, parity: int) -> bool:
        return self.phase % 2 != parity


def _producer(counts, stages, full, empty, ring, landing):
    stage, phase = 0, 0
    for tile, count in enumerate(counts):
        for kt in range(count):
            while not empty[stage].ready(phase ^ 1):
                yield
            assert ring[stage]["readers"] == 0, "TMA overwrites a stage a wgmma still reads"
            ring[stage]["data"] = (tile, kt)
            landing.append(stage)  # the copy engine completes it later (the scheduler decides when)
            stage += 1
            if stage == stages:
                stage, phase = 0, phase ^ 1
            yield


def _consumer(counts, stages, full, empty, ring, seen, warps=4):
    stage, phase = 0, 0
    for tile, count in enumerate(counts):
        used, inflight = 0, []
        for kt in range(count):
            while not full[stage].ready(phase):
                yield
            assert ring[stage]["data"] == (tile, kt)
            ring[stage]["readers"] += 1  # the wgmma of this k-tile read the stage until their wait
            inflight.append(stage)
            yield
            if len(inflight) > 1:  # wgmma_wait<1>: the previous k-tile's group is done
                ring[inflight.pop(0)]["readers"] -= 1
            if kt > 0:
                for _ in range(warps):
                    empty[used].arrive()
            used = stage
            stage += 1
            if stage == stages:
                stage, phase = 0, phase ^ 1
        if count:  # wgmma_wait<0>, then the last stage goes back
            ring[inflight.pop(0)]["readers"] -= 1
            for _ in range(warps):
                empty[used].arrive()
        seen.append((tile, count))
        yield


@pytest.mark.parametrize("seed", range(25))
def test_the_ring_never_overwrites_a_stage_in_use_nor_deadlocks(seed):
    rng = random.Random(seed)
    stages, consumers = rng.choice((2, 3, 4, 8, 16)), rng.choice((1, 2))
    counts = [rng.choice((0, 0, 1, 2, 3, 7, 20)) for _ in range(rng.randint(1, 12))]
    full = [Barrier(1) for _ in range(stages)]
    empty = [Barrier(consumers * 4) for _ in range(stages)]
    ring = [{"data": None, "readers": 0} for _ in range(stages)]
    landing: list[int] = []
    seen = [[] for _ in range(consumers)]
    agents = [_producer(counts, stages, full, empty, ring, landing)]
    agents += [_consumer(counts, stages, full, empty, ring, seen[c]) for c in range(consumers)]
    live = list(agents)
    for _step in range(200000):
        if not live and not landing:
            break
        if landing and rng.random() < 0.3:
            full[landing.pop(0)].arrive()  # bytes complete in issue order or later; in order is enough here
            continue
        agent = rng.choice(live) if live else None
        if agent is None:
            continue
        try:
            next(agent)
        except StopIteration:
            live.remove(agent)
    else:
        pytest.fail(f"deadlock: counts {counts}, stages {stages}, consumers {consumers}")
    assert all(s == list(enumerate(counts)) for s in seen)
    assert all(r["readers"] == 0 for r in ring) and not landing


def test_the_models_match_the_template():
    """The two models above spell the template's logic; if the template changes, so must they."""
    src = render(Spec(block=64, bn=64, persistent=True))
    for line in ("hi = total * (blockIdx.x + 1) / gridDim.x;", "t = (int)((lo - start(r) + w - 1) / w);",
                 "if (start(mid) <= lo) a = mid;", "return (long long)m_tiles * (__ldg(rp + row) + row);",
                 "if (kt > k_begin && lane == 0) bar_arrive(empty + 8 * used);", "wgmma_wait<1>();",
                 "bar_wait(empty + 8 * stage, phase ^ 1);", "bar_wait(full + 8 * stage, phase);"):
        assert line in src, line
    assert re.search(r"if \(k_end == k_begin\) \{[^}]+continue;\s+\}\s+wgmma_wait<0>\(\);", src)


def test_a_persistent_grid_of_two_blocks_per_multiprocessor():
    """ctas=2 with persistent: the launcher starts up to two blocks per multiprocessor, each taking its
    balanced range; the manifest and the grid rule say so, and one-block grids read as before."""
    from codegen.launch import launched_grid

    spec = Spec(block=64, bn=64, bm=128, consumers=1, stages=4, ctas=2, persistent=True)
    problem = BIG[64]
    assert not spec.check(problem) and spec.name.endswith("_ps_bsr64_o2")
    p = plan(spec, problem)
    (main,) = p.launches
    assert main.persistent == 2 and main.grid_on(132) == (264, 1, 1)
    # as the worker process gets it: still two blocks per multiprocessor (a flag once read it back as one)
    (sent,) = LaunchPlan.from_dict(json.loads(json.dumps(p.to_dict()))).launches
    assert sent.persistent == 2 and sent.persistent is not True and sent.grid_on(132) == (264, 1, 1)
    assert plan(Spec(block=64, bn=64, persistent=True), problem).launches[0].grid_on(132) == (132, 1, 1)
    assert launched_grid((100, 1, 1), 2, (1, 1, 1), 132) == (100, 1, 1)  # never more blocks than tiles
    manifest = json.loads(export_files(spec, problem, None, "sm_90")[1])
    assert manifest["kernels"][0]["persistent"] == 2 and "2 x multiprocessor count" in manifest["kernels"][0]["grid_note"]
    assert "min(ceil(M/128) * ceil(N/64), 2 x multiprocessor count)" in manifest["grid_rule"]
    one = json.loads(export_files(Spec(block=64, bn=64, persistent=True), problem, None, "sm_90")[1])
    assert one["kernels"][0]["persistent"] is True and "min(grid_for_problem[0], multiprocessor" in \
        one["kernels"][0]["grid_note"]


def test_a_grouped_persistent_grid_strides_over_tiles_in_group_order():
    spec = Spec(block=64, bn=64, bm=128, ctas=2, persistent=True, grouped=True)
    assert spec.name == "hp_bf16_nobias_128x64x64_c2_s4_g8_psg_bsr64_o2" and Spec.from_name(spec.name) == spec
    source = render(spec)
    assert "struct Balanced" not in source and "block_origin(tile, M, N, BM, BN, GROUP_M, m0, n0);" in source
    assert "struct Balanced" in render(Spec(block=64, bn=64, bm=128, ctas=2, persistent=True))
    assert plan(spec, BIG[64]).launches[0].grid_on(132) == (264, 1, 1)
    for bad in (Spec(grouped=True), Spec(block=64, bn=64, grouped=True)):
        assert any("needs block > 0 and persistent" in r for r in bad.check())
