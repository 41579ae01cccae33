"""Command line: ``factkernels demo | construct | info | insert | capacity | rgr-train | rgr-search | experiment NAME|list|report|merge``.

Every command is registered here; experiments and the library expose plain functions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

import torch

from . import _ops
from .environment import environment
from .construct import OUTPUTS, FactStorageError, construct
from .capacity import methods as cost_methods
from .embeddings import FAMILIES, load_facts, load_matrix, random_fact_set
from .attention.key_budget import t_interval
from .attention.train_heads import OBJECTIVES, TrainingConfig, train_runs
from .experiments import claims, cost_cells, engine, real_lm_editing, rgr_cells, rgr_search
from .solvers import SOLVERS


class CommandLineError(Exception):
    """Input a command cannot use (a file, an entry in it, an option value): :func:`main` prints the message
    as one line and exits with status 2, without a traceback."""


@contextlib.contextmanager
def _reading_input():
    """Errors raised while reading the user's input become :class:`CommandLineError` (their messages name the
    file and the bad entry); errors after it (a bug, a failed run) keep their traceback."""
    try:
        yield
    except (ValueError, TypeError, OSError) as err:
        raise CommandLineError(str(err)) from None


def _int_list(text: str) -> list[int]:
    """``--seeds 0,1,2``-style option values."""
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _int_pairs(text: str) -> list[tuple[int, int]]:
    """``--pairs 64:16,128:32`` -> [(64, 16), (128, 32)]."""
    try:
        pairs = [tuple(int(x) for x in pair.split(":")) for pair in text.split(",") if pair]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected m:d_model pairs separated by commas, got {text!r}")
    return pairs


def _count_or_path(text: str):
    """``--facts`` / ``--values``: a count (random embeddings) or a file (the user's own)."""
    return int(text) if text.isdigit() else Path(text)


def _fact_set(args: argparse.Namespace, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The user's files when --keys is given, else a seeded random spherical fact set."""
    if args.keys is not None:
        if not isinstance(args.values, Path) or not isinstance(args.facts, Path):
            raise ValueError("--keys needs --values and --facts as files (values: .safetensors/.npy/.pt, "
                             "facts: .npy/.csv)")
        keys, values = load_matrix(args.keys, "keys"), load_matrix(args.values, "values")
        if keys.shape[1] != values.shape[1]:
            raise ValueError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} need the same dimension")
        facts = load_facts(args.facts, values.shape[0])
        if facts.shape[0] != keys.shape[0]:
            raise ValueError(f"facts has {facts.shape[0]} entries but keys has {keys.shape[0]} rows")
        return keys.to(dtype), values.to(dtype), facts
    if isinstance(args.facts, Path) or isinstance(args.values, Path):
        raise ValueError("--facts/--values given as files need --keys too")
    return random_fact_set(args.facts, args.values or args.facts, args.d, seed=args.seed, tied=args.tied,
                           kappa=args.kappa, dtype=dtype)


def _run_construct_distributed(args: argparse.Namespace) -> int:
    """One rank of ``torchrun ... -m factkernels construct --distributed``: this rank's rows of the facts."""
    import torch.distributed as dist

    from .distributed import construct_sharded, shard_rows

    if args.solver not in ("auto", "cg"):
        raise SystemExit("error: --distributed builds with the matrix-free solver: use --solver cg")
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        dtype = torch.float64 if args.float64 else torch.float32
        keys, values, facts = _fact_set(args, dtype)
        rows = shard_rows(keys.shape[0], rank, world_size)
        mlp = construct_sharded(keys[rows].to(device), values.to(device), facts[rows].to(device), m=args.m,
                                outputs=args.outputs, activation=args.activation,
                                width_multiplier=args.width_multiplier, seed=args.seed, backend=args.backend,
                                verify="report", progress=not args.quiet and rank == 0)
        report = mlp.report  # construct's schema: accuracy, failed, min margin, timings, world_size
        if rank == 0:
            print(report)
            if args.json:
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                payload = {"config": vars(args), "report": report.to_dict(), "environment": environment()}
                Path(args.json).write_text(json.dumps(payload, indent=2, default=str))
                print(f"wrote {args.json}")
            if args.save:
                mlp.save(args.save)
        return 0 if report.failed == 0 else 1
    finally:
        dist.destroy_process_group()


def _run_construct(args: argparse.Namespace) -> int:
    if args.distributed:
        return _run_construct_distributed(args)
    dtype = torch.float64 if args.float64 else torch.float32
    device = torch.device(args.device)
    with _reading_input():
        keys, values, facts = _fact_set(args, dtype)
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
    # --dim: torchrun rejects --d anywhere on its command line (ambiguous with its --duplicate-* options)
    p.add_argument("--dim", "--d", dest="d", type=int, default=d, help="embedding dimension, random embeddings (alias --d)")
    p.add_argument("--facts", type=_count_or_path, default=facts,
                   help="number of keys F (random embeddings), or with --keys the map f as .npy/.csv")
    p.add_argument("--values", type=_count_or_path, default=None,
                   help="number of values |V| (default: F), or with --keys a .safetensors/.npy/.pt matrix")
    p.add_argument("--keys", type=Path, default=None,
                   help="your keys K (F, d) as .safetensors (one tensor), .npy or .pt; needs --values, --facts files")
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
    p.add_argument("--distributed", action="store_true",
                   help="one rank of a torchrun launch: facts sharded by rows, matrix-free CG (see README)")


def _run_info(args: argparse.Namespace) -> int:
    print(json.dumps(environment(), indent=2))
    return 0


def _run_insert(args: argparse.Namespace) -> int:
    from .hf import evaluate, insert_facts, load, parse_requests  # transformers only when asked for

    with _reading_input():
        requests = parse_requests(args.requests)
    print(f"loading {args.model}", flush=True)
    model, tok = load(args.model)
    ins = insert_facts(model, tok, requests, layer=args.layer, position=args.position, gate=args.gate,
                       seed=args.seed, progress=not args.quiet)
    scores = evaluate(model, tok, requests)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    report = {"model": args.model, "requests": str(args.requests), "report": ins.report.to_dict(), "scores": scores}
    (out / "factkernels_insert.json").write_text(json.dumps(report, indent=2))
    summary = {k: v for k, v in ins.report.to_dict().items() if k != "margins"}
    print(json.dumps(summary | {"scores": scores}, indent=2))
    print(f"wrote {out} (stock {type(model).__name__}) and {out / 'factkernels_insert.json'}")
    return 0 if ins.report.efficacy == 1.0 else 1


def _add_insert_command(sub: argparse._SubParsersAction) -> None:
    """``insert``: facts into a real causal LM by construction, saved as a stock HF checkpoint."""
    p = sub.add_parser("insert", help="insert facts into a real causal LM by construction (needs the hf extra)")
    p.add_argument("--model", default="smollm2-135m", help="packaged name, local HF folder or .gguf file")
    p.add_argument("--requests", required=True, help=".json or .csv of {prompt, subject, target_new}")
    p.add_argument("--out", required=True, help="folder for the edited model (save_pretrained) and the JSON report")
    p.add_argument("--layer", type=int, default=None, help="decoder layer (default: two thirds of the depth for target keys, a third for subject keys)")
    p.add_argument("--position", choices=["target", "subject"], default="target")
    p.add_argument("--gate", choices=["detector", "generic"], default="detector")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=_run_insert)


