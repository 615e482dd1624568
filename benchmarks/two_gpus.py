"""Searching on two GPUs, measured: one study over both GPUs of a machine, in one process and in two.

Phases, each a real ``codegen search`` (or two), each into a store file of its own (no warm start), and
each writing ``DIR/<phase>.json`` as soon as it has something (a phase cut short leaves what it measured):

- ``kill``: ``--gpus 0,1`` with a budget; once a third of it is stored, the GPU worker process of GPU 1 (named
  ``gemmscape-gpu1`` in the OS: codegen.worker.process_name) gets SIGKILL. Checked from the store: the search
  ended with the budget evaluated, no kernel measured twice, every trial stored before the kill still there;
  the trials each worker measured (the search's ``--json`` ``workers``: which worker, on which GPU, measured
  each kernel) before and after the kill.
- ``throughput``: the same study (same problem, family, sampler, seed and budget) searched with ``--gpus 0``
  and with ``--gpus 0,1``, each into a fresh store; trials per second of each, end to end (evaluated / the
  search's wall time) and steady (between the first and the last stored trial: worker start and baseline
  timing left out), and their ratio (the target for a search that waits on the GPU, not the compiler: 1.7x).
  Compiling is kept out of the way by a warm-up search of the same study first (``--gpus 0,1``, a scratch
  store, not timed): its candidates land in the compile cache (GEMMSCAPE_CACHE), and the sampler (random by
  default: its proposals do not depend on the results) proposes the same kernels to the timed searches. Each
  search's time breakdown (``times_s``: compile wait against GPU time) is kept, so a compile-bound run shows.
- ``pair``: two searches of one study at once, one process per GPU (``CUDA_VISIBLE_DEVICES=0`` and ``=1``),
  sharing one SQLite store file: each kernel stored once, the budget respected, trials per process (one study
  is one seed: both samplers propose the same kernels, and a kernel the other process is measuring is waited
  for and its result reused, so the split need not be even).
- ``report``: benchmarks/results-format JSON (suite ``two-gpus``) from the phases' files.

``--share-gpu`` runs the same phases with both workers (and both processes) on GPU 0, to validate the tool on
one lent GPU: ``--gpus 0,0`` is refused by ``codegen search`` (its ordinals are distinct), so the searches run
through ``shared-search``, which is ``codegen search`` with ``--gpus 0,1`` mapped to two workers on GPU 0 (as
tests/gpu/test_export_and_search.py builds them). The record says ``"mode": "one-gpu-shared"`` and keeps its
throughput ratio apart from a two-GPU speedup.

    python3 -m benchmarks.two_gpus kill|throughput|pair --dir DIR [--share-gpu] [--budget 48] [--shape 8192x8192x8192]
    python3 -m benchmarks.two_gpus report --dir DIR --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PHASES = ("kill", "throughput", "pair")
MODES = {False: "two-gpus", True: "one-gpu-shared"}
#: What a two-GPU search should reach against one GPU, in steady trials per second, when the GPU is the bottleneck.
TARGET_SPEEDUP = 1.7
LOG = "two_gpus.log"
WORKER_PREFIX = "gemmscape-gpu"
#: The --gpus of the two-worker searches (with --share-gpu, mapped onto GPU 0 by shared-search).
TWO = "0,1"


# ---- the searches ------------------------------------------------------------------------------------------------
def search_command(args: argparse.Namespace, db: Path, gpus: str | None) -> list[str]:
    """The command line of one search of the benchmark's study into ``db``, on ``gpus`` (None: the default GPU).
    Two workers with --share-gpu go through ``shared-search``; ``--driver`` names a stand-in for ``codegen``
    (the tests' replay drivers, which take the search's options without the word ``search``)."""
    m, n, k = (int(v) for v in args.shape.split("x"))
    opts = ["--m", str(m), "--n", str(n), "--k", str(k), "--dtype", args.dtype,
            *(["--family", args.family] if args.family else []), *(["--restricted"] if args.restricted else []),
            "--budget", str(args.budget), "--sampler", args.sampler, "--seed", str(args.seed), "--no-warm-start",
            "--db", f"sqlite:///{Path(db).resolve()}", "--quiet", "--json", *(["--gpus", gpus] if gpus else [])]
    if args.share_gpu and gpus and "," in gpus:
        return [sys.executable, "-m", "benchmarks.two_gpus", "shared-search", "--driver", args.driver, "--", *opts]
    head = ["codegen", "search"] if args.driver == "codegen" else [args.driver]
    return [sys.executable, "-m", *head, *opts]


class Search:
    """One search process: its own session (a signal to the benchmark does not reach it), stdout kept for
    the ``--json`` summary, stderr appended to the phase's log under a header."""

    def __init__(self, d: Path, name: str, cmd: list[str], env: dict | None = None) -> None:
        self.name, self.cmd, self.d = name, cmd, d
        self.out = open(d / f"{name}.out", "w")  # noqa: SIM115 - closed in wait()
        self.err = open(d / f"{name}.err", "w")  # noqa: SIM115
        self.started = datetime.now(UTC).isoformat(timespec="seconds")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, **(env or {})), stdout=self.out,
                                     stderr=self.err, text=True, start_new_session=True)
        self.env = env or {}
        self.result: dict | None = None

    def wait(self, timeout: float) -> dict:
        """Wait for the search (SIGTERM at ``timeout``: it stores what it measured and ends its run)."""
        if self.result is not None:
            return self.result
        try:
            self.proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            self.stop()
        return self._settle()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def _settle(self) -> dict:
        self.out.close()
        self.err.close()
        out = (self.d / f"{self.name}.out").read_text()
        err = (self.d / f"{self.name}.err").read_text()
        with (self.d / LOG).open("a") as log:
            env = " ".join(f"{k}={v}" for k, v in self.env.items())
            log.write(f"== {self.name}: {env + ' ' if env else ''}{' '.join(self.cmd)}\n"
                      f"== rc={self.proc.returncode} in {time.monotonic() - self.t0:.1f} s\n{err}\n")
        summary = next((json.loads(line) for line in out.splitlines() if line.startswith("{")), None)
        self.result = {"name": self.name, "command": " ".join(["python3", *self.cmd[1:]]),
                       **({"env": self.env} if self.env else {}), "rc": self.proc.returncode,
                       "started": self.started, "wall_s": round(time.monotonic() - self.t0, 2), "summary": summary,
                       "stderr_tail": err[-2000:]}
        return self.result


