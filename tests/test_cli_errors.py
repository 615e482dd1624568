"""CPU tier: every user mistake is one line on stderr and a non-zero exit, with nothing written.

Each case goes through ``codegen.cli.main`` as the command line would (argparse included) and
checks the exit code (2: usage error, 1: a failure or nothing found), the one line, and that the
database it names is byte for byte unchanged (and that no default store was created).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from codegen import cli, families
from codegen.cli import checks, errors, results

RECORDING = Path(__file__).resolve().parents[1] / "search" / "recordings" / "replay-simt-4096x4096x4096-fp32.json"
BIG = ["--m", "4096", "--n", "4096", "--k", "4096"]
DEVICE = {"name": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "nvrtc": "13.0"}


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    out, err = capsys.readouterr()
    return code, out, err


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def add_ok(store, spec, problem, device: dict, ms: float) -> None:
    """An ok trial of ``spec`` on ``device``, through the store's own API."""
    from codegen.render import render, source_hash

    record = {"name": spec.name, "family": spec.family, "spec": spec.to_dict(), "arch": "sm_90",
              "source": render(spec) + "// as stored\n"}  # today's kernel (export checks it), not a render
    store.kernel(record)

    result = {"status": "ok", "evidence": "", "median_ms": ms, "p20_ms": ms, "p80_ms": ms, "times_ms": [ms],
              "tflops": problem.flops / ms / 1e9, "gbps": 1.0, "rel_error": 1e-7, "baselines": {}, "ratio": {}}
    store.add_trial(None, spec.name, "sm_90", problem, store.device(device), None, result, spec.to_dict(),
                    source_hash=source_hash(record["source"]))


def assert_usage(argv, capsys, *needles, code=2, db_path: Path | None = None, default: Path | None = None):
    before = digest(db_path) if db_path else None
    got, out, err = run(argv, capsys)
    line = one_line(err)
    assert got == code, (got, err)
    for needle in needles:
        assert needle in line, line
    if db_path is not None:
        assert digest(db_path) == before, "the database changed"
    if default is not None:
        assert not default.exists() and not default.parent.exists(), "a default store was created"
    return line


# ---- --db ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["results"], ["export", "--best", *BIG, "--out", "x"],
                                     ["search", *BIG, "--replay", str(RECORDING), "--budget", "3"], ["app"]])
def test_db_given_a_plain_path(command, capsys, tmp_path, db, default_store, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _, path = db
    line = assert_usage([*command, "--db", str(path)], capsys, "is a path, not a database URL",
                        f"sqlite:///{path}", db_path=path, default=default_store)
    assert line.startswith(f"codegen {command[0]}: error: argument --db")


def test_db_given_a_file_that_is_not_a_database(capsys, tmp_path, default_store):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n")
    for command in (["results"], ["search", *BIG, "--replay", str(RECORDING), "--budget", "3", "--quiet"],
                    ["export", "--best", *BIG, "--out", str(tmp_path / "x")]):
        assert_usage([*command, "--db", f"sqlite:///{notes}"], capsys, "is not a SQLite database", db_path=notes,
                     default=default_store)
    assert not (tmp_path / "x").exists()


def test_db_on_an_unreachable_server_says_so_in_one_line_without_the_password(capsys, default_store):
    url = "postgresql+psycopg://gemmscape:s3cret@127.0.0.1:9/nowhere"
    line = assert_usage(["results", "--db", url], capsys, default=default_store)
    assert "s3cret" not in line and ("cannot open the store" in line or "no database driver" in line)


@pytest.mark.parametrize("where", ["under-a-file", "read-only"])
def test_db_in_a_place_that_cannot_be_written(where, capsys, tmp_path, default_store):
    if where == "under-a-file":
        (tmp_path / "plain").write_text("x")
        url, needle = f"sqlite:///{tmp_path / 'plain' / 'g.db'}", "which is a file"
    else:
        url, needle = "sqlite:////proc/gemmscape-test/g.db", "cannot be written"
    assert_usage(["search", *BIG, "--replay", str(RECORDING), "--budget", "3", "--db", url], capsys, needle,
                 default=default_store)


@pytest.mark.parametrize("via", ["--db", "GEMMSCAPE_DB"])
def test_db_in_a_folder_that_does_not_exist_is_refused_and_nothing_is_created(via, capsys, tmp_path, monkeypatch):
    """A store named in a missing folder (a typo, a path meant for another machine) is a usage error
    that says to create the folder; no folder is made for it, whoever runs gemmscape (root too)."""
    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'x.db'}"
    argv = ["search", *BIG, "--replay", str(RECORDING), "--budget", "3", "--quiet"]
    if via == "--db":
        argv += ["--db", url]
    else:
        monkeypatch.setenv("GEMMSCAPE_DB", url)
    line = assert_usage(argv, capsys, f"the folder of the store {tmp_path / 'no' / 'such' / 'dir' / 'x.db'} does "
                        f"not exist: create it first (mkdir -p {tmp_path / 'no' / 'such' / 'dir'})")
    assert line.startswith("codegen search: ") and list(tmp_path.iterdir()) == []