def _run_capacity(args: argparse.Namespace) -> int:
    engine.set_threads(args.threads)
    options = {"whiten": args.whiten} if args.whiten else {}
    if args.method == "ours":
        options["multipliers"] = [cost_cells.DEFAULT_MULTIPLIER]
    if min(args.d, args.facts, args.seeds, args.max_size) < 1:
        raise CommandLineError("--d, --facts, --seeds and --max-size must be positive")
    config = cost_cells.cost_cell(args.method, args.family, args.facts, args.d, args.seeds, max_size=args.max_size,
                                  gd_steps=args.gd_steps, **options)
    cell = cost_cells.run_cost_cell(config)
    where = f"{args.family}, d={args.d}, F={args.facts}, {args.seeds} seeds"
    if cell["parameters"] is None:
        print(f"{args.method}: no {cell['size_name']} up to {args.max_size} stores every fact ({where}; best worst-seed "
              f"accuracy {cell['best_min_accuracy']:.4f})")
    else:
        print(f"{args.method}: {cell['size_name']}={cell['size']} -> {cell['parameters']:,} parameters store every "
              f"fact ({where}, rho={cell['rho']:.3f})")
    print("tried " + ", ".join(f"{size}{'+' if stored else '-'}" for size, stored, _ in cell["trace"]))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": config, "result": cell, "environment": environment()}, indent=2))
        print(f"wrote {path}")
    return 0 if cell["parameters"] is not None else 1