def ended(result: dict) -> bool:
    """Whether a search ended by spending the budget. Its exit code is 1 when it found no ok kernel itself,
    which a search of a shared study may: the other measured what it proposed, and it reused the results."""
    summary = result.get("summary") or {}
    return result.get("rc") in (0, 1) and summary.get("stopped") == "budget reached"


# ---- what the store holds ----------------------------------------------------------------------------------------
def stored_trials(db: Path) -> list[dict]:
    """The evaluated trials in the store file ``db`` (invalid points cost no budget and are left out), oldest
    first, as {id, run_id, kernel, status, created}; [] while the store has no tables yet."""
    from store import Store

    if not Path(db).exists():
        return []
    try:
        with Store(f"sqlite:///{Path(db).resolve()}") as s:
            rows = s.trials()
    except Exception:  # tables not made yet, or the file being created
        return []
    keep = ("id", "run_id", "kernel", "status", "created", "evidence")
    return sorted(({k: r.get(k) for k in keep} for r in rows if r["status"] != "invalid"), key=lambda r: r["id"])


def stored_runs(db: Path) -> list[dict]:
    from store import Store

    with Store(f"sqlite:///{Path(db).resolve()}") as s:
        return [{"id": r["id"], "study": r["study_name"], "ended": r["ended"], "trials": r["trials"],
                 "outcome": (s.run_state(r["id"]) or {}).get("outcome")} for r in s.runs()]


def store_checks(trials: list[dict], budget: int) -> dict:
    """Each kernel measured once, and the budget evaluated (not more, not less)."""
    names = [t["kernel"] for t in trials]
    twice = sorted({n for n in names if names.count(n) > 1})
    return {"evaluated": len(names), "distinct_kernels": len(set(names)), "budget": budget,
            "measured_twice": twice, "no_kernel_twice": not twice, "budget_respected": len(names) == budget,
            "statuses": {s: sum(t["status"] == s for t in trials) for s in sorted({t["status"] for t in trials})}}


