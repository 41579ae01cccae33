"""``factkernels experiment ...``: run any registered experiment, list the claims, merge shards.

    factkernels experiment list                                   # every claim: where, setting, command, status
    factkernels experiment NAME --out runs/ [--scale tiny|quick|seed] [--shard i/N] [--resume] [--only KEY=VALUE] [--set KEY=VALUE] [--device cuda]
    factkernels experiment merge runs/a runs/b --out runs/all      # cell files of several shards into one folder
    factkernels experiment report runs/ --out CLAIMS.md            # markdown claims table from every summary.json
"""

from __future__ import annotations

import argparse
import json

from . import attention, engine, report, rgr_budget


def _run(args: argparse.Namespace) -> int:
    scale = "quick" if args.quick else args.scale
    result = engine.run(args.experiment, args.out, scale=scale, shard=engine.parse_shard(args.shard),
                        resume=args.resume, threads=args.threads, quiet=args.quiet, only=engine.parse_fields(args.only),
                        overrides=engine.parse_fields(args.set, "--set"), device=args.device)
    print(f"{result.experiment} ({scale}): {result.total} cells, ran {result.ran}, kept {result.kept}, "
          f"missing {result.missing}")
    if result.summary is None:
        print(f"summary waits for the {result.missing} missing cells (other shards, or rerun with --resume)")
        return 0
    print(json.dumps(result.summary.get("claims", {}), indent=2))
    print("wrote " + ", ".join(result.files))
    return 0


def _list(args: argparse.Namespace) -> int:
    rows = report.claim_rows(args.results)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['claim']:<34} {r['paper']} {r['where']:<12} {r['verdict']:<15} {r['statement']}\n"
              f"{'':<34} paper: {r['paper_value']}  ours: {r['ours'] or '-'}\n{'':<34} $ {r['command']}")
    return 0


def _report(args: argparse.Namespace) -> int:
    print(f"wrote {report.write_claims_table(args.results, args.out)}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    print(f"copied {engine.merge(args.sources, args.out)} cell files into {args.out}")
    return 0


def add_commands(experiment_subparsers) -> None:
    """Register ``list``, ``merge`` and one subcommand per registered experiment."""
    ls = experiment_subparsers.add_parser("list", help="every claim: where, setting, command, status")
    ls.add_argument("--results", default="benchmarks/results/experiments",
                    help="folder of experiment outputs (NAME/summary.json) to read status from")
    ls.add_argument("--json", action="store_true", help="print JSON rows")
    ls.set_defaults(handler=_list)
    rp = experiment_subparsers.add_parser("report", help="markdown claims table from every RESULTS/*/summary.json")
    rp.add_argument("results", nargs="+", help="folders of experiment outputs (NAME/summary.json), e.g. quick and seed runs")
    rp.add_argument("--out", required=True, help="markdown file to write, e.g. benchmarks/results/CLAIMS.md")
    rp.set_defaults(handler=_report)
    mg = experiment_subparsers.add_parser("merge", help="copy the cell files of several runs into one folder")
    mg.add_argument("sources", nargs="+")
    mg.add_argument("--out", required=True)
    mg.set_defaults(handler=_merge)
    for name in sorted(engine.REGISTRY):
        experiment = engine.REGISTRY[name]
        p = experiment_subparsers.add_parser(name, help=experiment.help)
        p.add_argument("--out", default="results", help="output folder: OUT/NAME/cells/*.json, summary.json, PNGs")
        p.add_argument("--scale", choices=engine.SCALES, default="seed",
                       help="tiny: seconds (CI); quick: minutes on 2 CPU cores; seed: the paper's grid")
        p.add_argument("--quick", action="store_true", help="same as --scale quick")
        p.add_argument("--shard", default=None, help="i/N: run every N-th cell, starting at the i-th")
        p.add_argument("--only", action="append", metavar="KEY=VALUE",
                       help="run the sub-grid of cells with this config value (repeatable, e.g. --only d=32)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="replace this config field in every cell that has it (repeatable, e.g. --set dim=64: "
                            "the grid at another setting; the cells' keys change with it)")
        p.add_argument("--resume", action="store_true", help="keep finished cells, run the rest")
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: the experiment's)")
        p.add_argument("--quiet", action="store_true", help="no progress bars")
        p.add_argument("--device", default="cpu", help=f"where the cells compute: one of {list(experiment.devices)} "
                       "(e.g. cuda, cuda:1); recorded in each cell, not part of its key")
        p.set_defaults(handler=_run)


def add_tools(subparsers) -> None:
    """Register the top-level commands that live beside the experiments (rgr-train, rgr-search)."""
    attention.add_commands(subparsers)
    rgr_budget.add_commands(subparsers)
