"""Export: a stored kernel becomes <name>.cu + <name>.json that compile with plain NVRTC."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from codegen.evaluate import build
from codegen.families.simt import Spec as SimtSpec
from codegen.problem import DType, Problem


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """A store holding two kernels for one problem, built through the store's own API."""
    from store import Store

    monkeypatch.setenv("GEMMSCAPE_CACHE", str(tmp_path / "cache"))
    url = f"sqlite:///{tmp_path / 'e.db'}"
    store = Store(url)
    problem = Problem(67, 45, 91, DType.bf16, bias=True)
    device = store.device({"name": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "nvrtc": "13.0"})
    run = store.start_run(problem, device, "simt", "tpe", 0, 2, "s", {"gemmscape": "test"}, "codegen search ...")
    specs = [SimtSpec(dtype=DType.bf16, bias=True, bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, vec=8,
                      split_k=3, reduce="two_pass"),
             SimtSpec(dtype=DType.bf16, bias=True, bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, vec=8)]
    for i, (spec, ms) in enumerate(zip(specs, (0.010, 0.020), strict=True)):
        built = build(spec, problem, "sm_90")
        store.kernel(built.kernel_record())
        result = {"status": "ok", "evidence": "", "median_ms": ms, "p20_ms": ms, "p80_ms": ms, "times_ms": [ms],
                  "tflops": problem.flops / ms / 1e9, "gbps": 1.0, "rel_error": 1e-3,
                  "baselines": {"cublas": {"median_ms": 0.02, "p20_ms": 0.02, "p80_ms": 0.02}},
                  "ratio": {"cublas": 0.02 / ms}}
        store.add_trial(run, spec.name, "sm_90", problem, device, i, result, spec.to_dict(),
                        source_hash=built.kernel_record()["source_hash"])
    return url, problem, specs


