"""Chunk checkpoints: the finished chunks of a long per-request computation, kept in one safetensors file.

Optimising residual deltas through a 30-layer model takes hours for 1,000 requests on a CPU. Requests (or
subjects: :func:`resumable_subject_fit`) are independent there, so the work runs in chunks and each finished
chunk is written at once; run again with the same file, the chunks it holds are read instead of computed. The
file records a fingerprint of what it was made for (model, layer, token ids, settings) and is refused for anything
else. Independent chunks also run at once: the subject values' chunks on several workers (:func:`in_parallel`).

File: tensors "{start}/{name}" per chunk (``start`` = the chunk's first request, or subject), metadata
{"fingerprint", "infos": {start: info dict}}; rewritten whole and atomically after each chunk.
"""

from __future__ import annotations

import copy
import hashlib
import json
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch

from ..progress import progress_bar
from .capture import PromptBatch, model_device
from .layout import mlp_module


# Config fields that say where the model was loaded from and by which transformers, not what it computes: a
# checkpoint made before a reinstall (another path or version) stays readable.
LOAD_METADATA = ("_name_or_path", "transformers_version")


def fingerprint(model: Any, layer: int, tensors: Sequence[torch.Tensor], settings: dict) -> str:
    """A digest of the model (config less :data:`LOAD_METADATA`, and ``layer``'s down projection),
    ``tensors`` (token ids, positions) and ``settings`` (JSON-able)."""
    digest = hashlib.sha1()
    config = {k: v for k, v in model.config.to_dict().items() if k not in LOAD_METADATA}
    digest.update(json.dumps({"config": config, "layer": layer, "settings": settings},
                             sort_keys=True, default=str).encode())
    for t in (*tensors, mlp_module(model, layer).down_proj.weight):
        digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class ChunkCheckpoint:
    """``chunks``: {start: ({name: tensor}, info)} read from ``path`` (empty when it does not exist yet)."""

    def __init__(self, path: Union[str, Path], fingerprint: str) -> None:
        from safetensors import safe_open

        self.path, self.fingerprint = Path(path), fingerprint
        self.chunks: dict[int, tuple[dict[str, torch.Tensor], dict]] = {}
        if not self.path.exists():
            return
        with safe_open(str(self.path), framework="pt") as fh:
            meta = fh.metadata() or {}
            if meta.get("fingerprint") != fingerprint:
                raise ValueError(f"checkpoint {self.path} was made for other requests, layer, model or settings; "
                                 "remove it or pass another path")
            tensors: dict[int, dict[str, torch.Tensor]] = {}
            for key in fh.keys():
                start, name = key.split("/", 1)
                tensors.setdefault(int(start), {})[name] = fh.get_tensor(key)
        self.chunks = {int(k): (tensors.get(int(k), {}), info) for k, info in json.loads(meta["infos"]).items()}

    def put(self, start: int, tensors: dict[str, torch.Tensor], info: dict) -> None:
        """Keep chunk ``start`` and rewrite the file."""
        from safetensors.torch import save_file

        self.chunks[start] = ({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, info)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")  # a killed run never leaves half a file
        flat = {f"{s}/{name}": t for s, (named, _) in self.chunks.items() for name, t in named.items()}
        save_file(flat, str(tmp), metadata={"fingerprint": self.fingerprint,
                                            "infos": json.dumps({str(s): i for s, (_, i) in self.chunks.items()})})
        tmp.replace(self.path)


# Subjects per chunk of a resumable subject values fit on one worker: ~250 rows, a few CPU minutes at layer 10 of
# SmolLM2-135M.
VALUE_CHUNK_SUBJECTS = 100
WORKERS_AUTO = "auto"


def check_workers(workers: Union[int, str]) -> None:
    """``workers`` is :data:`WORKERS_AUTO` or an int >= 1 (ValueError otherwise)."""
    if workers != WORKERS_AUTO and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be {WORKERS_AUTO!r} or an int >= 1, got {workers!r}")


def value_workers(workers: Union[int, str], model: Any, n_subjects: int) -> int:
    """How many chunks of the values fit run at once (:func:`resumable_subject_fit`): ``workers`` (at most one per
    subject), or for :data:`WORKERS_AUTO` torch's intra-op thread count on a CPU model with two subjects or more,
    else 1. Each worker then runs one intra-op thread: on 2 cores two intra-op threads gave the fit only ~1.15x
    over one (960 validation requests: 52 CPU min in 27 min wall), while its chunks are independent."""
    check_workers(workers)
    if workers == WORKERS_AUTO:
        workers = torch.get_num_threads() if model_device(model).type == "cpu" else 1
    return max(1, min(int(workers), n_subjects))


# Chunks per worker of a values fit on several workers (:func:`subject_chunks`): the workers take them from one
# queue, so the last ones, the smallest, decide how evenly they finish.
CHUNKS_PER_WORKER = 4


def subject_costs(batch: PromptBatch, subject: torch.Tensor) -> torch.Tensor:
    """(S,) float64, per subject with rows (in :func:`torch.unique` order): the tokens its rows run through the
    blocks after the layer at each step of the values fit, from the subject's last token to the row's last scored
    one (:func:`~factkernels.hf.subject_values.fit_subject_deltas`), what a chunk's seconds follow."""
    tokens = (batch.attention_mask.sum(1) - 1 - batch.subject_last).clamp(min=1).double()
    return torch.zeros(int(subject.max()) + 1, dtype=torch.float64).index_add_(0, subject, tokens)[
        torch.unique(subject)]


def subject_chunks(cost: torch.Tensor, workers: int) -> list[torch.Tensor]:
    """The chunks of a values fit on ``workers`` workers, in the order they are taken: each a sorted (k,) long of
    positions into the subjects with rows, whose ``cost`` (S,) is :func:`subject_costs`'. One worker: runs of
    :data:`VALUE_CHUNK_SUBJECTS` consecutive subjects. Several: :data:`CHUNKS_PER_WORKER` per worker (at most one
    per subject), their shares of the cost falling in steps (2 workers: 4:4:3:3:2:2:1:1): the costliest subjects one
    to each chunk, then each of the others, costliest first, into the chunk it fills least as a share of its own;
    taken costliest first, so the workers finish
    within about the last, smallest chunk of each other (equal counts of subjects per chunk left one of two
    workers 27 % idle at 960 requests: benchmarks/results/hf/insert_speed/subject_L10_n960_cpu_w2_quiet28.json).
    Depends on ``cost`` and ``workers`` only: the same chunks on a rerun (checkpoints)."""
    n = len(cost)
    if workers == 1:
        return [torch.arange(s, min(n, s + VALUE_CHUNK_SUBJECTS)) for s in range(0, n, VALUE_CHUNK_SUBJECTS)]
    chunks = min(n, CHUNKS_PER_WORKER * workers)
    share = [-(-(chunks - i) // workers) for i in range(chunks)]
    load, members = [0.0] * chunks, [[] for _ in range(chunks)]
    for rank, s in enumerate(torch.sort(cost, descending=True, stable=True).indices.tolist()):
        best = rank if rank < chunks else min(range(chunks), key=lambda i: ((load[i] + float(cost[s])) / share[i], i))
        load[best] += float(cost[s])
        members[best].append(s)
    order = sorted(range(chunks), key=lambda i: (-load[i], i))
    return [torch.tensor(sorted(members[i]), dtype=torch.long) for i in order]


def shared_replica(model: Any) -> Any:
    """A copy of ``model``'s module tree that holds the same parameter and buffer tensors (no weight is copied):
    one per worker thread, since a fit swaps the decoder's block list
    (:func:`~factkernels.hf.capture.blocks_after`) and hooks its blocks while it runs."""
    return copy.deepcopy(model, {id(t): t for t in (*model.parameters(), *model.buffers())})


def resumable_subject_fit(fit: Callable[..., tuple[torch.Tensor, dict]], model: Any, batch: PromptBatch,
                          subject: torch.Tensor, layer: int, *, checkpoint: Union[str, Path, None] = None,
                          essence: Optional[torch.Tensor] = None, init: Optional[torch.Tensor] = None,
                          subjects_per_chunk: Optional[int] = None, workers: int = 1,
                          **options: Any) -> tuple[torch.Tensor, dict]:
    """``fit`` (:func:`~factkernels.hf.subject_values.fit_subject_deltas`) in chunks of the subjects with rows
    (default :func:`subject_chunks` of their :func:`subject_costs`; ``subjects_per_chunk``: runs of that many
    consecutive subjects), ``workers`` chunks at once (:func:`in_parallel`: threads, each on one intra-op thread
    and its own :func:`shared_replica` of the model, taking the chunks in order from one queue). With
    ``checkpoint`` (a .safetensors file, or a folder: then a file in it named by the fingerprint) each chunk's δ
    is written the moment it is done and read back instead of fit on a rerun. A subject's δ sees only its own
    rows and Adam is elementwise (a subject at the margin stays frozen), so chunks give one joint fit's δ up to
    float rounding, in whatever order they finish. The file records the model (every weight), layer, rows,
    settings and chunks and is refused for others. A chunk that fails raises RuntimeError naming its subjects
    (from the error); the chunks already running finish and are written, the others are not started.
    subject (R,) 0..S-1; essence (R,) bool; init (S, d): the δ to start from (default zeros; a subject without
    rows keeps it); options: fit's (margin, steps, lr, batch_size,
    progress, essence_weight; on several workers a bar over the chunks replaces the fit's own). Returns δ (S, d)
    and fit's info (steps: the most of any chunk) with "value_workers", "value_chunks", and per chunk in the
    order taken: wall and CPU seconds ("value_chunk_seconds", "value_chunk_cpu": a worker's own; how evenly the
    workers were loaded), "value_chunk_steps", "value_chunk_tokens" (its :func:`subject_costs`),
    "value_chunk_worker" (which worker ran it, 0.., as read back for restored chunks); fit's "value_tokens_graph" and
    "value_tokens_measured" summed over the chunks, "value_subject_steps" per subject (S,); and
    "value_restored_seconds" / "value_restored_cpu": wall and CPU seconds earlier runs spent on chunks read back
    (a chunk's wall divided by the workers that ran beside it)."""
    essence = torch.zeros(len(batch), dtype=torch.bool) if essence is None else essence.cpu().bool()
    present, width = torch.unique(subject), model.config.hidden_size  # sorted
    cost = subject_costs(batch, subject)
    if subjects_per_chunk is None:
        plan = subject_chunks(cost, workers)
        split = ({"subjects_per_chunk": VALUE_CHUNK_SUBJECTS} if workers == 1
                 else {"chunks": [c.tolist() for c in plan]})
    else:
        plan = [torch.arange(s, min(len(present), s + subjects_per_chunk))
                for s in range(0, len(present), subjects_per_chunk)]
        split = {"subjects_per_chunk": subjects_per_chunk}
    plan = {int(c[0]): c for c in plan}  # a chunk's key: its first subject (position in ``present``)
    chunks: dict[int, tuple[dict[str, torch.Tensor], dict]] = {}  # key: ({"delta": (k, d)}, info), done ones
    saved = None
    if checkpoint is not None:
        settings = {k: options.get(k) for k in ("margin", "steps", "lr", "essence_weight")}
        key = fingerprint(model, layer, (batch.input_ids, batch.attention_mask, batch.subject_last,
                                         batch.prompt_last, batch.target_len, subject, essence,
                                         *(() if init is None else (init,)), *model.parameters()),
                          {**settings, **split})
        path = Path(checkpoint)
        saved = ChunkCheckpoint(path if path.suffix == ".safetensors" else path / f"values_{key[:20]}.safetensors",
                                key)
        chunks.update(saved.chunks)
    restored = [sum(i["seconds"] / i.get("workers", 1) for _, i in chunks.values()),
                sum(i["cpu"] for _, i in chunks.values())]
    todo = [start for start in plan if start not in chunks]
    several = workers > 1 and len(todo) > 1
    chunk_options = {**options, "progress": False} if several else options  # then a bar over the chunks

    def fit_chunk(start: int, on: Any) -> tuple[dict[str, torch.Tensor], dict]:
        """The δ and info of chunk ``start``'s subjects, fit on ``on`` (the model or a replica)."""
        ours = present[plan[start]]
        clock = time.thread_time if several else time.process_time  # a worker's own CPU seconds
        t, c = time.perf_counter(), clock()
        rows = torch.isin(subject, ours).nonzero().flatten()
        try:
            part, info = fit(on, batch.rows(rows), torch.searchsorted(ours, subject[rows]), layer,
                             essence=essence[rows], init=torch.zeros(len(ours), width) if init is None else init[ours],
                             **chunk_options)
        except Exception as err:
            named = (f"{int(ours[0])}..{int(ours[-1])}" if int(ours[-1] - ours[0]) == len(ours) - 1
                     else ", ".join(map(str, ours.tolist())))
            raise RuntimeError(f"the values fit of subjects {named} failed: {err!r}") from err
        worker = int(threading.current_thread().name.rsplit("_", 1)[-1]) if several else 0
        return {"delta": part.detach()}, {**info, "seconds": time.perf_counter() - t, "cpu": clock() - c,
                                          "workers": workers if several else 1, "worker": worker}

    def keep(start: int, tensors: dict[str, torch.Tensor], info: dict) -> None:
        """Keep a finished chunk (and write the checkpoint at once)."""
        if saved is not None:
            saved.put(start, tensors, info)
        chunks[start] = (tensors, info)

    if several:
        in_parallel(model, todo, fit_chunk, keep, workers, progress=options.get("progress", True), layer=layer)
    else:
        for start in todo:
            keep(start, *fit_chunk(start, model))
    deltas = (torch.zeros(int(subject.max()) + 1, width) if init is None else init.detach().clone()).to(
        model_device(model))
    infos = [chunks[start][1] for start in plan]
    for start, (tensors, _) in chunks.items():
        deltas[present[plan[start]].to(deltas.device)] = tensors["delta"].to(deltas)
    margins = [i["value_min_margin"] for i in infos if i["value_min_margin"] is not None]
    subject_steps = [0] * len(deltas)
    for start in plan:
        for s, n in zip(present[plan[start]].tolist(), chunks[start][1].get("value_subject_steps", [])):
            subject_steps[s] = n
    return deltas, {"value_steps": max(i["value_steps"] for i in infos), "value_min_margin": min(margins, default=None),
                    "value_chunks": len(infos), "value_workers": workers if several else 1,
                    "value_chunk_seconds": [round(i["seconds"], 3) for i in infos],
                    "value_chunk_cpu": [round(i["cpu"], 3) for i in infos],
                    "value_chunk_steps": [i["value_steps"] for i in infos],
                    "value_chunk_tokens": [int(cost[plan[start]].sum()) for start in plan],
                    "value_chunk_worker": [i.get("worker", 0) for i in infos],
                    **{k: sum(i.get(k, 0) for i in infos) for k in ("value_tokens_graph", "value_tokens_measured")},
                    "value_subject_steps": subject_steps,
                    "value_restored_seconds": restored[0], "value_restored_cpu": restored[1]}


def in_parallel(model: Any, starts: Sequence[int], fit_chunk: Callable[[int, Any], tuple[dict, dict]],
                keep: Callable[[int, dict, dict], None], workers: int, *, progress: bool, layer: int) -> None:
    """``keep(start, *fit_chunk(start, replica))`` for every start, ``workers`` threads at once, each on its own
    replica of ``model`` and one torch intra-op thread (torch ops release the GIL; CPU autograd runs backward on
    the calling thread); ``keep`` one chunk at a time (a lock), as each finishes. The model's weights stay
    frozen throughout: each fit freezes and thaws them itself, and one thawing them under another would give
    the other weight gradients."""
    replicas: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(workers):
        replicas.put(shared_replica(model))
    lock = threading.Lock()

    def one(start: int) -> None:
        replica = replicas.get()
        try:
            result = fit_chunk(start, replica)
        finally:
            replicas.put(replica)
        with lock:
            keep(start, *result)

    thawed = [p for p in model.parameters() if p.requires_grad]
    threads = torch.get_num_threads()
    for p in thawed:
        p.requires_grad_(False)
    torch.set_num_threads(1)  # a new thread's first parallel op takes torch's count at that time
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="values") as pool:
            futures = [pool.submit(one, start) for start in starts]
            try:
                for done in progress_bar(as_completed(futures), total=len(futures), enabled=progress, leave=False,
                                         desc=f"subject values at layer {layer}, {workers} workers"):
                    done.result()
            finally:  # on an error (or Ctrl-C) the chunks not started never start; the running ones finish
                for future in futures:
                    future.cancel()
    finally:
        torch.set_num_threads(threads)
        for p in thawed:
            p.requires_grad_(True)