def _add_capacity_command(sub: argparse._SubParsersAction) -> None:
    """``capacity``: the fact-storage cost of one method (one cost-search cell, printed)."""
    cap = sub.add_parser("capacity", help="fact-storage cost of one method (binary search over its size)")
    cap.add_argument("--method", choices=sorted(cost_methods), default="ours")
    cap.add_argument("--d", type=int, default=32, help="embedding dimension")
    cap.add_argument("--facts", type=int, default=256, help="number of facts F = |V|")
    cap.add_argument("--family", choices=sorted(FAMILIES), default="spherical", help="embedding family (tied, bijective)")
    cap.add_argument("--seeds", type=int, default=3, help="fact sets (and method seeds) that must all be stored")
    cap.add_argument("--whiten", type=float, default=0.0, help="whitening strength alpha (method 'ours')")
    cap.add_argument("--gd-steps", type=int, default=20000, help="step cap of the GD MLP ('gd')")
    cap.add_argument("--max-size", type=int, default=1 << 17, help="the search gives up above this size")
    cap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    cap.add_argument("--json", help="write config, result with search trace and environment to this JSON file")
    cap.set_defaults(handler=_run_capacity)


def _real_lm_grid(args: argparse.Namespace) -> Optional[list[dict]]:
    """The real-lm-editing grid of ``--methods ... --sizes ...`` (None when no grid option is given: the scale's)."""
    if args.experiment != real_lm_editing.NAME or args.methods is None:
        if args.experiment == real_lm_editing.NAME and (args.hparams or args.protocols):
            raise ValueError("--hparams and --protocols need --methods")
        return None
    settings = json.loads(args.hparams) if args.hparams else {}
    protocols = json.loads(args.protocols) if args.protocols else {}
    if not isinstance(settings, dict) or not isinstance(protocols, dict):
        raise ValueError('--hparams and --protocols take a JSON object by method, e.g. {"memit": {"mom2_weight": 150}}')
    return real_lm_editing.grid([m.strip() for m in args.methods.split(",")], real_lm_editing.parse_sizes(args.sizes),
                                kind=args.kind, split=args.split, draws=args.draws, settings=settings,
                                protocols=protocols)


def _run_experiment(args: argparse.Namespace) -> int:
    scale = "quick" if args.quick else args.scale
    with _reading_input():
        shard, only = engine.parse_shard(args.shard), engine.parse_fields(args.only)
        overrides = engine.parse_fields(args.set, "--set")
        grid = _real_lm_grid(args)
    result = engine.run(args.experiment, args.out, scale=scale, shard=shard, resume=args.resume, threads=args.threads,
                        quiet=args.quiet, only=only, overrides=overrides, device=args.device, grid=grid)
    if grid is not None and result.summary is not None:  # the summary covers every cell in the folder
        result.summary, files = engine.summarize_dir(args.experiment, args.out)
        result.files[:] = files
    stale = f" ({len(result.stale)} of them stale)" if result.stale else ""
    print(f"{result.experiment} ({scale}): {result.total} cells, ran {result.ran}{stale}, kept {result.kept}, "
          f"missing {result.missing}")
    if result.summary is None:
        print(f"summary waits for the {result.missing} missing cells (other shards, or rerun with --resume)")
        return 0
    print(json.dumps(result.summary.get("claims", {}), indent=2))
    print("wrote " + ", ".join(result.files))
    return 0


def _run_experiment_list(args: argparse.Namespace) -> int:
    rows = claims.claim_rows(args.results)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['claim']:<34} {r['paper']} {r['where']:<12} {r['verdict_text']:<15} {r['statement']}\n"
              f"{'':<34} paper: {r['paper_value']}  ours: {r['ours'] or '-'}\n{'':<34} $ {r['command']}")
    return 0


def _run_experiment_report(args: argparse.Namespace) -> int:
    print(f"wrote {claims.write_claims_table(args.results, args.out)}")
    return 0


def _run_experiment_merge(args: argparse.Namespace) -> int:
    print(f"copied {engine.merge(args.sources, args.out)} cell files into {args.out}")
    return 0


def _add_experiment_commands(experiment_subparsers: argparse._SubParsersAction) -> None:
    """``experiment list|report|merge`` and ``experiment NAME`` for every registered experiment."""
    ls = experiment_subparsers.add_parser("list", help="every claim: where, setting, command, status")
    ls.add_argument("--results", default="benchmarks/results/experiments",
                    help="folder of experiment outputs (NAME/summary.json) to read status from")
    ls.add_argument("--json", action="store_true", help="print JSON rows")
    ls.set_defaults(handler=_run_experiment_list)
    rp = experiment_subparsers.add_parser("report", help="markdown claims table from every RESULTS/*/summary.json")
    rp.add_argument("results", nargs="+", help="folders of experiment outputs (NAME/summary.json), e.g. quick and seed runs")
    rp.add_argument("--out", required=True, help="markdown file to write, e.g. benchmarks/results/CLAIMS.md")
    rp.set_defaults(handler=_run_experiment_report)
    mg = experiment_subparsers.add_parser("merge", help="copy the cell files of several runs into one folder")
    mg.add_argument("sources", nargs="+")
    mg.add_argument("--out", required=True)
    mg.set_defaults(handler=_run_experiment_merge)
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
        if name == real_lm_editing.NAME:
            _add_real_lm_options(p)
        p.set_defaults(handler=_run_experiment)