def test_export_best_writes_a_self_contained_pair(stored, tmp_path):
    url, problem, specs = stored
    out = subprocess.run([sys.executable, "-m", "codegen", "export", "--best", "--m", "67", "--n", "45", "--k", "91",
                          "--dtype", "bf16", "--bias", "--db", url, "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    name = specs[0].name  # the faster one
    cu = (tmp_path / "x" / f"{name}.cu").read_text()
    manifest = json.loads((tmp_path / "x" / f"{name}.json").read_text())
    assert 'extern "C" __global__' in cu and "gemmscape" not in manifest["includes"]["note"]
    assert [k["symbol"] for k in manifest["kernels"]] == [name, name + "_reduce"]
    assert [a["name"] for a in manifest["kernels"][0]["args"]] == ["Y", "X", "W", "B", "WS", "M", "N", "K"]
    assert manifest["kernels"][0]["args"][0]["type"] == "__nv_bfloat16*"
    assert manifest["workspace_bytes"] == 4 * 3 * 67 * 45
    assert manifest["kernels"][0]["grid_for_problem"] == [3 * 1, 3, 1]
    assert manifest["measured"]["median_ms"] == pytest.approx(0.010)
    assert manifest["measured"]["device"]["name"] == "NVIDIA H200"
    assert manifest["problem"] == problem.to_dict()
    assert "ceil(M/32)" in manifest["grid_rule"]

    # Plain NVRTC with only what the manifest says (plus where this machine keeps CUDA headers).
    from cuda.bindings import nvrtc

    from codegen.compile import include_dirs

    opts = [o.encode() for o in manifest["compile"]["options"]] + [f"-I{d}".encode() for d in include_dirs()]
    assert manifest["includes"]["headers"] == ["cuda_bf16.h"]
    err, prog = nvrtc.nvrtcCreateProgram(cu.encode(), manifest["source_file"].encode(), 0, [], [])
    (status,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    assert status == nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, size = nvrtc.nvrtcGetCUBINSize(prog)
    cubin = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    for kernel in manifest["kernels"]:
        assert kernel["symbol"].encode() in cubin


def test_export_by_name_and_clear_errors(stored, tmp_path):
    url, _, specs = stored
    ok = subprocess.run([sys.executable, "-m", "codegen", "export", "--kernel", specs[1].name, "--db", url,
                         "--out", str(tmp_path / "y")], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "y" / f"{specs[1].name}.json").is_file()
    missing = subprocess.run([sys.executable, "-m", "codegen", "export", "--kernel", "simt_nope", "--db", url,
                              "--out", str(tmp_path / "z")], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "no kernel named simt_nope" in missing.stderr


def test_results_table_lists_the_best_per_problem(stored):
    url, problem, specs = stored
    out = subprocess.run([sys.executable, "-m", "codegen", "results", "--db", url], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.strip().splitlines()
    assert len(rows) == 2 and problem.key in rows[1] and specs[0].name in rows[1] and "2.000" in rows[1]
    js = subprocess.run([sys.executable, "-m", "codegen", "results", "--db", url, "--json"], capture_output=True,
                        text=True, timeout=120)
    assert json.loads(js.stdout)[0]["kernel"] == specs[0].name


# ---- the measured source is what ships ---------------------------------------------------------------
def _measured(store, spec, problem, source_hash, source=None, ms=0.01, p80=None, device_name="NVIDIA H200"):
    """A kernel measured with ``source_hash``; its text is stored only when ``source`` is given."""
    device = store.device({"name": device_name, "sm": "sm_90", "driver": "580.159.04", "nvrtc": "13.0"})
    record = {"name": spec.name, "family": spec.family, "spec": spec.to_dict(), "arch": "sm_90",
              "source_hash": source_hash}
    if source is not None:
        record["source"] = source
    store.kernel(record)
    result = {"status": "ok", "evidence": "", "median_ms": ms, "p20_ms": ms, "p80_ms": p80 or ms, "times_ms": [ms],
              "tflops": 1.0, "gbps": 1.0, "rel_error": 1e-7, "baselines": {}, "ratio": {}}
    store.add_trial(None, spec.name, "sm_90", problem, device, None, result, spec.to_dict(), source_hash=source_hash)


def test_export_ships_the_stored_source_not_a_new_render(tmp_path):
    from codegen.export import export_kernel
    from codegen.render import render, source_hash
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    problem = Problem(64, 64, 64)
    spec = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4)
    measured = render(spec) + "// as it was when it was measured\n"  # the templates have moved on since
    _measured(store, spec, problem, source_hash(measured), measured)
    for cu, js in (export_kernel(store, spec.name), store.export(spec.name)):
        manifest = json.loads(js)
        assert cu == measured
        assert manifest["source_hash"] == source_hash(measured) and manifest["source_rerendered"] is False
        assert manifest["measured"]["median_ms"] == pytest.approx(0.01) and manifest["family"] == "simt"


def test_export_picks_the_source_of_the_best_measurement(tmp_path):
    from codegen.export import export_kernel
    from codegen.render import render, source_hash
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    problem = Problem(64, 64, 64)
    spec = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4)
    old, new = render(spec) + "// old\n", render(spec) + "// new\n"
    _measured(store, spec, problem, source_hash(old), old, ms=0.02)
    _measured(store, spec, problem, source_hash(new), new, ms=0.01)
    cu, js = export_kernel(store, spec.name)
    assert cu == new and json.loads(js)["measured"]["median_ms"] == pytest.approx(0.01)
    cu, js = export_kernel(store, spec.name, source_hash=source_hash(old))
    assert cu == old and json.loads(js)["source_hash"] == source_hash(old)


def test_export_never_pins_a_measurement_on_other_source(tmp_path):
    from codegen.export import ExportError, export_kernel
    from codegen.render import render, source_hash
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    problem = Problem(64, 64, 64)
    stale = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4)
    _measured(store, stale, problem, "0" * 64)  # measured source not stored, and not today's render
    with pytest.raises(ExportError, match="not of this source"):
        export_kernel(store, stale.name)
    with pytest.raises(ExportError, match="no source is stored"):
        store.export(stale.name)  # the store never renders

    same = SimtSpec(bm=64, bn=64, bk=8, wm=16, wn=32, tm=4, tn=4)  # measured with the hash of today's render
    assert not same.check()
    _measured(store, same, problem, source_hash(render(same)))
    cu, js = export_kernel(store, same.name)
    manifest = json.loads(js)
    assert cu == render(same) and manifest["source_rerendered"] is True and "rendered by this export" in manifest["source_note"]
    assert manifest["source_hash"] == source_hash(cu) and manifest["measured"] is not None


def test_export_of_a_stale_measurement_can_ship_the_render_unmeasured(tmp_path):
    from codegen.export import export_kernel
    from codegen.render import render, source_hash
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    problem = Problem(64, 64, 64)
    stale = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4)
    _measured(store, stale, problem, "0" * 64)
    cu, js = export_kernel(store, stale.name, unmeasured_render=True)
    manifest = json.loads(js)
    assert cu == render(stale) and manifest["source_hash"] == source_hash(cu) and manifest["source_rerendered"]
    assert manifest["measured"] is None  # never pinned on a source it did not measure
    other = manifest["measured_other_source"]
    assert other["source_hash"] == "0" * 64 and other["median_ms"] == pytest.approx(0.01)
    assert other["device"]["name"] == "NVIDIA H200" and "not measured" in other["note"]
    assert other["note"] == (f"measured on NVIDIA H200 with source {'0' * 64}, which is not stored; today's templates "
                             f"render other source ({source_hash(cu)}): this export, which was not measured")
    assert "no longer render the source measured" in manifest["source_note"] and "not measured" in manifest["source_note"]


def test_export_of_a_replayed_kernel_whose_source_today_s_templates_do_not_render_says_so(tmp_path):
    """A replayed kernel (a recording keeps the hash of the source it measured, not the source)
    whose hash is not today's render's: the export is the render, unmeasured, and its label names
    the recording, the hash of the source it measured and today's render's hash."""
    from codegen.export import export_kernel, other_source_note
    from codegen.render import render, source_hash
    from store import Store
    from store.records import recorded_device_name

    recording = recorded_device_name("NVIDIA H200", "2026-11-30T14:10:45Z", "replay-simt-4096x4096x4096-fp32.json")
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    stale = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4)
    _measured(store, stale, Problem(64, 64, 64), "6597" + "0" * 60, device_name=recording)
    cu, js = export_kernel(store, stale.name, unmeasured_render=True)
    manifest = json.loads(js)
    today = source_hash(render(stale))
    assert cu == render(stale) and manifest["source_hash"] == today and manifest["measured"] is None
    other = manifest["measured_other_source"]
    assert other["device"]["recorded"] is True and other["source_hash"] == "6597" + "0" * 60
    assert other["note"] == (f"the recording {recording} measured source {'6597' + '0' * 60} (a recording keeps "
                             f"source hashes, not sources); today's templates render other source ({today}): this "
                             f"export, which was not measured")
    assert other_source_note(other["source_hash"], today, other["device"], short=True) == (
        f"the recording {recording} measured source 659700000000… (a recording keeps source hashes, not sources); "
        f"today's templates render other source ({today[:12]}…): this export, which was not measured")