def test_the_default_store_s_folder_is_created(capsys, tmp_path, monkeypatch):
    """With no --db and no GEMMSCAPE_DB the store is ~/.local/share/gemmscape/gemmscape.db, whose
    folder gemmscape creates on first use."""
    monkeypatch.delenv("GEMMSCAPE_DB")
    monkeypatch.setenv("HOME", str(tmp_path))
    code, _, err = run(["search", *BIG, "--replay", str(RECORDING), "--budget", "2", "--quiet"], capsys)
    assert code == 0, err
    assert (tmp_path / ".local" / "share" / "gemmscape" / "gemmscape.db").is_file()


def test_db_read_only_file_is_refused_for_writing(capsys, tmp_path, default_store, monkeypatch):
    path = tmp_path / "ro.db"
    path.write_bytes(b"")
    monkeypatch.setattr(checks.os, "access", lambda p, mode: mode != checks.os.W_OK)  # root can write anything here
    assert_usage(["search", *BIG, "--replay", str(RECORDING), "--db", f"sqlite:///{path}"], capsys, "is read-only",
                 db_path=path, default=default_store)


def test_a_missing_store_is_nothing_found_not_a_new_file(capsys, tmp_path, default_store):
    assert_usage(["results"], capsys, "no gemmscape database", code=1, default=default_store)
    assert_usage(["results", "--db", f"sqlite:///{tmp_path / 'nope.db'}"], capsys, "no gemmscape database", code=1)
    assert not (tmp_path / "nope.db").exists()


def test_gemmscape_db_set_to_a_path_is_a_usage_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMSCAPE_DB", str(tmp_path / "g.db"))
    assert_usage(["results"], capsys, "GEMMSCAPE_DB", "is a path, not a database URL")
    assert not (tmp_path / "g.db").exists()


# ---- --replay --------------------------------------------------------------------------------------
def _replay_file(tmp_path: Path, kind: str) -> tuple[Path, str]:
    path = tmp_path / f"{kind}.json"
    if kind == "missing":
        return path, "no replay file"
    if kind == "folder":
        path.mkdir()
        return path, "is a folder"
    if kind == "unreadable":
        path.write_bytes(b"\xff\xfe\x00garbage")
        return path, "cannot read replay file"
    if kind == "not-json":
        path.write_text("{ this is not json")
        return path, "is not JSON"
    if kind == "wrong-format":
        path.write_text(json.dumps({"format": "something-else/1"}))
        return path, "is not a gemmscape replay file"
    if kind == "a-list":
        path.write_text("[1, 2]")
        return path, "is not a gemmscape replay file"
    doc = json.loads(RECORDING.read_text())
    del doc["results"]
    path.write_text(json.dumps(doc))
    return path, "damaged replay file: results missing"


@pytest.mark.parametrize("kind", ["missing", "folder", "unreadable", "not-json", "wrong-format", "a-list", "damaged"])
def test_a_bad_replay_file(kind, capsys, tmp_path, db, default_store):
    path, needle = _replay_file(tmp_path, kind)
    url, db_path = db
    assert_usage(["search", *BIG, "--replay", str(path), "--budget", "3"], capsys, needle, str(path),
                 default=default_store)
    assert_usage(["search", *BIG, "--replay", str(path), "--budget", "3", "--db", url], capsys, needle,
                 db_path=db_path)