def _add_real_lm_options(p: argparse.ArgumentParser) -> None:
    """real-lm-editing's grid: every method x size x draw (replaces --scale's grid)."""
    p.add_argument("--methods", default=None,
                   help=f"comma-separated, of {', '.join(real_lm_editing.METHODS)} (gives the grid; else --scale's)")
    p.add_argument("--sizes", default="10,100,all", help="edits at once per cell: ints or 'all', comma-separated")
    p.add_argument("--kind", choices=real_lm_editing.KINDS, default="known", help="known facts or invented subjects")
    p.add_argument("--split", choices=("validation", "test"), default="test")
    p.add_argument("--draws", type=real_lm_editing.parse_draws, default=[0, 1, 2],
                   help="draw indices (validation: 0), or all: every test draw at once, one cell")
    p.add_argument("--hparams", default=None, help='settings by method, JSON: {"memit": {"mom2_weight": 150}} or a '
                   'list of settings per method (a sweep); ours: hf.insert_facts keyword arguments')
    p.add_argument("--protocols", default=None, help='protocols by method, JSON: {"rome": ["sequential", "single"]}')


def _run_rgr_train(args: argparse.Namespace) -> int:
    """Handler of ``rgr-train``: per-run test F1 (or MSE) and the mean with a 95% t-interval per d_k."""
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    with _reading_input():
        config = TrainingConfig(context_length=args.context_length, target_rate=args.target_rate, lr=args.lr,
                                max_steps=args.steps, threads=args.threads, degree=args.degree,
                                objective=args.objective, message_dim=args.message_dim)
    if args.context_length > args.m:
        raise CommandLineError(f"--context-length {args.context_length} exceeds --m {args.m} (items per context)")
    start = time.perf_counter()
    runs = train_runs(args.m, args.d_model, args.heads, args.d_k, seeds, config, quiet=args.quiet)
    elapsed = time.perf_counter() - start
    print(f"m={args.m} d_model={args.d_model} h={args.heads} steps<={config.steps_for(args.m, args.d_model)} "
          f"({elapsed:.1f}s)")
    metric = "f1" if config.objective == "edges" else "mse"
    label = metric.upper()
    print(f"{'d_k':>5} {'D_K':>6} {'seed':>5} {'test ' + label:>8} {'val ' + label:>7} {'steps':>7} {'tau':>8}")
    for r in runs:
        print(f"{r.head_dim:>5} {r.key_budget:>6} {r.seed:>5} {getattr(r, 'test_' + metric):>8.4f} "
              f"{getattr(r, 'val_' + metric):>7.4f} {r.steps:>7} {r.heads.threshold:>8.3f}")
    summary = []
    for d_k in args.d_k:
        mean, low, high = t_interval([getattr(r, "test_" + metric) for r in runs if r.head_dim == d_k])
        summary.append({"head_dim": d_k, "key_budget": d_k * args.heads, f"mean_{metric}": mean, "ci_low": low,
                        "ci_high": high})
        print(f"d_k={d_k} D_K={d_k * args.heads}: mean test {label} {mean:.4f}  95% CI [{low:.4f}, {high:.4f}]")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"config": {"m": args.m, "d_model": args.d_model, "heads": args.heads, "head_dims": args.d_k,
                              "seeds": seeds, "training": asdict(config)},
                   "runs": [r.to_dict() for r in runs], "summary": summary, "elapsed_s": elapsed,
                   "environment": environment()}
        path.write_text(json.dumps(engine.clean_json(payload), indent=2, allow_nan=False))
        print(f"wrote {path}")
    return 0