def test_export_files_says_a_source_was_rendered():
    from codegen.export import export_files
    from codegen.render import render, source_hash

    spec = SimtSpec()
    cu, js = export_files(spec, Problem(64, 64, 64), None, "sm_90")
    manifest = json.loads(js)
    assert cu == render(spec) and manifest["source_rerendered"] is True
    assert manifest["source_hash"] == source_hash(cu) and manifest["measured"] is None


# ---- a stored source must fit today's launch plan ------------------------------------------------------
def _sampled_specs(per_case: int = 12):
    """Valid specs of every family, dtype, layout, bias and W (dense, block-sparse): the seeds, then
    points drawn at random from the family's space."""
    import random

    from codegen import families
    from codegen.problem import Layout
    from codegen.spec import DeviceLimits
    from search.space import seeds, space_for

    rng, limits = random.Random(7), DeviceLimits.for_arch("sm_90")
    for family in families.names():
        layouts = list(Layout) if families.takes_layouts(family) else [Layout.forward]
        for dtype in getattr(families.get(family), "DTYPES", list(DType)):
            for layout in layouts:
                for bias in (False, True):
                    for block in (0, 32):
                        if bias and layout is Layout.grad_input:
                            continue
                        problem = Problem(256, 512, 384, dtype, layout, bias, block,
                                          *((0.25, "ab" * 8) if block else ()))
                        try:
                            space = space_for(family, dtype, block=block, layout=layout)
                        except ValueError:
                            continue
                        names = list(space.dims)
                        points = seeds(family, block) + [{n: rng.choice(space.dims[n]) for n in names}
                                                         for _ in range(20 * per_case)]
                        found = 0
                        for point in points:
                            try:
                                spec = space.spec(point, problem)
                            except (KeyError, ValueError, TypeError):
                                continue
                            if spec.check(problem, limits):
                                continue
                            yield spec, problem
                            found += 1
                            if found == per_case:
                                break


