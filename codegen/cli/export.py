"""``codegen export``: one kernel as <name>.cu and <name>.json, or with ``--bundle`` the best kernel
of every tuned problem and one index (codegen.nn.bundle), all of which run without gemmscape."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from codegen.cli.checks import check_writable, open_store
from codegen.cli.errors import EXIT_OK, Failure, UsageError
from codegen.cli.layer import add_margin_arg
from codegen.cli.options import (
    Commands,
    add_db_arg,
    add_family_arg,
    add_problem_args,
    problem_from_args,
    problem_given,
    sparse_given,
)
from codegen.nn.verdict import MARGIN


def register(commands: Commands) -> None:
    p = commands.add("export", "write <name>.cu and <name>.json that run without gemmscape")
    add_problem_args(p, required=False)
    p.add_argument("--best", action="store_true", help="the fastest stored kernel for the problem")
    p.add_argument("--kernel", metavar="NAME", help="a kernel by name (default: none; give it or --best)")
    add_family_arg(p, "to export (with --best: the fastest of that family)", default="any family")
    p.add_argument("--device", metavar="NAME|ID",
                   help="the device whose measurement counts, by id or name as `codegen results` shows "
                        "(default: the fastest over all devices)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="folder to write into, created if missing (default: none; needed unless --bundle)")
    p.add_argument("--bundle", type=Path, metavar="DIR",
                   help="write the fastest kernel of every tuned problem (per device; with --device, --family: "
                        "of those) and one index.json that codegen.nn loads without the store, with each kernel's "
                        "verdict against cuBLAS (default: none)")
    add_margin_arg(p)
    add_db_arg(p)
    p.set_defaults(func=cmd_export)


def _device_list(store) -> str:
    return "; ".join(f"{d['id']} {d['name']}" for d in store.devices()) or "none"


def _given_device(store, given: str | None) -> dict | None:
    """The store's device named by ``--device`` (an id or a name), None when not given."""
    if not given:
        return None
    device = store.find_device(given)
    if device is None:
        raise UsageError(f"no single device {given!r} in {store.location} (id or name; there: {_device_list(store)})")
    return device


def cmd_export_bundle(args: argparse.Namespace) -> int:
    """``codegen export --bundle DIR``: the best kernel of every tuned problem, with one index."""
    from codegen.nn.bundle import write_bundle

    given = [f for f, v in (("--best", args.best), ("--kernel", args.kernel), ("--out", args.out)) if v]
    given += [f"--{d}" for d in ("m", "n", "k", "sparsity") if getattr(args, d, None) is not None] + sparse_given(args)
    if given:
        raise UsageError(f"--bundle exports every tuned problem; drop {', '.join(given)}")
    check_writable(args.bundle, "--bundle", folder=True)
    store = open_store(args.db, read_only=True)
    device = _given_device(store, args.device)
    index = write_bundle(store, args.bundle, device_id=device["id"] if device else None, family=args.family,
                         margin=args.margin)
    for s in index["skipped"]:
        print(f"skipped {s['problem']} on {s['device']}: {s['reason']}", file=sys.stderr)
    if not index["kernels"]:
        raise Failure(f"no kernel could be exported from {store.location}" +
                      (" (all skipped, see above)" if index["skipped"] else ": nothing tuned yet (`codegen tune-linear`)"))
    devices = sorted({e["device"] for e in index["kernels"]})
    counts = index["verdicts"]
    print(f"wrote {len(index['kernels'])} kernels ({len({e['key'] for e in index['kernels']})} problems, "
          f"{len(devices)} device{'s' if len(devices) != 1 else ''}) and {args.bundle / 'index.json'}")
    print(f"verdicts against cuBLAS (margin {args.margin:g}): ours {counts['ours']}, cuBLAS {counts['cublas']}, "
          f"unknown {counts['unknown']}", file=sys.stderr)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from codegen.export import ExportError, export_kernel, other_source_note, write_export
    from store.records import is_recorded

    if args.bundle is not None:
        return cmd_export_bundle(args)
    if args.margin != MARGIN:
        raise UsageError("--margin judges a bundle's verdicts against cuBLAS: give --bundle DIR")
    if args.out is None:
        raise UsageError("give --out DIR (one kernel) or --bundle DIR (every tuned kernel)")
    if args.best and args.kernel:
        raise UsageError("give --best (the fastest kernel for a problem) or --kernel NAME, not both")
    if not args.best and not args.kernel:
        raise UsageError("give --best with a problem (--m, --n, --k), or --kernel NAME")
    problem = problem_from_args(args) if problem_given(args) else None
    if args.best and problem is None:
        raise UsageError("--best needs the problem: --m, --n, --k (and --dtype, --bias)")
    check_writable(args.out, "--out", folder=True)
    store = open_store(args.db, read_only=True)
    device = _given_device(store, args.device)
    device_id = device["id"] if device else None
    arch = source = None
    name = args.kernel
    if args.best:
        row = store.best_for(problem, device_id=device_id, family=args.family)
        if row is None:
            on = f" on {device['name']}" if device else ""
            of = f" of the {args.family} family" if args.family else ""
            raise Failure(f"no ok kernel{of} stored for {problem.key}{on} in {store.location}")
        name, arch, source, device_id = row["kernel"], row["arch"], row["source_hash"], row["device_id"]
        others = {r["device"] for r in store.best(problem, family=args.family)} - {row["device"]}
        print(f"fastest for {problem.key}: {name}, {row['median_ms'] * 1e3:.1f} us, {row['tflops']:.2f} TFLOP/s "
              f"on {row['device']}" + (" (a recording, replayed; not measured live)" if is_recorded(row["device"]) else "")
              + (f"; the fastest over {len(others) + 1} devices" if others and device is None else ""),
              file=sys.stderr)
    record = store.kernel_record(name)
    if record is not None and args.family and record["family"] != args.family:
        raise UsageError(f"kernel {name} is of the {record['family']} family, not {args.family}")
    try:
        texts = export_kernel(store, name, problem, arch=arch, source_hash=source, device_id=device_id,
                              unmeasured_render=True)
    except ExportError as e:
        raise Failure(str(e)) from None
    doc = json.loads(texts[1])
    other = doc.get("measured_other_source")
    if other:
        note = other_source_note(other["source_hash"], doc["source_hash"], other["device"], short=True)
        print(f"note: {name}: {note} (the manifest's measured_other_source says what was measured)", file=sys.stderr)
    cu, js = write_export(args.out, name, texts)
    print(f"wrote {cu} and {js}")
    return EXIT_OK

