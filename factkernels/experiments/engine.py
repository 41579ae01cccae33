"""The experiment engine: every experiment is a grid of cells, and every cell is one JSON file.

An :class:`Experiment` names the paper claims it tests and gives four functions:

    grid(scale)            -> list of cell configs (JSON-able dicts), scale in SCALES
    run_cell(config)       -> dict of numbers for that cell (no file I/O, seeded, deterministic)
    summarize(cells)       -> summary dict; summary["claims"][claim_id] is a :class:`Finding` dict
    plot(summary, cells)   -> {name: matplotlib figure} (optional)

:func:`run` executes a grid into ``OUT/NAME/cells/KEY.json`` the moment each cell finishes, so a run
can be stopped and resumed (``resume=True`` keeps finished cells, except those the experiment's ``stale``
hook says no longer match their config), split across processes or machines
(``shard=(i, N)`` runs the cells whose index is i−1 mod N) and merged (copy the cell files into one
folder, or :func:`merge`). When every cell of the grid is present, :func:`summarize_dir` writes
``OUT/NAME/summary.json`` and the PNGs.

Cell file: {"experiment", "key", "config", "result", "seconds", "device", "environment"}.

A cell that takes hours may keep partial progress in ``OUT/NAME/partial/KEY.json`` (:func:`partial_path`,
e.g. the trials of a cost search): a resumed run continues from it, and it is deleted once the cell is
written. Work that several cells share (one editor residual step serves a grid of update settings) goes
to ``OUT/NAME/partial/shared-KEY.*`` or a folder ``shared-KEY/`` (:func:`shared_partial_path`), kept until
every cell of the grid is present. Commit these files with the cells to continue a long cell in another
session. A cell may also read another cell's result or partial progress (:func:`other_cell`), e.g. a search
that replays the sizes a search of another scoring criterion has measured.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Union

import torch
from ..progress import log_line, progress_bar

from ..environment import environment

PathLike = Union[str, Path]


def clean_json(value: Any) -> Any:
    """JSON-safe copy: NaN/Inf become None, tuples lists, tensors and numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if hasattr(value, "tolist"):  # torch / numpy arrays and scalars
        return clean_json(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value

SCALES = ("tiny", "quick", "seed")
"""tiny: seconds, run in CI; quick: minutes on 2 CPU cores; seed: the paper's own grid."""

VERDICTS = ("reproduced", "partly", "not reproduced", "not run")


@dataclass(frozen=True)
class Claim:
    """One claim of a seed paper. paper: "000" or "002"; where: figure/section; value: the paper's number."""

    id: str
    paper: str
    where: str
    statement: str
    value: str


@dataclass(frozen=True)
class Finding:
    """What we measured for a claim: ours (our number, as text), setting (what ran and how it differs
    from the paper), verdict (one of VERDICTS) and reason (why, in a sentence).

    A verdict that rests on the best of several variants or seeds says so: ``best_of`` names them (e.g.
    "3 GD expert kinds"), and ``default_verdict`` is the verdict of the default one, ``default`` its name.
    """

    ours: str
    setting: str
    verdict: str
    reason: str = ""
    best_of: str = ""
    default: str = ""
    default_verdict: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.default_verdict and self.default_verdict not in VERDICTS:
            raise ValueError(f"default_verdict must be one of {VERDICTS}, got {self.default_verdict!r}")
        if bool(self.default) != bool(self.default_verdict) or (self.default and not self.best_of):
            raise ValueError("a default variant's verdict needs best_of, default and default_verdict together")

    @property
    def verdict_text(self) -> str:
        """The verdict as the claims table prints it: with what it is the best of, and the default's verdict."""
        if not self.best_of:
            return self.verdict
        beside = f"; {self.default}: {self.default_verdict}" if self.default else ""
        return f"{self.verdict} (best of {self.best_of}{beside})"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Cell:
    """A finished cell: its config, its numbers and the file it came from."""

    key: str
    config: dict
    result: dict
    seconds: float = 0.0


@dataclass(frozen=True)
class Experiment:
    """A named grid of cells and the claims it tests (see the module docstring)."""

    name: str
    help: str
    claims: tuple[Claim, ...]
    grid: Callable[[str], list[dict]]
    run_cell: Callable[[dict], dict]
    summarize: Callable[[list[Cell]], dict]
    plot: Optional[Callable[[dict, list[Cell]], dict]] = None
    threads: Optional[int] = 1
    """torch threads for the run (None: torch's default). Small cells run fastest on one thread."""
    tags: tuple[str, ...] = field(default=())
    devices: tuple[str, ...] = ("cpu",)
    """Device types its cells can put their work on (:func:`run`'s ``device``, read with :func:`cell_device`)."""
    stale: Optional[Callable[[Cell], Optional[str]]] = None
    """Why a finished cell no longer matches what its config would run now (e.g. its config names a preset
    that has changed since), or None when it does: a resumed run reruns such a cell (:func:`run`)."""


CPU_OR_CUDA = ("cpu", "cuda")
"""``devices`` of an experiment whose cells run on either (the cost searches, the SSFR transformers)."""

REGISTRY: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
    """Add an experiment to :data:`REGISTRY` (names are unique) and return it."""
    if experiment.name in REGISTRY and REGISTRY[experiment.name] is not experiment:
        raise ValueError(f"experiment {experiment.name!r} is registered twice")
    REGISTRY[experiment.name] = experiment
    return experiment


def get(name: str) -> Experiment:
    if name not in REGISTRY:
        raise ValueError(f"unknown experiment {name!r}; choose from {sorted(REGISTRY)}")
    return REGISTRY[name]


def set_threads(threads: Optional[int]) -> None:
    """The one thread-count switch for experiments: torch intra-op threads (None leaves torch's default)."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)


def cell_key(config: dict) -> str:
    """A stable file name for a config: short readable prefix + hash of its canonical JSON."""
    canonical = json.dumps(clean_json(config), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha1(canonical.encode()).hexdigest()[:12]
    readable = "_".join(f"{k}-{v}" for k, v in sorted(config.items()) if isinstance(v, (int, float, str)))
    readable = "".join(c if c.isalnum() or c in "-_." else "-" for c in readable)[:60]
    return f"{readable}_{digest}" if readable else digest


def parse_shard(text: Optional[str]) -> Optional[tuple[int, int]]:
    """"i/N" (1 <= i <= N) -> (i, N); None -> None."""
    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"shard must look like i/N, got {text!r}") from None
    if not 1 <= i <= n:
        raise ValueError(f"shard i/N needs 1 <= i <= N, got {text!r}")
    return i, n


def cells_dir(out: PathLike, name: str) -> Path:
    return Path(out) / name / "cells"


_PARTIAL: ContextVar[Optional[Path]] = ContextVar("factkernels_partial_cell", default=None)


def partial_path() -> Optional[Path]:
    """The file where the cell :func:`run` is running may keep partial progress (``OUT/NAME/partial/KEY.json``;
    it may not exist yet; other suffixes of the same name are the cell's too), or None outside a run. Kept on
    resume, removed when the cell is written."""
    return _PARTIAL.get()


def shared_partial_path(tag: dict) -> Optional[Path]:
    """A file for work that several cells of the running experiment share, named by ``tag`` (a JSON-able
    dict saying what it holds): ``OUT/NAME/partial/shared-KEY.json`` (other suffixes of the name, and a
    folder of the name without one, are its too), or None outside a run. The cells that write and read it must
    check that it holds what they need (e.g. a :class:`~factkernels.hf.checkpoint.ChunkCheckpoint`
    fingerprint). Kept on resume and by fresh runs; removed once every cell of the grid is present."""
    partial = _PARTIAL.get()
    return None if partial is None else partial.parent / f"shared-{cell_key(tag)}.json"


def other_cell(config: dict) -> tuple[Optional[dict], Optional[Path]]:
    """Another cell of the running experiment, named by its config, for cells that can reuse its work:
    its result if its file is written (else None) and its :func:`partial_path` file (may not exist);
    (None, None) outside a run."""
    partial = _PARTIAL.get()
    if partial is None:
        return None, None
    key = cell_key(config)
    cell = partial.parent.parent / "cells" / f"{key}.json"
    return (read_json(cell, "result")["result"] if cell.exists() else None), partial.parent / f"{key}.json"


_DEVICE: ContextVar[torch.device] = ContextVar("factkernels_cell_device", default=torch.device("cpu"))
_LOG_LABEL: ContextVar[Optional[str]] = ContextVar("factkernels_cell_log", default=None)


def note(text: str) -> None:
    """One line in the log of the cell :func:`run` is running (progress inside a cell that takes hours), when
    the run logs: not quiet, and stderr is no terminal (a terminal shows the bar instead); else nothing."""
    label = _LOG_LABEL.get()
    if label is not None:
        log_line(f"{label}: {text}")


def cell_device() -> torch.device:
    """Where the cell :func:`run` is running puts its tensors (its ``device``; the CPU outside a run)."""
    return _DEVICE.get()


def _check_device(experiment: Experiment, device: Union[str, torch.device, None]) -> torch.device:
    target = torch.device("cpu" if device is None else device)
    if target.type not in experiment.devices:
        raise ValueError(f"experiment {experiment.name!r} runs its cells on {list(experiment.devices)}, not {target}")
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {target} asked for, but torch sees no CUDA device (torch.cuda.is_available() is False)")
    return target


def _drop_partial(partial: Path) -> None:
    for path in partial.parent.glob(partial.stem + ".*"):  # keys hold only [A-Za-z0-9._-]
        path.unlink()


class ResultFileError(ValueError):
    """A file in an experiment's output folder that is not what the engine writes; the message names the file
    and the bad entry (the command line prints it as one line)."""


def read_json(path: PathLike, *fields: str) -> dict:
    """The JSON object in ``path``, which must hold ``fields``; :class:`ResultFileError` otherwise."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ResultFileError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    if not isinstance(data, dict):
        raise ResultFileError(f"{path}: expected a JSON object, got {type(data).__name__}")
    missing = [f for f in fields if f not in data]
    if missing:
        raise ResultFileError(f"{path}: no {', '.join(repr(f) for f in missing)} entry")
    return data


def load_cells(out: PathLike, name: str) -> dict[str, Cell]:
    """Every finished cell of experiment ``name`` under ``out``, by key."""
    found = {}
    for path in sorted(cells_dir(out, name).glob("*.json")):
        data = read_json(path, "key", "config", "result")
        found[data["key"]] = Cell(data["key"], data["config"], data["result"], data.get("seconds", 0.0))
    return found


def _write_cell(out: PathLike, name: str, key: str, config: dict, result: dict, seconds: float) -> Path:
    path = cells_dir(out, name) / f"{key}.json"
    payload = {"experiment": name, "key": key, "config": config, "result": result, "seconds": seconds,
               "device": str(cell_device()), "environment": environment()}
    write_json(path, payload, indent=1)
    return path


def write_json(path: Path, payload: dict, indent: Optional[int] = None) -> None:
    """Write :func:`clean_json` of ``payload`` to ``path`` through a temporary file, so a killed run never
    leaves half a file (cells, and the partial files of :func:`partial_path`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(clean_json(payload), indent=indent, allow_nan=False))
    tmp.replace(path)


@dataclass
class RunResult:
    """What :func:`run` did: cells in the grid, run now (``stale``: those of them rerun because the finished cell
    was stale, key -> why), kept from before, and the summary if complete."""

    experiment: str
    total: int
    ran: int
    kept: int
    missing: int
    summary: Optional[dict]
    files: list[str]
    stale: dict[str, str] = field(default_factory=dict)


def matches(config: dict, only: dict) -> bool:
    """Whether a cell config has every ``only`` field at the given value (a sub-grid filter);
    None (JSON null) matches a field the config does not have."""
    return all(config.get(k) == v for k, v in only.items())


def parse_fields(items: Optional[Iterable[str]], option: str = "--only") -> dict:
    """["n_facts=100", "method=memit"] -> {"n_facts": 100, "method": "memit"} (values read as JSON, else
    text); ``option`` names the command-line option in errors."""
    fields = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{option} takes KEY=VALUE, got {item!r}")
        try:
            fields[key] = json.loads(text)
        except json.JSONDecodeError:
            fields[key] = text
    return fields


def with_overrides(configs: list[dict], overrides: dict) -> list[dict]:
    """``configs`` with each ``overrides`` field replaced in every config that has it (a grid run at
    another setting, e.g. the seed grid at a smaller d), cells made equal by it kept once; a field no
    config has is an error."""
    for key in overrides:
        if not any(key in c for c in configs):
            raise ValueError(f"no cell config has the field {key!r} to override")
    changed = [{**c, **{k: v for k, v in overrides.items() if k in c}} for c in configs]
    return list({cell_key(c): c for c in changed}.values())


def run(name: str, out: PathLike, *, scale: str = "quick", shard: Optional[tuple[int, int]] = None,
        resume: bool = False, threads: Optional[int] = None, quiet: bool = False,
        grid: Optional[list[dict]] = None, only: Optional[dict] = None,
        overrides: Optional[dict] = None, device: Union[str, torch.device, None] = None) -> RunResult:
    """Run experiment ``name`` at ``scale`` into ``out`` (see the module docstring).

    resume: keep cells already on disk (default: recompute them), except those the experiment's ``stale`` hook
    says no longer match their config: they run again (one log line each, even when quiet, names the cell and
    why), their old file kept until the new one replaces it. shard: (i, N) runs every N-th cell.
    grid: run these configs instead of ``experiment.grid(scale)``. only: run the sub-grid of cells
    whose config has these field values (e.g. {"n_facts": 100}); its summary covers every cell of
    the full grid present on disk. overrides: replace these config fields in every cell of the grid
    before filtering (:func:`with_overrides`); the cells' keys, hence their files, change with them.
    device: where the cells put their work (default the CPU; one of the experiment's ``devices``). It is
    recorded in each cell file but is not part of the key: a cell is the same protocol on any device (its
    numbers differ by float rounding), so a run on a GPU resumes, or completes, a grid begun on a CPU.
    Returns a :class:`RunResult`; the summary is written once every cell of the (sub-)grid is on disk.
    """
    experiment = get(name)
    target = _check_device(experiment, device)
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    configs = experiment.grid(scale) if grid is None else grid
    if overrides:
        configs = with_overrides(configs, overrides)
    full_keys = [cell_key(c) for c in configs]
    if only:
        configs = [c for c in configs if matches(c, only)]
        if not configs:
            raise ValueError(f"no cell of {name!r} at scale {scale!r} has {only}")
    keys = [cell_key(c) for c in configs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"experiment {name!r} has duplicate cells in its {scale} grid")
    mine = [(k, c) for idx, (k, c) in enumerate(zip(keys, configs)) if shard is None or idx % shard[1] == shard[0] - 1]
    done = load_cells(out, name) if resume else {}
    stale = {k: why for k, _ in mine if k in done and experiment.stale is not None
             and (why := experiment.stale(done[k])) is not None}
    for key, why in stale.items():
        log_line(f"{name} cell {key} is stale, running it again: {why}")
    todo = [(k, c) for k, c in mine if k not in done or k in stale]
    set_threads(threads if threads is not None else experiment.threads)
    bar = progress_bar(todo, desc=name, enabled=not quiet, unit="cell")
    logs = not quiet and bar.disable  # stderr is a log file: a line per cell instead of a bar
    for index, (key, config) in enumerate(bar, 1):
        bar.set_postfix_str(key[:40])
        partial = Path(out) / name / "partial" / f"{key}.json"
        if not resume:
            _drop_partial(partial)  # a fresh run recomputes everything
        label = f"{name} cell {index}/{len(todo)}"
        if logs:
            resuming = " (resuming its partial file)" if partial.exists() else ""
            log_line(f"{label} {key}: started on {target}{resuming}")
        tokens = _PARTIAL.set(partial), _DEVICE.set(target), _LOG_LABEL.set(label if logs else None)
        start = time.perf_counter()
        try:
            result = experiment.run_cell(dict(config))
            _write_cell(out, name, key, config, result, time.perf_counter() - start)
        finally:
            for var, token in zip((_PARTIAL, _DEVICE, _LOG_LABEL), tokens):
                var.reset(token)
        if logs:
            log_line(f"{label}: written after {time.perf_counter() - start:.0f} s")
        _drop_partial(partial)
    present = load_cells(out, name)
    missing = [k for k in keys if k not in present]
    summary, files = None, []
    if all(k in present for k in full_keys):  # the whole grid is done: nothing left to share
        for path in (Path(out) / name / "partial").glob("shared-*"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    if not missing:
        summary, files = summarize_dir(name, out, keys=[k for k in full_keys if k in present] if only else keys)
    return RunResult(name, len(keys), len(todo), len(mine) - len(todo), len(missing), summary, files, stale)


def summarize_dir(name: str, out: PathLike, *, keys: Optional[Iterable[str]] = None) -> tuple[dict, list[str]]:
    """Summarize the cells of ``name`` under ``out`` (only ``keys`` when given); write summary.json + PNGs."""
    from .plotting import save_figure  # matplotlib only when a summary is written

    experiment = get(name)
    present = load_cells(out, name)
    cells = [present[k] for k in keys] if keys is not None else list(present.values())
    summary = experiment.summarize(cells)
    claims = summary.get("claims", {})
    unknown = set(claims) - {c.id for c in experiment.claims}
    if unknown:
        raise ValueError(f"{name}: summary names claims it does not declare: {sorted(unknown)}")
    summary["claims"] = {k: (v.to_dict() if isinstance(v, Finding) else Finding(**v).to_dict())
                         for k, v in claims.items()}
    folder = Path(out) / name
    files = []
    if experiment.plot is not None:
        for fig_name, fig in experiment.plot(summary, cells).items():
            files.append(save_figure(fig, folder, fig_name).name)  # beside summary.json: no machine's folders
    payload = {"experiment": name, "claims_tested": [asdict(c) for c in experiment.claims], "cells": len(cells),
               "summary": summary, "figures": files, "environment": environment()}
    path = folder / "summary.json"
    path.write_text(json.dumps(clean_json(payload), indent=2, allow_nan=False))
    return summary, [str(path), *files]


def merge(sources: Iterable[PathLike], out: PathLike) -> int:
    """Copy every cell file under each source folder (any experiment) into ``out``; return how many."""
    copied = 0
    for src in sources:
        for path in Path(src).glob("*/cells/*.json"):
            dest = Path(out) / path.parent.parent.name / "cells" / path.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            copied += 1
    return copied


__all__ = ["Cell", "Claim", "Experiment", "Finding", "REGISTRY", "RunResult", "SCALES", "VERDICTS", "cell_device", "cell_key",
           "clean_json", "get",
           "load_cells", "matches", "merge", "other_cell", "parse_fields", "parse_shard", "partial_path", "read_json",
           "register", "ResultFileError", "run", "set_threads",
           "shared_partial_path", "summarize_dir", "write_json"]