def test_every_template_fits_the_launch_plan_of_its_spec():
    """Today's render of each spec defines every kernel its plan launches, with the plan's argument
    types in order (the check export runs on stored sources)."""
    from codegen.export import check_source, manifest
    from codegen.render import render

    seen = set()
    for spec, problem in _sampled_specs():
        doc = manifest(spec, problem, "sm_90")
        check_source(doc, render(spec))
        seen.add((spec.family, problem.layout, problem.bias, bool(problem.block), len(doc["kernels"])))
    assert {f for f, *_ in seen} >= {"simt", "tensorcore", "hopper"} and len(seen) >= 30


def test_export_refuses_a_stored_source_the_launch_plan_no_longer_fits(tmp_path):
    """A one-split grad_weight with bias once wrote db in a kernel of its own and took the bias as a
    const B; today's plan passes DB to the main kernel and launches no _db. Run with that plan, such
    a source would leave db unwritten: export refuses it and says to measure again."""
    from codegen.export import ExportError, export_kernel
    from codegen.launch import plan
    from codegen.problem import Layout
    from codegen.render import render, source_hash
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    problem = Problem(64, 96, 32, layout=Layout.grad_weight, bias=True)
    spec = SimtSpec(bias=True, layout=Layout.grad_weight, bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4)
    assert not spec.check(problem) and [s.symbol for s in plan(spec, problem).launches] == [spec.name]
    today = render(spec)
    assert "T* __restrict__ DB" in today
    old = today.replace("T* __restrict__ DB", "const T* __restrict__ B")
    _measured(store, spec, problem, source_hash(old), old)
    with pytest.raises(ExportError, match=r"does not fit today's launch plan: .* takes \(float\*, const float\*, "
                                          r"const float\*, const float\*, .*codegen bench --kernel"):
        export_kernel(store, spec.name)

    split = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=2, reduce="two_pass")
    dense = Problem(64, 64, 64)
    whole = render(split)
    cut = whole[:whole.index("// Second pass of split-K")]  # a source without the plan's second pass
    _measured(store, split, dense, source_hash(cut), cut)
    with pytest.raises(ExportError, match=rf"{split.name}_reduce is not defined"):
        export_kernel(store, split.name)
    _measured(store, split, dense, source_hash(whole), whole, ms=0.005)
    assert export_kernel(store, split.name)[0] == whole


def test_the_store_lookup_passes_over_a_stored_source_that_no_longer_fits(tmp_path):
    """codegen.nn asks the store for a problem's fastest kernel: one whose stored source today's plan
    cannot run (an older reduce symbol) is passed over for the next fastest, never run."""
    from codegen.nn.bundle import StoreKernels
    from codegen.render import render, source_hash
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    spec = SimtSpec(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=2, reduce="two_pass")
    problem = Problem(64, 64, 64)
    whole = render(spec)
    old = whole.replace(f"{spec.name}_reduce(", f"{spec.name}_sum(")  # as if the reduce had been named otherwise
    _measured(store, spec, problem, source_hash(old), old, ms=0.004)
    lookup = StoreKernels(store)
    reason = lookup.find(problem, "NVIDIA H200")
    assert isinstance(reason, str) and "none of the 1 fastest kernels" in reason and "_reduce is not defined" in reason
    _measured(store, spec, problem, source_hash(whole), whole, ms=0.005)
    found = lookup.find(problem, "NVIDIA H200")
    assert not isinstance(found, str) and found.source == whole
    assert found.manifest["measured"]["median_ms"] == 0.005