def _add_rgr_train_command(sub: argparse._SubParsersAction) -> None:
    """``rgr-train``: one batch of seed 002 QK-head training runs, printed."""
    d = TrainingConfig()
    train = sub.add_parser("rgr-train", help="train max-over-heads QK heads on a random permutation graph")
    train.add_argument("--m", type=int, default=128, help="number of items")
    train.add_argument("--d-model", type=int, default=32, help="embedding dimension")
    train.add_argument("--heads", type=int, default=4, help="number of heads h")
    train.add_argument("--d-k", type=_int_list, default=[8], help="per-head width(s) d_k, e.g. 8 or 4,8,16")
    train.add_argument("--seeds", type=int, default=3, help="number of seeds (runs per d_k)")
    train.add_argument("--first-seed", type=int, default=0)
    train.add_argument("--degree", type=int, default=1, help="out-degree r: 1 permutation graph, > 1 r-regular")
    train.add_argument("--objective", choices=OBJECTIVES, default="edges",
                       help="edges: edge classification (F1); messages: value channel retrieval (MSE)")
    train.add_argument("--message-dim", type=int, default=None, help="d_msg of the value channel (default d_model)")
    train.add_argument("--json", help="write config, per-run results and environment to this JSON file")
    train.add_argument("--context-length", type=int, default=d.context_length, help="ell, items per context")
    train.add_argument("--target-rate", type=float, default=d.target_rate, help="rho, target-in-context rate")
    train.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate")
    train.add_argument("--steps", type=int, default=None, help="step cut-off (default: Table 2 of the seed)")
    train.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads while training")
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    train.set_defaults(handler=_run_rgr_train)


def _run_rgr_search(args: argparse.Namespace) -> int:
    """``factkernels rgr-search``: the bracketing search (or ``--add-seeds``), then the summary of every cell present."""
    engine.set_threads(args.threads)
    log = lambda s: print(s, flush=True)  # noqa: E731
    if args.add_seeds:
        rgr_search.densify(args.out, args.experiment, args.pairs, args.add_seeds, degree=args.degree,
                           aggregation=args.aggregation, log=log)
    else:
        rgr_search.search(args.out, args.experiment, args.pairs, args.seeds, args.heads, heads_window=args.heads_window,
                          max_steps=args.max_steps, degree=args.degree, aggregation=args.aggregation, log=log)
    # over every cell present: a sub-grid of the static grid, which ``factkernels experiment`` would not summarize
    _, files = engine.summarize_dir(args.experiment, args.out)
    print("wrote " + ", ".join(files))
    return 0


def _add_rgr_search_command(sub: argparse._SubParsersAction) -> None:
    """``rgr-search``: the bracketing D_K* search of a seed 002 budget experiment, as its cells."""
    p = sub.add_parser("rgr-search", help="bracketing D_K* search of a seed 002 budget experiment, as its cells")
    p.add_argument("experiment", choices=rgr_search.BUDGET_EXPERIMENTS)
    p.add_argument("--out", required=True, help="OUT/EXPERIMENT/cells/*.json, summary.json, PNGs")
    p.add_argument("--pairs", type=_int_pairs, required=True, help="m:d_model,m:d_model,...")
    p.add_argument("--seeds", type=_int_list, default=[0, 1, 2], help="comma-separated seeds of each cell")
    p.add_argument("--heads", type=_int_list, default=list(rgr_cells.SEED_HEADS), help="head counts to bracket")
    p.add_argument("--heads-window", type=float, default=None, help="only h = 1 and h within this factor of r m/d")
    p.add_argument("--max-steps", type=int, default=None, help="step cut-off (default: the seed's)")
    p.add_argument("--degree", type=int, default=1, help="out-degree r of the graph (rgr-regular)")
    p.add_argument("--aggregation", default="max", choices=("max", "softmax-sum"))
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--add-seeds", type=_int_list, default=None,
                   help="instead of searching: train these seeds for the configurations near each pair's estimates")
    p.set_defaults(handler=_run_rgr_search)


def build_parser() -> argparse.ArgumentParser:
    """The ``factkernels`` parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="factkernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="build and verify a fact MLP on a built-in default (d=64, F=|V|=1024)")
    _add_construct_options(demo, d=64, facts=1024)
    cons = sub.add_parser("construct", help="build and verify a fact MLP on your embeddings (--keys --values "
                                            "--facts files) or random spherical ones")
    _add_construct_options(cons, d=64, facts=1024)
    for p in (demo, cons):
        p.set_defaults(handler=_run_construct)
    sub.add_parser("info", help="print what was compiled").set_defaults(handler=_run_info)
    _add_insert_command(sub)
    _add_capacity_command(sub)
    experiments = sub.add_parser("experiment", help="run a named experiment; writes JSON and PNG")
    _add_experiment_commands(experiments.add_subparsers(dest="experiment", required=True))
    _add_rgr_train_command(sub)
    _add_rgr_search_command(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command; input it cannot use is one line on stderr and exit status 2 (argparse's own errors too)."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (CommandLineError, engine.ResultFileError) as err:
        command = " ".join(c for c in (args.command, getattr(args, "experiment", None)) if c)
        print(f"factkernels {command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