def by_worker(workers: dict | None, trials: list[dict], after: str | None = None) -> list[dict] | None:
    """The evaluated trials each worker measured (from the search's ``--json`` ``workers``): its GPU and count,
    and with ``after`` (an ISO time) how many of them were stored after it."""
    if not workers:
        return None
    owner = workers.get("kernels") or {}
    rows = []
    for i, gpu in enumerate(workers["gpus"]):
        mine = [t for t in trials if owner.get(t["kernel"]) == i]
        row = {"worker": i, "gpu": gpu, "trials": len(mine)}
        if after is not None:
            row["after_kill"] = sum(_seconds(t["created"]) > _seconds(after) for t in mine)
        rows.append(row)
    return rows


def _seconds(iso: str) -> float:
    """An ISO time as seconds; one without an offset (SQLite keeps none) is UTC, as the store writes it."""
    t = datetime.fromisoformat(iso)
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def rates(trials: list[dict], summary: dict | None) -> dict:
    """Trials per second: ``end_to_end`` (evaluated this run / the search's wall time) and ``steady`` (between
    the first and the last stored trial: n - 1 intervals, worker start and baseline timing left out)."""
    out = {"evaluated": len(trials), "steady_tps": None, "end_to_end_tps": None}
    if len(trials) >= 2:
        span = _seconds(trials[-1]["created"]) - _seconds(trials[0]["created"])
        out["steady_tps"] = round((len(trials) - 1) / span, 4) if span > 0 else None
        out["steady_span_s"] = round(span, 2)
    if summary and summary.get("wall_s"):
        out["end_to_end_tps"] = round(summary["evaluated"] / summary["wall_s"], 4)
        out["wall_s"] = round(summary["wall_s"], 2)
        out["times_s"] = {k: round(v, 2) for k, v in (summary.get("times_s") or {}).items()}
    return out


def verify_kill(before: list[dict], after: list[dict], budget: int) -> dict:
    """What the store says after a search whose worker was killed: nothing stored before the kill lost or
    changed, the budget evaluated, no kernel twice; the trials that failed as worker_crash (the kernel in
    flight on the killed worker)."""
    now = {t["id"]: t for t in after}
    lost = [t for t in before if now.get(t["id"], {}).get("kernel") != t["kernel"]
            or now[t["id"]]["status"] != t["status"]]
    crashed = [{"kernel": t["kernel"], "evidence": (t.get("evidence") or "")[:300]}
               for t in after if t["status"] == "worker_crash"]
    checks = store_checks(after, budget)
    return {**checks, "before_kill": len(before), "lost": [t["kernel"] for t in lost], "nothing_lost": not lost,
            "worker_crash": crashed}


# ---- the worker processes ----------------------------------------------------------------------------------------
def gpu_workers(parent: int) -> list[tuple[int, str]]:
    """The GPU worker processes of the search process ``parent`` as (pid, name), by their OS name
    (``gemmscape-gpu<ordinal>``; the compile processes keep Python's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == parent and name.startswith(WORKER_PREFIX):
            found.append((int(entry.name), name))
    return sorted(found)


def pick_victim(workers: list[tuple[int, str]], share_gpu: bool) -> tuple[int, str] | None:
    """The worker to kill: GPU 1's; with --share-gpu (both on GPU 0) the newer of the two."""
    if share_gpu:
        return workers[-1] if workers else None
    return next((w for w in workers if w[1] == f"{WORKER_PREFIX}1"), None)


# ---- phases ------------------------------------------------------------------------------------------------------
def write_phase(d: Path, name: str, data: dict) -> None:
    tmp = d / f".{name}.json.tmp"
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(d / f"{name}.json")


def _fresh(d: Path, name: str) -> Path:
    db = d / f"{name}.db"
    for p in (db, Path(f"{db}.lock")):
        p.unlink(missing_ok=True)
    return db


def _phase_head(args: argparse.Namespace, name: str) -> dict:
    return {"phase": name, "mode": MODES[args.share_gpu],
            "gpus": "0,0 (two workers on GPU 0)" if args.share_gpu else TWO, "shape": args.shape, "dtype": args.dtype,
            "family": args.family or None, "restricted": args.restricted, "budget": args.budget,
            "sampler": args.sampler, "seed": args.seed, "started": datetime.now(UTC).isoformat(timespec="seconds")}


