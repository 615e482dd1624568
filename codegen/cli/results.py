"""``codegen results`` and ``codegen app``: what the store holds, as a table or in the dashboard."""

from __future__ import annotations

import argparse
import json
import sys

from codegen.cli.checks import check_store, open_store, safe_url, store_url
from codegen.cli.errors import EXIT_FAILURE, EXIT_OK, Failure, UsageError
from codegen.cli.options import Commands, add_db_arg, port_number, positive_int


def register(commands: Commands) -> None:
    p = commands.add("results", "the best kernels per problem and device")
    add_db_arg(p)
    p.add_argument("--top", type=positive_int, default=1, help="kernels per problem and device")
    p.add_argument("--json", action="store_true", help="the rows as one JSON list on stdout")
    p.set_defaults(func=cmd_results)

    p = commands.add("app", "the Streamlit dashboard on 127.0.0.1 (database opened read-only)")
    add_db_arg(p)
    p.add_argument("--port", type=port_number, default=8501, help="port on 127.0.0.1")
    p.set_defaults(func=cmd_app)


def cmd_results(args: argparse.Namespace) -> int:
    store = open_store(args.db, read_only=True)
    rows = store.best(per_problem=args.top)
    if args.json:
        print(json.dumps(rows, default=str, indent=1))
        return EXIT_OK if rows else EXIT_FAILURE
    if not rows:
        raise Failure(f"no results in {store.location} yet: run `codegen search` first")
    width = max(30, *(len(str(r["problem"])) for r in rows))  # a block-sparse key is longer
    head = f"{'problem':{width}s} {'kernel':62s} {'median us':>10s} {'TFLOP/s':>8s} {'GB/s':>7s} {'x cuBLAS':>8s}  device"
    print(head)
    for r in rows:
        ratio = f"{r['ratio_cublas']:.3f}" if r.get("ratio_cublas") else "-"
        print(f"{r['problem']:{width}s} {r['kernel']:62s} {r['median_ms'] * 1e3:10.1f} {r['tflops']:8.2f} "
              f"{r['gbps']:7.0f} {ratio:>8s}  {r['device']}")
    if any(r.get("recorded") for r in rows):
        print("(a device named \"... (recorded DATE, FILE)\" holds results replayed from a recording, not measured "
              "live)", file=sys.stderr)
    return EXIT_OK


def cmd_app(args: argparse.Namespace) -> int:
    from app.launch import HOST, port_problem, run
    from store.db import sqlite_path

    url = store_url(args.db)
    path = sqlite_path(url)
    if path is not None and (path.exists() or args.db):  # a missing default store: the dashboard says what to do
        check_store(url, read_only=True)
    reason = port_problem(args.port)  # before the URL is printed and the server starts
    if reason:
        raise UsageError(reason)
    print(f"dashboard on http://{HOST}:{args.port}, reading {safe_url(url)} read-only (Ctrl-C stops it)",
          file=sys.stderr)
    return run(args.db, args.port)
