"""Command line: ``factkernels demo | construct | info | rgr-train | experiment NAME``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from . import _ops
from .environment import environment
from .construct import OUTPUTS, FactStorageError, construct
from .embeddings import random_fact_set
from .experiments import cli as experiments_cli
from .solvers import SOLVERS


def _run_construct(args: argparse.Namespace) -> int:
    dtype = torch.float64 if args.float64 else torch.float32
    device = torch.device(args.device)
    keys, values, facts = random_fact_set(args.facts, args.values or args.facts, args.d, seed=args.seed,
                                          tied=args.tied, kappa=args.kappa, dtype=dtype)
    keys, values, facts = keys.to(device), values.to(device), facts.to(device)
    try:
        mlp = construct(keys, values, facts, m=args.m, outputs=args.outputs, solver=args.solver,
                        activation=args.activation, width_multiplier=args.width_multiplier, whiten=args.whiten,
                        seed=args.seed, backend=args.backend, verify=True, progress=not args.quiet)
        report, status = mlp.report, 0
    except FactStorageError as err:
        print(f"error: {err}", file=sys.stderr)
        mlp, report, status = None, err.report, 1
    print(report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        payload = {"config": vars(args), "report": report.to_dict(), "environment": environment()}
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str))
        print(f"wrote {args.json}")
    if args.save and mlp is not None:
        mlp.save(args.save)
        print(f"wrote {args.save}")
    return status


def _add_construct_options(p: argparse.ArgumentParser, *, d: int, facts: int) -> None:
    p.add_argument("--d", type=int, default=d, help="embedding dimension")
    p.add_argument("--facts", type=int, default=facts, help="number of keys F")
    p.add_argument("--values", type=int, default=None, help="number of values |V| (default: F)")
    p.add_argument("--m", type=lambda s: s if s == "bound" else int(s), default=None,
                   help="code dimension (default: smallest that verifies; 'bound' for Thm B.5.3)")
    p.add_argument("--outputs", choices=OUTPUTS, default="margin_optimal")
    p.add_argument("--solver", choices=SOLVERS, default="auto")
    p.add_argument("--activation", default="silu")
    p.add_argument("--width-multiplier", type=float, default=1.5)
    p.add_argument("--whiten", type=float, default=0.0, help="ZCA whitening strength alpha in [0, 1]")
    p.add_argument("--kappa", type=float, default=1.0, help="condition number of anisotropic values")
    p.add_argument("--tied", action="store_true", help="keys = values (needs F = |V|)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--float64", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", choices=_ops.BACKENDS, default="auto")
    p.add_argument("--json", help="write config, report and environment to this JSON file")
    p.add_argument("--save", help="save the MLP to this .safetensors file")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _run_info(args: argparse.Namespace) -> int:
    print(json.dumps(environment(), indent=2))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="factkernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="build and verify a fact MLP on a built-in default (d=64, F=|V|=1024)")
    _add_construct_options(demo, d=64, facts=1024)
    cons = sub.add_parser("construct", help="build and verify a fact MLP on random spherical embeddings")
    _add_construct_options(cons, d=64, facts=1024)
    for p in (demo, cons):
        p.set_defaults(handler=_run_construct)
    sub.add_parser("info", help="print what was compiled").set_defaults(handler=_run_info)
    experiments = sub.add_parser("experiment", help="run a named experiment; writes JSON and PNG")
    experiment_names = experiments.add_subparsers(dest="experiment", required=True)
    experiments_cli.add_commands(experiment_names)
    experiments_cli.add_tools(sub)
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