def cmd_kill(args: argparse.Namespace) -> int:
    d = args.dir
    rec = _phase_head(args, "kill")
    db = _fresh(d, "kill")
    search = Search(d, "kill", search_command(args, db, TWO))
    deadline = time.monotonic() + args.timeout_s
    kill_after = args.kill_after or max(1, args.budget // 3)
    before: list[dict] = []
    try:
        while time.monotonic() < deadline and search.proc.poll() is None and len(stored_trials(db)) < kill_after:
            time.sleep(0.2)
        victim = None
        while search.proc.poll() is None and victim is None and time.monotonic() < deadline:
            victim = pick_victim(gpu_workers(search.proc.pid), args.share_gpu)
            if victim is None:
                time.sleep(0.1)
        if victim is not None:
            before = stored_trials(db)
            os.kill(victim[0], signal.SIGKILL)
            rec["killed"] = {"pid": victim[0], "name": victim[1], "at": datetime.now(UTC).isoformat(),
                             "stored_before": len(before)}
        else:
            rec["killed"] = None
            rec["why_not_killed"] = ("the search ended before a GPU worker was found" if search.proc.poll() is not None
                                     else "no GPU worker process named " + WORKER_PREFIX + "<ordinal> found")
        write_phase(d, "kill", rec)
        result = search.wait(deadline - time.monotonic())
    except KeyboardInterrupt:
        search.stop()
        result = search.wait(5)
        rec["cut_short"] = True
    after = stored_trials(db)
    summary = result.get("summary") or {}
    rec.update(search=result, store=verify_kill(before, after, args.budget),
               summary_evaluated=summary.get("evaluated"),
               by_worker=by_worker(summary.get("workers"), after, rec["killed"]["at"] if rec.get("killed") else None))
    rec["survived"] = bool(rec.get("killed")) and ended(result) and summary.get("evaluated") == args.budget \
        and rec["store"]["budget_respected"] and rec["store"]["no_kernel_twice"] and rec["store"]["nothing_lost"]
    write_phase(d, "kill", rec)
    print(f"kill: {json.dumps({k: rec[k] for k in ('killed', 'survived', 'by_worker')})}")
    return 0 if rec["survived"] else 1


def cmd_throughput(args: argparse.Namespace) -> int:
    d = args.dir
    rec = _phase_head(args, "throughput")
    rec["compile"] = ("warm-up search of the same study first (two workers, scratch store, not timed)"
                      if args.warm else "no warm-up (--no-warm): the timed searches compile their candidates")
    deadline = time.monotonic() + args.timeout_s
    runs = [("warm", TWO)] if args.warm else []
    runs += [("one", "0"), ("two", TWO)]
    search = None
    try:
        for name, gpus in runs:
            db = _fresh(d, f"throughput-{name}")
            search = Search(d, f"throughput-{name}", search_command(args, db, gpus))
            result = search.wait(deadline - time.monotonic())
            trials = stored_trials(db)
            summary = result.get("summary") or {}
            rec[name] = {"gpus": gpus if not (args.share_gpu and "," in gpus) else "0,0 (two workers on GPU 0)",
                         "search": result, "store": store_checks(trials, args.budget), **rates(trials, summary),
                         "by_worker": by_worker(summary.get("workers"), trials)}
            _throughput_ratio(rec, args.share_gpu)
            write_phase(d, "throughput", rec)
    except KeyboardInterrupt:  # the search under way stores what it measured; the runs that ended are kept
        if search is not None:
            search.stop()
            search.wait(5)
        rec["cut_short"] = True
        write_phase(d, "throughput", rec)
        return 130
    print(f"throughput: {json.dumps({k: rec.get(k) for k in ('speedup', 'shared_gpu_ratio')})}")
    return 0 if all(ended(rec[name]["search"]) for name, _ in runs) else 1


def _throughput_ratio(rec: dict, share_gpu: bool) -> None:
    one, two_ = rec.get("one"), rec.get("two")
    if not one or not two_:
        return
    ratio = {k: round(two_[k] / one[k], 3) if two_.get(k) and one.get(k) else None
             for k in ("steady_tps", "end_to_end_tps")}
    if share_gpu:  # two workers on one GPU: how the tool behaves, not what two GPUs give
        rec["shared_gpu_ratio"] = ratio
        rec["note"] = "two workers sharing GPU 0 against one worker: not a two-GPU result"
    else:
        rec["speedup"] = ratio
        rec["target"] = TARGET_SPEEDUP
        rec["target_met"] = ratio["steady_tps"] is not None and ratio["steady_tps"] >= TARGET_SPEEDUP


def cmd_pair(args: argparse.Namespace) -> int:
    d = args.dir
    rec = _phase_head(args, "pair")
    db = _fresh(d, "pair")
    visible = ("0", "0") if args.share_gpu else ("0", "1")
    searches = [Search(d, f"pair-{i}", search_command(args, db, None), {"CUDA_VISIBLE_DEVICES": v})
                for i, v in enumerate(visible)]
    deadline = time.monotonic() + args.timeout_s
    try:
        results = [s.wait(deadline - time.monotonic()) for s in searches]
    except KeyboardInterrupt:
        for s in searches:
            s.stop()
        results = [s.wait(5) for s in searches]
        rec["cut_short"] = True
    trials = stored_trials(db)
    runs = stored_runs(db) if db.exists() else []
    rec.update(searches=results, store=store_checks(trials, args.budget), runs=runs,
               by_process=[{"CUDA_VISIBLE_DEVICES": v, "run_id": r["id"], "trials": sum(t["run_id"] == r["id"]
                                                                                         for t in trials)}
                           for v, r in zip(visible, runs, strict=False)])
    rec["one_study"] = len({r["study"] for r in runs}) == 1
    rec["ok"] = all(ended(r) for r in results) and rec["store"]["budget_respected"] \
        and rec["store"]["no_kernel_twice"] and rec["one_study"]
    write_phase(d, "pair", rec)
    print(f"pair: {json.dumps({k: rec[k] for k in ('ok', 'by_process')})}")
    return 0 if rec["ok"] else 1


# ---- the record ---------------------------------------------------------------------------------------------------
def build_record(phases: dict[str, dict], command: str) -> dict:
    """DESIGN.md's results format from the phases' files: one record per phase, the device and versions from
    the first search summary that has them."""
    from codegen.evaluate import DEFAULT_TIMING
    from codegen.versions import versions

    summaries = [s for p in phases.values() for s in _searches(p) if (s.get("summary") or {}).get("device")]
    device = summaries[0]["summary"]["device"] if summaries else {}
    first = next(iter(phases.values()), {})
    modes = sorted({p.get("mode") for p in phases.values()})
    records = []
    for name in PHASES:
        p = phases.get(name)
        if p is None:
            continue
        settings = ("family", "sampler", "seed", "budget", "restricted")
        rest = {k: v for k, v in p.items() if k not in ("phase", "mode", "gpus", "shape", "dtype", *settings)}
        records.append({"phase": name, "mode": p.get("mode"), "gpus": p.get("gpus"), "problem": _problem(p),
                        "settings": {k: p.get(k) for k in settings}, **rest})
    started = min([p.get("started", "") for p in phases.values()] or [datetime.now(UTC).isoformat()])[:19]
    return {"suite": "two-gpus", "date": started + "Z", "device": device.get("name", "unknown"),
            "mode": modes[0] if len(modes) == 1 else modes,
            "versions": {**versions(), **{k: device[k] for k in ("nvrtc", "driver", "sm") if k in device}},
            "command": command, "timing": {"method": "cold_single", **DEFAULT_TIMING},
            "problem": _problem(first), "records": records}


def _searches(phase: dict) -> list[dict]:
    out = [phase["search"]] if isinstance(phase.get("search"), dict) else []
    out += [phase[k]["search"] for k in ("warm", "one", "two") if isinstance(phase.get(k), dict)]
    return out + list(phase.get("searches") or [])


def _problem(p: dict) -> dict:
    m, n, k = (int(v) for v in str(p.get("shape", "0x0x0")).split("x"))
    return {"m": m, "n": n, "k": k, "dtype": p.get("dtype"), "layout": "forward", "bias": False, "density": 1.0,
            "block": None}


def cmd_report(args: argparse.Namespace) -> int:
    phases = {n: json.loads((args.dir / f"{n}.json").read_text()) for n in PHASES if (args.dir / f"{n}.json").exists()}
    if not phases:
        print(f"two_gpus report: nothing measured in {args.dir}", file=sys.stderr)
        return 1
    doc = build_record(phases, "bash benchmarks/device/two_gpus.sh (python3 -m benchmarks.two_gpus kill, "
                               "throughput, pair, report)")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = doc["date"][:10] + "T" + doc["date"][11:19].replace(":", "") + "Z"
    suffix = "" if doc["mode"] == "two-gpus" else "-one-gpu-shared"
    device = re.sub(r"[^A-Za-z0-9_.-]+", "_", doc["device"]).strip("_")
    path = args.out / f"two-gpus-{device}-{stamp}{suffix}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    for line in summary_lines(doc):
        print(line)
    print(f"wrote {path}")
    return 0


def summary_lines(doc: dict) -> list[str]:
    lines = [f"two-gpus on {doc['device']}, mode {doc['mode']}"]
    for r in doc["records"]:
        if r["phase"] == "kill":
            s = r.get("store", {})
            lines.append(f"kill: killed {r.get('killed')}; survived {r.get('survived')}; evaluated "
                         f"{s.get('evaluated')} of {s.get('budget')}, {s.get('distinct_kernels')} distinct, lost "
                         f"{len(s.get('lost', []))}, worker_crash {len(s.get('worker_crash', []))}; by worker "
                         f"{r.get('by_worker')}")
        elif r["phase"] == "throughput":
            for name in ("one", "two"):
                x = r.get(name) or {}
                lines.append(f"throughput {name} ({x.get('gpus')}): steady {x.get('steady_tps')} trials/s, end to end "
                             f"{x.get('end_to_end_tps')} trials/s, times {x.get('times_s')}")
            if "speedup" in r:
                lines.append(f"speedup (two GPUs / one): {r['speedup']} (target {r['target']}x steady)")
            if "shared_gpu_ratio" in r:
                lines.append(f"ratio {r['shared_gpu_ratio']}: {r['note']}")
        elif r["phase"] == "pair":
            lines.append(f"pair: ok {r.get('ok')}; store {r.get('store')}; by process {r.get('by_process')}")
    return lines


# ---- two workers on GPU 0 -----------------------------------------------------------------------------------------
def cmd_shared_search(args: argparse.Namespace) -> int:
    """``codegen search`` (or the ``--driver`` module's) with ``--gpus A,B,...`` measured by as many workers,
    all on GPU 0."""
    from search import parallel

    real = parallel.gpu_ordinals

    def on_gpu0(spec: str, listing: str | None = None) -> list[int]:
        return [0] * len(real(spec, listing))

    parallel.gpu_ordinals = on_gpu0
    rest = args.rest[1:] if args.rest[:1] == ["--"] else list(args.rest)
    if args.driver == "codegen":
        from codegen.cli import main as cli

        return cli(["search", *rest])
    import importlib

    sys.argv = [args.driver, *rest]
    return importlib.import_module(args.driver).main()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in PHASES:
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, required=True, help="the stores, the phases' JSON and the log")
        p.add_argument("--share-gpu", action="store_true",
                       help="both workers (and both processes) on GPU 0: validates the tool on one GPU")
        p.add_argument("--shape", default="8192x8192x8192", help="MxNxK")
        p.add_argument("--dtype", default="bf16")
        p.add_argument("--family", default="hopper", help="'' for the search's default")
        p.add_argument("--restricted", action="store_true")
        p.add_argument("--budget", type=int, default=48, help="evaluated trials per search")
        p.add_argument("--sampler", default="random", help="random: its proposals do not depend on the results, so "
                                                           "every search of the study proposes the same kernels")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--timeout-s", type=float, default=240.0, help="the phase's limit (searches get SIGTERM)")
        p.add_argument("--driver", default="codegen", help=argparse.SUPPRESS)  # the tests' replay stand-ins
    sub.choices["kill"].add_argument("--kill-after", type=int, default=0,
                                     help="stored trials before the kill (default: a third of the budget)")
    sub.choices["throughput"].add_argument("--no-warm", dest="warm", action="store_false",
                                           help="no warm-up search first")
    rep = sub.add_parser("report")
    rep.add_argument("--dir", type=Path, required=True)
    rep.add_argument("--out", type=Path, default=RESULTS)
    shared = sub.add_parser("shared-search", help="codegen search with --gpus 0,1 as two workers on GPU 0")
    shared.add_argument("--driver", default="codegen")
    shared.add_argument("rest", nargs=argparse.REMAINDER)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if getattr(args, "dir", None) is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    return {"kill": cmd_kill, "throughput": cmd_throughput, "pair": cmd_pair, "report": cmd_report,
            "shared-search": cmd_shared_search}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