def test_a_replay_of_another_problem_or_family(capsys, db, default_store, toy_family):
    url, path = db
    assert_usage(["search", "--m", "64", "--n", "64", "--k", "64", "--replay", str(RECORDING), "--db", url],
                 capsys, "records 4096x4096x4096", db_path=path)
    assert_usage(["search", *BIG, "--replay", str(RECORDING), "--family", "toy"], capsys,
                 "records the simt family, not toy", default=default_store)


BF16_RECORDING = RECORDING.with_name("replay-tensorcore-large-4096x4096x4096-bf16.json")


@pytest.mark.parametrize("given", [[], BIG, [*BIG, "--dtype", "bf16", "--layout", "forward"]],
                         ids=["nothing", "shape", "all-agreeing"])
def test_a_replay_gives_the_problem_options_left_out(given, capsys, tmp_path):
    """What a new user met: `search --m 4096 --n 4096 --k 4096 --replay <the bf16 recording>` said the
    recording records bf16, not fp32, as though the user had asked for fp32. The recording's problem
    gives every problem option left out; those given agree with it."""
    url = f"sqlite:///{tmp_path / 'g.db'}"
    code, out, err = run(["search", *given, "--replay", str(BF16_RECORDING), "--budget", "2", "--quiet", "--json",
                          "--db", url], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["study"].startswith("gemmscape:4096x4096x4096_bf16_forward:tensorcore-replay:") and doc["evaluated"] == 2


@pytest.mark.parametrize("given,line", [
    (["--dtype", "fp32"], "--dtype fp32 does not match {file}, which records 4096x4096x4096_bf16_forward: leave it out "
                          "(the recording gives it), or replay a recording of your problem"),
    (["--m", "64", "--bias", "--layout", "grad_weight"],
     "--m 64, --layout grad_weight, --bias do not match {file}, which records 4096x4096x4096_bf16_forward: leave them "
     "out (the recording gives them), or replay a recording of your problem"),
])
def test_a_replay_refuses_problem_options_that_contradict_it(given, line, capsys, db):
    url, path = db
    got = assert_usage(["search", *given, "--replay", str(BF16_RECORDING), "--budget", "2", "--db", url], capsys,
                       db_path=path)
    assert got == "codegen search: " + line.format(file=BF16_RECORDING)


def test_tune_linear_takes_the_dtype_of_its_recording(capsys, tmp_path, monkeypatch):
    """tune-linear --replay: the recording gives the dtype (and bias) of the layer's GEMM it measured;
    a --dtype that contradicts it is one line, nothing written."""
    layer = ["tune-linear", "--batch", "4096", "--in", "4096", "--out", "4096", "--replay", str(BF16_RECORDING),
             "--budget", "2", "--quiet"]
    db = tmp_path / "g.db"
    assert_usage([*layer, "--dtype", "fp32", "--db", f"sqlite:///{db}"], capsys,
                 f"--dtype fp32 does not match {BF16_RECORDING}, which records 4096x4096x4096_bf16_forward")
    assert not db.exists()
    code, out, err = run([*layer, "--db", f"sqlite:///{db}"], capsys)
    assert code == 0, err
    assert "layer 4096x4096->4096 bf16:" in err and "4096x4096x4096_bf16_forward" in out.splitlines()[1]


# ---- --out -----------------------------------------------------------------------------------------
def test_export_out_onto_a_file_or_under_one(capsys, tmp_path, db):
    url, path = db
    target = tmp_path / "taken"
    target.write_text("mine\n")
    base = ["export", "--best", "--m", "64", "--n", "64", "--k", "64", "--db", url]
    assert_usage([*base, "--out", str(target)], capsys, "is a file, not a folder", db_path=path)
    assert_usage([*base, "--out", str(target / "sub")], capsys, "which is a file", db_path=path)
    assert target.read_text() == "mine\n"


def test_sweep_out_onto_an_existing_file_or_under_one(capsys, tmp_path, db):
    url, path = db
    target = tmp_path / "taken.json"
    target.write_text("mine\n")
    assert_usage(["sweep", *BIG, "--out", str(target), "--db", url], capsys, "already exists", db_path=path)
    assert_usage(["sweep", *BIG, "--out", str(target / "r.json"), "--db", url], capsys, "which is a file",
                 db_path=path)
    assert target.read_text() == "mine\n"


def test_sweep_names_the_narrowings_it_knows(capsys, tmp_path, db):
    url, path = db
    out = tmp_path / "r.json"
    assert_usage(["sweep", *BIG, "--space", "huge", "--out", str(out), "--db", url], capsys, "skinny", db_path=path)
    assert_usage(["sweep", *BIG, "--family", "tensorcore", "--dtype", "bf16", "--space", "skinny", "--out", str(out),
                  "--db", url], capsys, "restricted, large", db_path=path)
    assert not out.exists()


# ---- options ---------------------------------------------------------------------------------------
def _choice_flags() -> list[tuple[str, str]]:
    out = []
    for family in families.names():
        for f in families.variant_fields(family):
            if f.metadata.get("choices"):
                out.append((family, f"--{f.name.replace('_', '-')}"))
    return out


@pytest.mark.parametrize("family,flag", _choice_flags())
@pytest.mark.parametrize("command", ["compile", "bench"])
def test_every_variant_flag_outside_its_choices(family, flag, command, capsys, default_store):
    problem = [] if command == "compile" else ["--m", "64", "--n", "64", "--k", "64"]
    line = assert_usage([command, *problem, "--family", family, flag, "bogus"], capsys, "invalid choice", "'bogus'",
                        default=default_store)
    assert flag in line and f"codegen {command} --help" in line


@pytest.mark.parametrize("argv,needle", [
    (["export", "--best", "--kernel", "simt_x", "--m", "64", "--n", "64", "--k", "64", "--out", "x"], "not both"),
    (["export", "--out", "x"], "give --best"),
    (["export", "--best", "--out", "x"], "--best needs the problem"),
    (["export", "--best", "--m", "64", "--out", "x"], "--n, --k missing"),
    (["compile", "--m", "64"], "--n, --k missing"),
    (["compile", "--m", "64", "--k", "64"], "--n missing"),
    (["compile", "--bm", "7"], "invalid variant"),
    (["compile", "not_a_kernel"], "not a kernel name"),
])
def test_usage_errors_of_the_commands(argv, needle, capsys, db, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url, path = db
    extra = ["--db", url] if argv[0] == "export" else []
    assert_usage([*argv, *extra], capsys, needle, db_path=path)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("argv,flag", [
    (["search", *BIG, "--replay", str(RECORDING), "--lookahead", "0"], "--lookahead"),
    (["search", *BIG, "--replay", str(RECORDING), "--lookahead", "-2"], "--lookahead"),
    (["search", *BIG, "--replay", str(RECORDING), "--budget", "0"], "--budget"),
    (["results", "--top", "0"], "--top"),
    (["results", "--top", "-1"], "--top"),
    (["search", "--m", "0", "--n", "64", "--k", "64"], "--m"),
    (["bench", *BIG, "--timeout", "0"], "--timeout"),
    (["app", "--port", "70000"], "--port"),
    (["compile", "--arch", "hopper"], "--arch"),
])
def test_numbers_out_of_range(argv, flag, capsys, db, default_store):
    url, path = db
    line = assert_usage([*argv, *(["--db", url] if argv[0] != "compile" else [])], capsys, flag, db_path=path,
                        default=default_store)
    assert "error: argument" in line


@pytest.mark.parametrize("value,needle", [("", "set but empty"), ("   ", "set but empty"),
                                          ("/proc/gemmscape-cache", "cannot be written"), ("FILE", "is a file")])
def test_gemmscape_cache_empty_or_unwritable(value, needle, capsys, tmp_path, monkeypatch, default_store):
    if value == "FILE":
        value = str(tmp_path / "cachefile")
        Path(value).write_text("x")
    monkeypatch.setenv("GEMMSCAPE_CACHE", value)
    line = assert_usage(["compile", "--arch", "sm_90"], capsys, needle, default=default_store)
    assert "GEMMSCAPE_CACHE" in line
    assert_usage(["bench", "--m", "64", "--n", "64", "--k", "64"], capsys, needle, default=default_store)


# ---- --debug and bugs ------------------------------------------------------------------------------
def test_debug_shows_the_traceback_of_a_user_mistake(tmp_path):
    with pytest.raises(errors.Failure, match="no gemmscape database"):
        cli.main(["--debug", "results", "--db", f"sqlite:///{tmp_path / 'nope.db'}"])
    with pytest.raises(errors.UsageError, match="not both"):
        cli.main(["export", "--best", "--kernel", "k", *BIG, "--out", str(tmp_path), "--debug"])


def test_a_bug_keeps_its_traceback(monkeypatch, db):
    url, _ = db

    def broken(args):
        raise KeyError("a bug in gemmscape")

    monkeypatch.setattr(results, "cmd_results", broken)
    with pytest.raises(KeyError, match="a bug in gemmscape"):
        cli.main(["results", "--db", url])
    monkeypatch.setattr(results, "cmd_results", lambda args: int("x"))  # a ValueError of a bug is not a usage error
    with pytest.raises(ValueError, match="invalid literal"):
        cli.main(["results", "--db", url])


def test_a_database_error_mid_command_is_one_line(monkeypatch, capsys, db):
    from sqlalchemy.exc import OperationalError

    url, _ = db

    def locked(args):
        raise OperationalError("SELECT 1", {}, Exception("database is locked"))

    monkeypatch.setattr(results, "cmd_results", locked)
    code, _, err = run(["results", "--db", url], capsys)
    assert code == 1 and one_line(err) == "codegen results: database error: database is locked (--debug shows the traceback)"


# ---- --help, --version -----------------------------------------------------------------------------
def _subparsers(parser):
    import argparse

    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


@pytest.mark.parametrize("family", families.names())
def test_every_option_shows_its_default_in_help(family):
    parser = cli.build_parser(family)
    for name, sub in _subparsers(parser).items():
        formatter = sub._get_formatter()
        for action in sub._actions:
            if not action.option_strings or action.nargs == 0 or action.required or action.help == "==SUPPRESS==":
                continue  # flags (off unless given), required options, --help
            text = formatter._get_help_string(action) or ""
            assert "default" in text, (name, action.option_strings, text)


def test_help_shows_defaults_and_exit_codes(capsys):
    code, out, _ = run(["search", "--help"], capsys)
    assert code == 0 and "--lookahead LOOKAHEAD" in out and "(default: 12)" in out and "$GEMMSCAPE_DB" in out
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and "exit codes: 0" in out and "2 a usage error" in out


def test_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.startswith("gemmscape ") and out.split()[1][0].isdigit()


# ---- --gpus ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpus,needle", [("bogus", "--gpus takes 'all' or ordinals"), ("0,1", "nvidia-smi")])
def test_gpus_that_cannot_be_used_are_one_line(gpus, needle, capsys, db, default_store, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)  # this machine has no NVIDIA driver either way
    url, path = db
    assert_usage(["search", *BIG, "--dtype", "bf16", "--family", "tensorcore", "--gpus", gpus, "--budget", "4",
                  "--db", url], capsys, needle, db_path=path, default=default_store)


NO_DRIVER = "no NVIDIA driver here (nvidia-smi not found)"
NEEDS_GPU = f"{NO_DRIVER}: it needs an NVIDIA GPU and its driver"
SMALL = ["--m", "64", "--n", "64", "--k", "64"]
LAYER_64 = ["--batch", "32", "--in", "64", "--out", "64"]


NO_GPU_CASES = [
    (["bench", *SMALL], "; `codegen compile` renders and compiles a variant without one"),
    (["search", *SMALL, "--budget", "2"],
     "; to search recorded H200 measurements without one use --replay FILE (see README)"),
    (["sweep", *SMALL, "--out", "OUT/r.json"], ""),
    (["tune-linear", *LAYER_64, "--budget", "2", "--quiet"], "; to tune from a recording without one use --replay FILE"),
    (["tune-model", "MODEL", "--batch", "4", "--budget", "2", "--quiet"],
     "; to tune from a recording without one use --replay FILE"),
    (["pick-step", *LAYER_64, "--bundle", "OUT/b"], ""),
]


@pytest.mark.parametrize("argv,then", NO_GPU_CASES, ids=[argv[0] for argv, _ in NO_GPU_CASES])
def test_every_command_that_needs_a_gpu_says_so_in_the_same_line(argv, then, capsys, tmp_path, monkeypatch):
    """No GPU (nvidia-smi REPLACED by one that is not there, so on a GPU machine too): the same line
    from every command that runs kernels on one, what to do without one where there is a way, exit 2,
    nothing written: no store, no recording, no bundle, no worker started. --debug shows NoGpu."""
    if argv[0] == "tune-model":  # it reads the model with torch before it asks for a GPU
        pytest.importorskip("torch", reason="tune-model says first that it needs the torch extra")
    monkeypatch.setattr("codegen.worker.why_no_gpu", lambda: NO_DRIVER)
    monkeypatch.setattr("multiprocessing.get_context", lambda *a: pytest.fail("a worker process was started"))
    (tmp_path / "model.py").write_text("import torch\ndef make():\n    return torch.nn.Linear(8, 8)\n")
    out = tmp_path / "out"
    argv = [str(out) + a[3:] if a.startswith("OUT/") else f"{tmp_path / 'model.py'}:make" if a == "MODEL" else a
            for a in argv]
    db = tmp_path / "db" / "g.db"
    (tmp_path / "db").mkdir()
    line = assert_usage([*argv, "--db", f"sqlite:///{db}"], capsys)
    assert line == f"codegen {argv[0]}: {NEEDS_GPU}{then}"
    assert not db.exists() and not out.exists() and list((tmp_path / "db").iterdir()) == []
    from codegen.worker import NoGpu

    with pytest.raises(NoGpu, match="nvidia-smi not found"):
        cli.main(["--debug", *argv, "--db", f"sqlite:///{db}"])


def test_bench_without_a_gpu_never_loads_the_driver_library(capsys, monkeypatch, tmp_path):
    """What a new user met: bench on a machine without a GPU printed the driver library's own error
    (DynamicLibNotFoundError: "cuda" is an NVIDIA driver library...). No GPU is found before any
    worker starts, as search finds it."""
    monkeypatch.setattr("codegen.worker.why_no_gpu", lambda: NO_DRIVER)
    line = assert_usage(["bench", *SMALL, "--db", f"sqlite:///{tmp_path / 'g.db'}"], capsys)
    assert "DynamicLib" not in line and "GPU worker" not in line and NEEDS_GPU in line


def test_pick_step_when_torch_sees_no_gpu_is_the_same_line(capsys, tmp_path, monkeypatch, gpu_said_present):
    """pick-step times the layer in torch: nvidia-smi lists a GPU but torch sees none (a CPU-only
    build) is said as every missing GPU is, exit 2, and no bundle folder appears."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bundle = tmp_path / "b"
    line = assert_usage(["pick-step", *LAYER_64, "--bundle", str(bundle), "--db", f"sqlite:///{tmp_path / 's.db'}"],
                        capsys, f"torch {torch.__version__} sees no CUDA GPU", ": it needs an NVIDIA GPU and its driver")
    assert line.startswith("codegen pick-step:") and not bundle.exists()


@pytest.mark.parametrize("smi,lib,why", [
    (None, None, "no NVIDIA driver here (nvidia-smi not found)"),
    (None, "libcuda.so.1", None),  # a container with the driver library but not the tool: the worker finds out
])
def test_no_gpu_is_said_from_nvidia_smi_or_the_driver_library(monkeypatch, smi, lib, why):
    import ctypes.util
    import shutil

    from codegen import worker

    monkeypatch.setattr(shutil, "which", lambda name: smi)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: lib if name == "cuda" else None)
    assert worker.why_no_gpu() == why