@pytest.mark.parametrize("two_pass_ms, picked", [(0.0042, "two_pass"), (0.0050, "atomic")])
def test_a_tie_within_the_fastest_spread_goes_to_the_plan_that_does_not_zero_its_output(tmp_path, two_pass_ms, picked):
    """Atomic split-K zeroes its output first; alone it may time as fast as the two-pass reduce of the
    same tile and still run slower inside a train step. Within the fastest's 80th percentile the
    lookup takes the plan without the zeroing; beyond it, the fastest."""
    from codegen.nn.bundle import StoreKernels, write_bundle
    from codegen.render import render, source_hash
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    problem = Problem(64, 64, 64)
    tile = dict(bm=64, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=2)
    specs = {"atomic": SimtSpec(**tile, reduce="atomic"), "two_pass": SimtSpec(**tile, reduce="two_pass")}
    for reduce, ms, p80 in (("atomic", 0.0040, 0.0045), ("two_pass", two_pass_ms, two_pass_ms * 1.05)):
        text = render(specs[reduce])
        _measured(store, specs[reduce], problem, source_hash(text), text, ms=ms, p80=p80)
    found = StoreKernels(store).find(problem, "NVIDIA H200")
    assert not isinstance(found, str) and found.manifest["name"] == specs[picked].name
    assert found.manifest["zero_output_first"] is (picked == "atomic")
    index = write_bundle(store, tmp_path / "bundle")
    assert [e["kernel"] for e in index["kernels"]] == [specs[picked].name] and not index["skipped"]


def test_a_bundle_ships_what_its_chooser_picks_and_a_last_split_manifest_names_its_counters(tmp_path):
    """write_bundle(choose=...) ships the chooser's kernel (benchmarks.step_pick picks by the train
    step), not pick_stored's; a split-K summed by its last split carries its tile counters in the manifest."""
    import json

    from codegen.export import export_kernel
    from codegen.nn.bundle import Bundle, pick_stored, write_bundle
    from codegen.render import render, source_hash
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    problem = Problem(64, 64, 64)
    tile = dict(bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=2)
    fast, slow = SimtSpec(**tile, reduce="two_pass"), SimtSpec(**tile, reduce="last")
    for spec, ms in ((fast, 0.004), (slow, 0.006)):
        text = render(spec)
        _measured(store, spec, problem, source_hash(text), text, ms=ms)
    assert write_bundle(store, tmp_path / "default")["kernels"][0]["kernel"] == fast.name

    def choose(st, prob, rows):
        row = next(r for r in rows if r["kernel"] == slow.name)
        return (row, *export_kernel(st, row["kernel"], prob, arch=row["arch"], source_hash=row["source_hash"]))

    index = write_bundle(store, tmp_path / "chosen", choose=choose)
    assert [e["kernel"] for e in index["kernels"]] == [slow.name]
    found = Bundle(tmp_path / "chosen").find(problem, "NVIDIA H200")
    assert found.manifest["name"] == slow.name and found.manifest["counters"] == 2 and len(found.manifest["kernels"]) == 1
    assert "zero it once before the first launch" in found.manifest["counters_note"]
    assert [a["name"] for a in found.manifest["kernels"][0]["args"]][4:6] == ["WS", "CT"]
    assert json.loads(pick_stored(store, problem, store.best(problem, per_problem=4))[2])["name"] == fast.name


def test_step_candidates_are_the_fastest_fitting_sources_and_pinned_files_answer_by_problem(tmp_path):
    """codegen.nn.step.candidates: a problem's fastest stored kernels whose source fits today's plan, fastest
    first, at most the limit (a stale source is passed over); Pinned answers a pinned problem only."""
    from codegen.nn.step import Pinned, candidates
    from codegen.render import render, source_hash
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    problem = Problem(64, 64, 64)
    tile = dict(bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4, split_k=2)
    stale, slow, fast = (SimtSpec(**tile, reduce="two_pass"), SimtSpec(**tile, reduce="last"),
                         SimtSpec(**tile, reduce="atomic"))
    old = render(stale).replace(f"{stale.name}_reduce(", f"{stale.name}_sum(")
    _measured(store, stale, problem, source_hash(old), old, ms=0.003)
    for spec, ms in ((slow, 0.006), (fast, 0.004)):
        _measured(store, spec, problem, source_hash(render(spec)), render(spec), ms=ms)
    got = candidates(store, problem, "NVIDIA H200", 5)
    assert [r["kernel"] for r, _ in got] == [fast.name, slow.name]
    assert [f.manifest["name"] for _, f in got] == [fast.name, slow.name]
    assert [r["kernel"] for r, _ in candidates(store, problem, "NVIDIA H200", 1)] == [fast.name]
    assert candidates(store, problem, "another GPU", 5) == []
    pinned = Pinned({problem.key: got[1][1]})
    assert pinned.find(problem, "NVIDIA H200").manifest["name"] == slow.name
    assert "no kernel pinned" in pinned.find(Problem(64, 64, 32), "NVIDIA H200")


