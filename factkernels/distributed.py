"""Construction across processes (torch.distributed: gloo on CPU, NCCL on GPU).

Facts are sharded by rows: each rank holds its keys K_r (F_r, d_in) and facts f_r, and
every rank holds all values V. The gate scale, the whitening W_s, W_p (second moments of
the gate features and keys) and F come from all-reduces of small sums; the matrix-free CG
(:func:`factkernels.solvers.solve_cg`) runs on the local rows, its product ``M̃ᵀ p`` (an
m×h̃(d+1) block) all-reduced once per iteration together with the output bias, plus 2m
scalars. The solved weights are then the same on every rank, and verification is sharded
(each rank decodes its own facts, the counts are all-reduced).

Launch with torchrun (one process per GPU or CPU slot), e.g.
``torchrun --nproc-per-node 2 -m factkernels construct --dim 128 --facts 16384 --solver cg --distributed``.
"""

from __future__ import annotations

import time
from typing import Optional, Union

import torch
import torch.distributed as dist

from . import _ops
from .decoder import OUTPUTS, check_decodable, choose_m, code_margins, decoder_failures, output_embeddings
from .encoder import GatedEncoder, assemble, augment, encoder_codes, gadget_width, sample_gate
from .mlp import FactMLP
from .report import ConstructionReport, FactStorageError
from .solvers import GadgetOperator, cg_iterations_hint, solve_cg, whitening
from .validation import check_choice, check_facts, check_matrix, check_positive_int


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)
    return t


def shard_rows(num_rows: int, rank: int, world_size: int) -> slice:
    """Rows [start, stop) of ``rank`` when num_rows are split into world_size near-equal shards."""
    base, extra = divmod(num_rows, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (rank < extra))


def construct_sharded(
    K: torch.Tensor,
    V: torch.Tensor,
    f: torch.Tensor,
    m: Union[int, None] = None,
    *,
    outputs: str = "margin_optimal",
    activation: str = "silu",
    width_multiplier: float = 1.5,
    seed: int = 0,
    backend: str = "auto",
    gate_scale: float = 1.0,
    cg_tol: float = 1e-4,
    cg_max_iter: Optional[int] = None,
    verify: Union[bool, str] = True,
    progress: bool = False,
) -> FactMLP:
    """``construct(..., solver="cg")`` over the ranks of the default process group.

    Args:
        K: (F_r, d_in) this rank's keys; V: (|V|, d_out) all values (same on every rank);
            f: (F_r,) this rank's value indices. Other arguments as in :func:`factkernels.construct`.

    Returns:
        The same FactMLP on every rank, with ``.report`` (a :class:`ConstructionReport`, the schema
        ``construct`` writes: accuracy, failed and min margin over all facts when verified).
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("construct_sharded needs an initialized torch.distributed process group "
                           "(launch with torchrun, or call torch.distributed.init_process_group)")
    check_matrix(K, "K")
    check_matrix(V, "V")
    facts = check_facts(f, K.shape[0], V.shape[0], K.device)
    check_positive_int("m", m, allow_none=True)
    check_choice("outputs", outputs, OUTPUTS)
    _ops.check_activation(activation)
    d_in = K.shape[1]
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()

    # every rank computes the same outputs and decoder (deterministic, replicated)
    out_embed, rho = output_embeddings(V, outputs)
    rho = check_decodable(float(rho), outputs)
    used = torch.zeros(V.shape[0], dtype=torch.float64, device=K.device)
    used[facts] = 1.0
    used = torch.nonzero(_all_reduce(used)).flatten()
    decoder, m_search = choose_m(m, out_embed, V, used, rho, generator, backend)

    sums = _all_reduce(torch.stack([torch.tensor(float(K.shape[0]), dtype=torch.float64, device=K.device),
                                    K.double().square().sum()]))
    num_facts = int(sums[0])
    width = gadget_width(num_facts, d_in, width_multiplier)
    gate = sample_gate(K, width, generator, gate_scale, key_rms=(sums[1] / num_facts).sqrt().to(K.dtype))
    features = _ops.gate_features(K, *gate, activation, backend=backend)
    keys_aug = augment(K)
    ws = whitening(_all_reduce((features.T @ features).double()) / num_facts, K.dtype)
    wp = whitening(_all_reduce((keys_aug.T @ keys_aug).double()) / num_facts, K.dtype)
    op = GadgetOperator(features @ ws, keys_aug @ wp, ws, wp, backend, reduce=_all_reduce)
    alpha, info = solve_cg(op, decoder.codes[facts], tol=cg_tol, progress=progress,
                           max_iter=cg_max_iter or cg_iterations_hint(width_multiplier))
    coef, out_bias = op.unknowns(alpha)  # all-reduced: the same on every rank
    encoder = GatedEncoder(gate_weight=gate[0], gate_bias=gate[1],
                           up_weight=coef[:, :, :d_in].reshape(-1, d_in).contiguous(),
                           up_bias=coef[:, :, d_in].reshape(-1).contiguous(), output_bias=out_bias,
                           gadget_width=width, solve=info)
    mlp = assemble(encoder, decoder.projection, activation=activation, backend=backend)
    report = ConstructionReport(
        num_facts=num_facts, num_values=V.shape[0], d_in=d_in, d_out=V.shape[1], m=decoder.m, m_search=m_search,
        rho=rho, outputs=outputs, hidden=mlp.hidden_size, gadget_width=width,
        width_multiplier=round(width_multiplier, 4), params=mlp.num_parameters, activation=activation,
        solver=info.solver, precision=info.precision, residual=float(info.residual), cg_iterations=info.iterations,
        cg_preconditioner=info.preconditioner, whiten_alpha=0.0, backend=backend, device=str(K.device), verified=verify is not False,
        world_size=dist.get_world_size(),
    )
    if verify is not False:
        codes = encoder_codes(encoder, K, activation=activation, backend=backend, features=features)
        margins = code_margins(codes, decoder.projection, V, facts, backend=backend)  # this shard's facts
        counts = _all_reduce(torch.tensor([float((margins <= 0).sum())], dtype=torch.float64, device=K.device))
        low = torch.tensor([float(margins.min()) if margins.numel() else float("inf")], dtype=torch.float64,
                           device=K.device)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        report.failed, report.min_margin = int(counts[0]), float(low[0])
        report.accuracy = 1.0 - report.failed / num_facts
    report.timings = {"total": time.perf_counter() - start}
    mlp.report = report
    if verify is True and report.failed:
        raise FactStorageError(f"{report.failed} of {num_facts} facts are not stored (min margin "
                               f"{report.min_margin:.3g}); {decoder_failures(decoder, V, used, backend)} values do "
                               "not survive the JL projection", report)
    return mlp


__all__ = ["construct_sharded", "shard_rows"]
