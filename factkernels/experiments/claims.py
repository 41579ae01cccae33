"""The claims table: every registered claim beside what the experiments under a folder measured.

    factkernels experiment report benchmarks/results/experiments benchmarks/results/experiments-seed --out benchmarks/results/CLAIMS.md

Reads DIR/*/summary.json of each folder given (written by :func:`engine.summarize_dir`) and writes one markdown row per
claim: the paper's number, ours, the setting that ran, the verdict and its reason, with links to
the experiment's PNGs. Registered claims without a summary get a "not run" row with the command
that would run them.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Sequence, Union

from . import engine

PathLike = Union[str, Path]

COLUMNS = ("claim", "paper", "where", "paper's number", "ours", "setting", "verdict", "reason", "plots")


def _cell(text) -> str:
    return str(text if text not in (None, "") else "–").replace("|", "\\|").replace("\n", " ")


def claim_rows(results: Union[PathLike, Sequence[PathLike]]) -> list[dict]:
    """One dict per (claim, results folder holding a summary of it), in experiment then declaration order.

    results: one folder or several (e.g. the quick grids and a seed-scale run); a registered claim no
    folder has a summary for gets one "not run" row naming the command that would run it.
    """
    folders = [Path(results)] if isinstance(results, (str, Path)) else [Path(r) for r in results]
    found: dict[str, list[tuple[Path, dict]]] = {}
    for folder in folders:
        for path in sorted(folder.glob("*/summary.json")):
            found.setdefault(path.parent.name, []).append((folder, engine.read_json(path, "summary")))
    rows = []
    for name in sorted(set(engine.REGISTRY) | set(found)):
        declared = [c.__dict__ for c in engine.REGISTRY[name].claims] if name in engine.REGISTRY else []
        for folder, saved in found.get(name, []):  # claims a summary tested but this version no longer declares stay
            known = {c["id"] for c in declared}
            declared += [c for c in saved.get("claims_tested", []) if c["id"] not in known]
        for claim in declared:
            hits = [(folder, saved["summary"].get("claims", {}).get(claim["id"]), saved)
                    for folder, saved in found.get(name, [])]
            hits = [(folder, finding, saved) for folder, finding, saved in hits if finding] or [(folders[0], None, {})]
            for folder, finding, saved in hits:
                rows.append({"experiment": name, "results": str(folder), "claim": claim["id"], "paper": claim["paper"],
                             "where": claim["where"], "statement": claim["statement"], "paper_value": claim["value"],
                             "ours": finding["ours"] if finding else "",
                             "setting": finding["setting"] if finding else "",
                             "verdict": finding["verdict"] if finding else "not run",
                             "verdict_text": engine.Finding(**finding).verdict_text if finding else "not run",
                             "reason": finding["reason"] if finding else "no summary.json in " + ", ".join(
                                 str(f / name) for f in folders),
                             "figures": [str(folder / name / Path(f).name) for f in saved.get("figures", [])],
                             "command": f"factkernels experiment {name} --out {folder}"})
    return sorted(rows, key=lambda r: r["paper"])  # stable: experiments and their claims keep their order


def latest_rows(rows: list[dict]) -> list[dict]:
    """One row per claim of :func:`claim_rows`: from the last results folder that has a finding for it
    (folders are listed smallest run first, e.g. the quick grids, then the seed-scale runs), else its
    "not run" row."""
    order = list(dict.fromkeys(r["results"] for r in rows))
    best: dict[str, dict] = {}
    for r in rows:
        rank = (r["verdict"] != "not run", order.index(r["results"]))
        if r["claim"] not in best or rank > best[r["claim"]][0]:
            best[r["claim"]] = (rank, r)
    return [r for _, r in best.values()]


def _as_named(path: PathLike) -> str:
    """``path`` relative to the current folder when it lies below it: the header names no machine's folders."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def write_claims_table(results: Union[PathLike, Sequence[PathLike]], out: PathLike) -> Path:
    """Write the markdown claims table of ``results`` (one folder or several) to ``out``; links are
    relative to ``out``'s folder."""
    out = Path(out)
    rows = claim_rows(results)
    folders = " ".join(_as_named(r) for r in ([results] if isinstance(results, (str, Path)) else results))
    counts = Counter(r["verdict"] for r in rows)
    claims = Counter(r["verdict"] for r in latest_rows(rows))
    lines = ["# Claims of the seed papers: theirs beside ours", "",
             f"Generated by `factkernels experiment report {folders} --out {_as_named(out)}` from the `summary.json` of each "
             "experiment (the cell JSON beside it holds every number, config and environment). Paper 000: fact-storing "
             "MLPs; paper 002: attention-head capacity. Verdicts of the "
             f"{sum(claims.values())} claims, each by the last folder listed that ran it (the largest run): "
             + ", ".join(f"{claims.get(v, 0)} {v}" for v in engine.VERDICTS) + f". Over all {len(rows)} rows: "
             + ", ".join(f"{counts.get(v, 0)} {v}" for v in engine.VERDICTS) + ".", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        plots = " ".join(f"[{Path(f).stem}]({os.path.relpath(f, out.parent)})" for f in r["figures"])
        claim = f"**{r['claim']}** ({Path(r['results']).name}): {r['statement']}"
        lines.append("| " + " | ".join(_cell(v) for v in (claim, r["paper"], r["where"], r["paper_value"], r["ours"],
                                                          r["setting"] or f"`{r['command']}`", r["verdict_text"],
                                                          r["reason"], plots)) + " |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out


__all__ = ["COLUMNS", "claim_rows", "latest_rows", "write_claims_table"]