class _ScriptedStep:
    """A stand-in for codegen.nn.step.Step: the step's µs for each choice of kernels come from ``cost``
    (forward, grad_input, grad_weight kernel names -> µs); None means the step cannot run."""

    def __init__(self, problems, cost):
        self.problems, self.cost, self.asked = problems, cost, []

    def times(self, files, reps):
        names = tuple(files[p.key].manifest["name"] for p in self.problems.values())
        self.asked.append(names)
        us = self.cost(*names)
        return ([us] * reps, "ok") if us is not None else ([], "wrong_result: planted")


def test_pick_step_keeps_the_kernel_of_the_fastest_step_one_gemm_at_a_time(tmp_path):
    """codegen.nn.step.pick starts from the store's own pick, tries each GEMM's other candidates with the
    other two GEMMs held, keeps a candidate only where the step gets faster, skips one that cannot
    run, and reports both choices; a GEMM with no stored kernel, or a store pick that cannot run, is a
    ValueError that says so."""
    from codegen.nn.step import pick
    from codegen.problem import linear_problems
    from codegen.render import render, source_hash
    from store import Store

    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    problems = linear_problems(64, 96, 64, DType.fp32, True)
    tiles = {"a": dict(bm=32, bn=64, bk=16, wm=16, wn=32, tm=4, tn=4), "b": dict(bm=32, bn=32, bk=16, wm=16, wn=32,
                                                                                   tm=4, tn=4)}
    names = {}
    for layout, problem in problems.items():
        for tag, ms in (("a", 0.004), ("b", 0.005)):  # "a" is faster alone, so it is the store's pick
            spec = SimtSpec(bias=problem.bias, layout=layout, **tiles[tag])
            _measured(store, spec, problem, source_hash(render(spec)), render(spec), ms=ms)
            names[layout.value, tag] = spec.name
    fwd_b, gi_b, gw_b = (names[lay, "b"] for lay in ("forward", "grad_input", "grad_weight"))

    def cost(fwd, gi, gw):  # in the step "b" is faster for the forward, grad_input's "b" cannot run
        if gi == gi_b:
            return None
        return 100.0 - (5.0 if fwd == fwd_b else 0.0) + (3.0 if gw == gw_b else 0.0)

    step = _ScriptedStep(problems, cost)
    lines = []
    found = pick(store, step, "NVIDIA H200", limit=4, reps=3, rounds=2, progress=lines.append)
    assert {lay.value: r["kernel"] for lay, r in found["chosen"].items()} == {
        "forward": fwd_b, "grad_input": names["grad_input", "a"], "grad_weight": names["grad_weight", "a"]}
    assert {lay.value: r["kernel"] for lay, r in found["store_pick"].items()} == {
        lay: names[lay, "a"] for lay in ("forward", "grad_input", "grad_weight")}
    assert [t["median_us"] for t in found["trials"]] == [100.0, 95.0, None, 98.0]
    assert found["trials"][2]["status"] == "wrong_result: planted" and lines[0] == "store's pick: step 100.0 us"
    assert found["final"]["chosen"]["median_us"] == 95.0 and found["final"]["store_pick"]["median_us"] == 100.0
    assert found["final"]["chosen"]["replays"] == 2 * 3
    with pytest.raises(ValueError, match="do not run the step: wrong_result"):
        pick(store, _ScriptedStep(problems, lambda *names: None), "NVIDIA H200", limit=4, reps=3)
    with pytest.raises(ValueError, match="no stored kernel of .* measured on another GPU"):
        pick(store, step, "another GPU", limit=4, reps=3)
