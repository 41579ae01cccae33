"""Command line for the authors/books LM and fact editing (seed 000 §5.4, App. A.3).

    factkernels experiment lm-facts --quick --out results/    # MoE LM, swap the fact expert
    factkernels experiment editing --quick --out results/     # MLP swap vs MEMIT / ROME / AlphaEdit

``add_subcommands(subparsers, experiment_subparsers)`` registers both experiments; each writes
one JSON (config, raw numbers, the seed's claims beside ours, environment) and one PNG.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict

import torch

from ..mlp import FactMLP
from ..results import save_figure, write_json
from .editing import METHODS, SEED_GRIDS, SEED_SPLITS, compare_editors, make_split, scaled_split
from .lm import EXPERTS, AuthorsBooks, LMTrainConfig, evaluate, random_facts, trained_lm

# Seed 000 §5.4 / App. A.3.3-A.3.4.
SEED_LM_CLAIM = {"new_fact_accuracy": "> 0.99 after swapping the fact MLP (Fig. 9a: >= 99% usability)",
                 "nonfact_ce_rise": "~3% rise of the mean cross-entropy on non-fact tokens (Fig. 9b)",
                 "setup": "d = 256, GD (MSE) fact MLPs, up to 16,000 facts x 16 rephrases, 4.8M sequences"}
SEED_EDIT_CLAIM = {"score": "MLP swap about doubles the score of MEMIT, ROME and AlphaEdit when 10% of the "
                            "facts are altered (Fig. 4; 16,000 facts x 16 rephrases)"}
QUICK = {"facts": [256], "dim": 64, "steps": 1500}
FULL = {"facts": [4096], "dim": 256, "steps": 20000}
NEW_FACT_SEED = 1  # the swapped-in fact set and its MLP (never in a training pool)


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _experts(text: str) -> list[str]:
    names = [v for v in text.split(",") if v]
    if not names or set(names) - set(EXPERTS):
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {EXPERTS}, got {text!r}")
    return names


def _add_lm_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help=f"small sizes for 2 CPU cores ({QUICK}); default: {FULL} (hours on CPU)")
    p.add_argument("--out", default="results/lm", help="output folder for JSON and PNG")
    p.add_argument("--dim", type=int, default=None, help="model width d")
    p.add_argument("--steps", type=int, default=None, help="training steps")
    p.add_argument("--batch-size", type=int, default=LMTrainConfig.batch_size)
    p.add_argument("--lr", type=float, default=LMTrainConfig.lr, help="AdamW learning rate")
    p.add_argument("--fact-prior", type=float, default=0.5, help="router's initial weight on the fact expert")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def add_subcommands(subparsers, experiment_subparsers) -> None:
    """Register ``experiment lm-facts`` and ``experiment editing`` on ``experiment_subparsers``."""
    lm = experiment_subparsers.add_parser(
        "lm-facts", help="authors/books LM with a MoE fact expert; new-fact accuracy and non-fact CE after a swap")
    _add_lm_options(lm)
    lm.add_argument("--facts", type=_ints, default=None, help="fact-set sizes F (<= 4096 shipped pairs), e.g. 256,1024")
    lm.add_argument("--experts", type=_experts, default=list(EXPERTS),
                    help="how fact experts are made, one run per entry: gd (MSE, the seed's LM) and/or constructed")
    lm.add_argument("--expert-hidden", type=int, default=None, help="GD expert width (default: F)")
    lm.add_argument("--pool", type=_ints, default=[0],
                    help="extra fact experts swapped in while training, one run per entry (0 = the seed's protocol)")
    lm.set_defaults(handler=run_lm_facts)

    edit = experiment_subparsers.add_parser(
        "editing", help="fact editing: MLP swap vs MEMIT, ROME, AlphaEdit (efficacy, specificity, paraphrase, score)")
    _add_lm_options(edit)
    edit.add_argument("--facts", type=int, default=None, help="fact-set size F (<= 4096 shipped pairs)")
    edit.add_argument("--pool", type=int, default=0, help="extra fact experts while training the LM (0 = seed)")
    edit.add_argument("--expert", choices=EXPERTS, default="constructed",
                      help="fact expert of the edited LM: constructed, or gd (MSE, the seed's LM)")
    edit.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {METHODS}")
    edit.set_defaults(handler=run_editing)


def _sizes(args: argparse.Namespace) -> dict:
    base = QUICK if args.quick else FULL
    return {"dim": args.dim or base["dim"], "steps": args.steps or base["steps"], "facts": base["facts"]}


def _train_config(args: argparse.Namespace, steps: int) -> LMTrainConfig:
    return LMTrainConfig(steps=steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed)


def _mlp_summary(mlp) -> dict:
    summary = {"hidden": mlp.hidden_size, "parameters": mlp.num_parameters}
    if mlp.report is not None:  # constructed
        return {**summary, "m": mlp.report.m, "accuracy": mlp.report.accuracy, "min_margin": mlp.report.min_margin}
    fit = mlp.fit_results["mlp"]
    return {**summary, "gd_steps": fit.steps, "stored_all": fit.solved, "mse": fit.loss}


def _silenced(mlp: FactMLP) -> FactMLP:
    """``mlp`` with its down projection zeroed: the fact expert removed, the router untouched."""
    down = torch.zeros_like(mlp.down_weight)
    bias = None if mlp.down_bias is None else torch.zeros_like(mlp.down_bias)
    return FactMLP(mlp.gate_weight, mlp.gate_bias, mlp.up_weight, mlp.up_bias, down, bias, activation=mlp.activation)


def run_lm_facts(args: argparse.Namespace) -> int:
    """Handler of ``experiment lm-facts``: train, swap in an MLP for a new fact set, measure."""
    torch.set_num_threads(args.threads)
    sizes = _sizes(args)
    fact_sizes = args.facts or sizes["facts"]
    config = _train_config(args, sizes["steps"])
    runs = []
    for num_facts in fact_sizes:
        task = AuthorsBooks.build(num_facts)
        for expert, pool in [(e, p) for e in args.experts for p in args.pool]:
            start = time.perf_counter()
            model, losses = trained_lm(task, config, dim=sizes["dim"], pool=pool, fact_prior=args.fact_prior,
                                       expert=expert, expert_hidden=args.expert_hidden, quiet=args.quiet)
            train_s = time.perf_counter() - start
            before = evaluate(model, task, task.facts)
            new_facts = random_facts(num_facts, seed=NEW_FACT_SEED)
            new_mlp = model.matching_fact_expert(task, new_facts, seed=NEW_FACT_SEED)
            own = model.swap_fact_expert(new_mlp)
            after = evaluate(model, task, new_facts)
            old_after = evaluate(model, task, task.facts)["value_accuracy"]
            model.swap_fact_expert(_silenced(own))
            silenced = evaluate(model, task, task.facts)["ce_nonfact"]
            model.swap_fact_expert(own)
            rise = after["ce_nonfact"] / before["ce_nonfact"] - 1
            runs.append({"facts": num_facts, "expert": expert, "pool": pool, "train_s": train_s, "train_facts": before,
                         "swapped": after, "new_fact_accuracy": after["value_accuracy"],
                         "old_fact_accuracy_after_swap": old_after, "nonfact_ce_rise": rise,
                         "ce_nonfact_fact_expert_zeroed": silenced,
                         "fact_mlp": _mlp_summary(own), "new_fact_mlp": _mlp_summary(new_mlp),
                         "loss_every_50": losses[::50]})
            print(f"F={num_facts} expert={expert} pool={pool}: train acc {before['value_accuracy']:.4f}, "
                  f"new-fact acc after swap {after['value_accuracy']:.4f} (seed: > 0.99), non-fact CE "
                  f"{before['ce_nonfact']:.4f} -> {after['ce_nonfact']:.4f} ({100 * rise:+.1f}%, seed: ~+3%; "
                  f"{silenced:.4f} with the fact expert zeroed), router weight of the fact expert on template "
                  f"words {before['router_fact_word']:.3f}, {train_s:.0f}s", flush=True)
            # written after every run, so a long sweep cut short keeps what it measured
            payload = {"config": {**sizes, "facts": fact_sizes, "experts": args.experts,
                                  "expert_hidden": args.expert_hidden, "pool": args.pool, "fact_prior": args.fact_prior,
                                  "training": asdict(config), "quick": args.quick, "new_fact_seed": NEW_FACT_SEED},
                       "runs": runs, "seed_claim": SEED_LM_CLAIM}
            path = write_json(args.out, "lm_facts", payload)
            _plot_lm(runs, args.out)
    print(f"wrote {path}")
    return 0


def _plot_lm(runs: list[dict], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"F={r['facts']} {r['expert']}\npool={r['pool']}" for r in runs]
    x = range(len(runs))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    axes[0].bar(x, [r["new_fact_accuracy"] for r in runs], color="tab:green")
    axes[0].axhline(0.99, color="k", ls="--", lw=1, label="seed: > 99%")
    axes[0].set(xticks=list(x), xticklabels=labels, ylim=(0, 1.02), title="new-fact accuracy after MLP swap")
    axes[0].legend(loc="lower right")
    width = 0.27
    axes[1].bar([i - width for i in x], [r["train_facts"]["ce_nonfact"] for r in runs], width, label="own MLP")
    axes[1].bar(list(x), [r["swapped"]["ce_nonfact"] for r in runs], width, label="swapped MLP")
    axes[1].bar([i + width for i in x], [r["ce_nonfact_fact_expert_zeroed"] for r in runs], width, label="MLP zeroed")
    axes[1].set(xticks=list(x), xticklabels=labels, yscale="log", title="non-fact token cross-entropy")
    axes[1].legend()
    for r, label in zip(runs, labels):
        axes[2].plot([50 * i for i in range(len(r["loss_every_50"]))], r["loss_every_50"], label=label.replace("\n", " "))
    axes[2].set(xlabel="step", ylabel="training loss", yscale="log", title="training")
    axes[2].legend()
    save_figure(fig, out, "lm_facts")


def run_editing(args: argparse.Namespace) -> int:
    """Handler of ``experiment editing``: train the LM, then each seed split and each editor."""
    torch.set_num_threads(args.threads)
    sizes = _sizes(args)
    num_facts = args.facts or sizes["facts"][0]
    methods = tuple(m for m in args.methods.split(",") if m)
    if not methods or set(methods) - set(METHODS):
        raise SystemExit(f"--methods must be a comma-separated subset of {METHODS}, got {args.methods!r}")
    config = _train_config(args, sizes["steps"])
    task = AuthorsBooks.build(num_facts)
    start = time.perf_counter()
    model, _ = trained_lm(task, config, dim=sizes["dim"], pool=args.pool, fact_prior=args.fact_prior,
                          expert=args.expert, quiet=args.quiet)
    train_s = time.perf_counter() - start
    base = evaluate(model, task, task.facts)
    print(f"LM: F={num_facts}, value accuracy {base['value_accuracy']:.4f} ({train_s:.0f}s)")
    splits = []
    for seed_preserved, seed_altered in SEED_SPLITS:
        preserved, altered = scaled_split(num_facts, seed_preserved, seed_altered)
        split = make_split(task.facts, preserved, altered, seed=args.seed)
        start = time.perf_counter()
        results = compare_editors(model, task, split, methods=methods, seed=args.seed, quiet=args.quiet)
        elapsed = time.perf_counter() - start
        splits.append({"preserved": preserved, "altered": altered, "seed_split": [seed_preserved, seed_altered],
                       "altered_fraction": altered / num_facts, "elapsed_s": elapsed, "methods": results})
        line = ", ".join(f"{m} {results[m]['best']['score']:.3f}" for m in methods)
        print(f"preserved {preserved} / altered {altered} ({100 * altered / num_facts:.0f}%): score {line}")
    payload = {"config": {**sizes, "facts": num_facts, "pool": args.pool, "fact_prior": args.fact_prior,
                          "expert": args.expert, "training": asdict(config),
                          "methods": methods, "grids": SEED_GRIDS, "quick": args.quick},
               "lm": {"train_s": train_s, **base}, "splits": splits, "seed_claim": SEED_EDIT_CLAIM}
    name = "editing" if args.expert == "constructed" else f"editing_{args.expert}"
    path = write_json(args.out, name, payload)
    _plot_editing(splits, methods, args.out, name)
    print(f"wrote {path}")
    return 0


def _plot_editing(splits: list[dict], methods: tuple[str, ...], out: str, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    altered = [s["altered"] for s in splits]
    for m in methods:
        axes[0].plot(altered, [s["methods"][m]["best"]["score"] for s in splits], "o-", label=m)
    axes[0].set(xlabel="altered facts", ylabel="score (harmonic mean)", ylim=(0, 1.02),
                title="fact-editing score (best grid point)")
    axes[0].legend()
    largest = max(splits, key=lambda s: s["altered"])
    metrics = ("efficacy", "specificity", "paraphrase", "score")
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        axes[1].bar([j + i * width for j in range(len(metrics))],
                    [largest["methods"][m]["best"][k] for k in metrics], width, label=m)
    axes[1].set(xticks=[j + 0.4 - width / 2 for j in range(len(metrics))], xticklabels=metrics, ylim=(0, 1.02),
                title=f"{largest['altered']} altered / {largest['preserved']} preserved facts")
    axes[1].legend(fontsize=8, loc="lower left")
    save_figure(fig, out, name)
