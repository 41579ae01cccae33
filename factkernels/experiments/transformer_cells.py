"""What the transformer experiments of seed 000 §5 share (ssfr_swap, usability_tradeoff, lm_facts,
toy_lm_editing): training presets, the vanilla block's switches, the cells of the seed's block, progress kept
in a cell's partial file, the W-vs-F plot, and the trained authors/books LM of a cell.

The quick grids train ~0.1M sequences at lr 1e-2 instead of the seed's 4.8M at 2e-4 (see each finding's
setting).
"""

from __future__ import annotations

import json
import math
from typing import Callable, Optional, Sequence

import torch
from safetensors.torch import load_file, save_file

from ..transformer.lm import AuthorsBooks, AuthorsLM, LMTrainConfig, trained_lm
from ..transformer.training import SEED_LR, SEED_SEQUENCES
from . import engine


VANILLA = {"tie_embeddings": False, "residual": True, "freeze_mlp_norm": False, "identity_value_output": False}
NEW_FACT_SEED = 1  # the swapped-in fact set and its MLP (never in a training pool)
SEED_TRAIN = {"steps": SEED_SEQUENCES // 256, "batch_size": 256, "lrs": [SEED_LR]}
# The SSFR transformers train on a GPU too (--device cuda): at d = 128 the seed's 4.8M sequences take ~35 min
# of one CPU core per transformer (the seed-length headline cell: 4 in 8,223 s), and a W-vs-F search trains 4
# per size, so the shortened CPU runs train 6,000 x 64 sequences.
TRANSFORMER_DEVICES = engine.CPU_OR_CUDA
QUICK_TRAIN = {"steps": 1500, "batch_size": 64, "lrs": [1e-2]}
TINY_TRAIN = {"steps": 20, "batch_size": 16, "lrs": [1e-2]}


def train_text(config: dict, runs: Sequence[dict] = ()) -> str:
    """What trained: the steps and sequences ``runs`` ran (a run stops once it fits its facts), under the cell's
    cap, its learning rates, seeds and d; the cap alone for runs that did not record their steps."""
    cap = f"{config['steps']} steps × {config['batch_size']} sequences"
    ran = [r for r in runs if "steps" in r]
    if ran:
        steps = [r["steps"] for r in ran]
        sequences = [r.get("sequences", r["steps"] * config["batch_size"]) for r in ran]
        text = f"{len(ran)} runs trained {_span(steps)} steps ({_span(sequences)} sequences; cap {cap})"
    else:
        text = f"up to {cap}"
    return f"{text}, lr {config['lrs']}, {len(config['seeds'])} seed(s), d = {config['dim']}"


def _span(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}–{high:,}"


def block_switches(config: dict) -> dict:
    """FactTransformer switches of a cell: the vanilla block's, and the final norm when the cell asks for it."""
    return {**(VANILLA if config.get("variant") == "vanilla" else {}),
            **({"output_norm": True} if config.get("output_norm") else {})}


def seed_block(cells: list[engine.Cell]) -> tuple[bool, list[engine.Cell], str]:
    """The cells that speak for a claim: those of the seed's GPT-2 block (``output_norm``) when any ran, else
    those of our earlier block; returns (seed block?, those cells, a label for the setting)."""
    faithful = any(c.config.get("output_norm") for c in cells)
    chosen = [c for c in cells if bool(c.config.get("output_norm")) == faithful]
    label = "GPT-2 block with its final RMSNorm" if faithful else "our earlier block without GPT-2's final RMSNorm"
    return faithful, chosen, label


def kept_progress(field: str) -> tuple[list[dict], Optional[Callable[[dict], None]]]:
    """The records (``field``: "trials", the sizes of a W-vs-F search; "runs", the transformers of a headline
    cell) an interrupted run of the running cell finished, kept in its partial file (at d = 128 and the seed's
    length one transformer is ~35 min of a CPU core, a size of a search four of them), and a callback that
    adds each new one there; ([], None) outside an experiment run."""
    partial = engine.partial_path()
    if partial is None:
        return [], None
    done = json.loads(partial.read_text())[field] if partial.exists() else []
    records = list(done)

    def keep(record: dict) -> None:
        records.append(record)
        engine.write_json(partial, {field: records})
        engine.note(f"{len(records)} {field} finished and kept in {partial.name}")
    return done, keep


def plot_w_vs_f(points: list[dict], title: str, stricter: Sequence[dict] = ()):
    """Smallest usable MLP parameters W against facts F (log-log), with an F log F guide through the first point;
    ``stricter``: the searches scored on training + held-out junk tuples, drawn beside."""
    from .plotting import panels  # first: it names the extra to install when matplotlib is missing
    from matplotlib.ticker import NullLocator

    fig, (ax,) = panels(1, width=5, height=4)
    found = [p for p in points if p["parameters"]]
    beside = [p for p in stricter if p["parameters"]]
    if beside:
        ax.loglog([p["num_facts"] for p in beside], [p["parameters"] for p in beside], "s:", color="0.5",
                  label="usable on training + held-out junk")
    if found:
        facts = [p["num_facts"] for p in found]
        params = [p["parameters"] for p in found]
        ax.loglog(facts, params, "o-", label="smallest usable MLP" + (" (the seed's J)" if beside else ""))
        reference = [f * math.log(f) for f in facts]  # information-theoretic W ~ F log F, through the first point
        ax.loglog(facts, [r * params[0] / reference[0] for r in reference], "k--", label="∝ F log F")
    measured = sorted({p["num_facts"] for p in found + beside})
    if measured:
        ax.set_xticks(measured, [str(f) for f in measured])  # the measured F, without log-scale minor labels
        ax.xaxis.set_minor_locator(NullLocator())
        ax.legend()
    ax.set(xlabel="facts F", ylabel="MLP parameters W", title=title)
    return fig


def lm_sizes(scale: str) -> dict:
    return {"tiny": {"facts": 24, "dim": 16, "steps": 30, "batch_size": 16},
            "quick": {"facts": 256, "dim": 64, "steps": 1500, "batch_size": 128},
            "seed": {"facts": 4096, "dim": 256, "steps": 20000, "batch_size": 128}}[scale]


def trained_lm_of_cell(config: dict):
    """The cell's trained LM. Inside an experiment run the trained weights (and losses) are kept in the
    cell's partial files until the cell is written, so a resumed cell (hours of training at 4,096 facts)
    rebuilds the model and loads them instead of training again."""
    task = AuthorsBooks.build(config["facts"])
    partial = engine.partial_path()
    saved = None if partial is None else partial.with_suffix(".lm.safetensors")
    if saved is not None and saved.exists():
        # same seed, so the same fact expert as the trained model's; the weights then overwrite it
        model = AuthorsLM(task, expert=config["expert"], expert_hidden=config.get("expert_hidden"), dim=config["dim"],
                          fact_prior=config["fact_prior"], seed=config["seed"],
                          mixer_input=config.get("mixer_input", "normed"))
        tensors = load_file(saved)
        losses = tensors.pop("__losses__").tolist()
        model.load_state_dict(tensors)
        return task, model, losses
    train = LMTrainConfig(steps=config["steps"], batch_size=config["batch_size"], lr=config["lr"], seed=config["seed"])
    model, losses = trained_lm(task, train, dim=config["dim"], pool=config["pool"], fact_prior=config["fact_prior"],
                               expert=config["expert"], expert_hidden=config.get("expert_hidden"),
                               mixer_input=config.get("mixer_input", "normed"), quiet=True)
    if saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
        tmp = saved.with_suffix(".tmp")  # a killed run never leaves half a file behind
        save_file({**tensors, "__losses__": torch.tensor(losses, dtype=torch.float64)}, tmp)
        tmp.replace(saved)
    return task, model, losses
