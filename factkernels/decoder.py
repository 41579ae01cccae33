"""The JL decoder (seed 000, Alg. 4 and Thm B.5.3).

A Gaussian D ∈ R^{d×m} compresses output embeddings U (|V|, d) into codes
C = U D (|V|, m); the MLP decodes a code back with D, and D Dᵀ u_j still
dot-product-decodes to v_j when m = O(ρ⁻² log|V|).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import torch

from . import _ops, geometry, ustar
from .encoder import host_to_device
from .memory import VERIFY_CHUNK

OUTPUTS = ("margin_optimal", "values")
M_GROWTH = 1.25  # geometric growth of m while the decoder check fails
SEARCH_SCREEN = 512  # used values an m is first checked on during the search
# Where a host round trip costs more than decoding every used value for each trial of a batch, the search skips
# the sample while a trial decodes at most this many (used value, value) pairs, by device type: on a GPU the
# sample's winner needs one more read back (a stream sync) and ~20 launches for its full check, while a full trial
# at F = |V| = 4,096 is 1.6 GFLOP (~0.03 ms at an H200's 51 TFLOP/s). On a CPU the sample always runs (there the
# full decodes cost ~20 ms each at 4,096 x 4,096).
UNSCREENED_PAIRS = {"cuda": 1 << 24}
SEARCH_BATCH, SEARCH_BATCH_LATER = 4, 2  # trials of m decoded per read back during the search: first, then


@dataclass
class JLDecoder:
    """projection: (d, m) with i.i.d. N(0, 1/m) entries; codes: (|V|, m) = U · projection."""

    projection: torch.Tensor
    codes: torch.Tensor

    @property
    def m(self) -> int:
        return self.projection.shape[1]


def jl_decoder(outputs: torch.Tensor, m: int, generator: torch.Generator) -> JLDecoder:
    """Sample D (d, m) ~ N(0, 1/m) and codes C = U D.  outputs: (|V|, d)."""
    projection = jl_projection(outputs.shape[1], m, generator, outputs)
    return JLDecoder(projection, outputs @ projection)


def jl_projection(d: int, m: int, generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """D (d, m) ~ N(0, 1/m), drawn on the host from ``generator``, in ``like``'s dtype on its device."""
    return host_to_device(torch.randn(d, m, generator=generator, dtype=torch.float64), like) / math.sqrt(m)


def code_margins(codes: torch.Tensor, projection: torch.Tensor, values: torch.Tensor, facts: torch.Tensor, *,
                 backend: str = "auto") -> torch.Tensor:
    """Decode margins (n,) of outputs y_i = P c_i given by their codes: codes (n, m), P = projection (d_out, m)
    (the MLP's down-projection D, or W_V D with whitened values), values (|V|, d_out), facts (n,) int64 checked.

    <P c_i, v_j> = <c_i, Pᵀ v_j>, so with m < d_out the scores are taken in the m-dimensional code space
    against Pᵀ v_j (n·|V|·m instead of n·|V|·d_out multiply-adds); otherwise against v_j. A fact is stored
    iff its margin is > 0 (NaN is not).
    """
    if projection.shape[1] < projection.shape[0]:
        return _ops.decode(codes, values @ projection, facts, backend=backend, target_checked=True)[1]
    return _ops.decode(codes @ projection.T, values, facts, backend=backend, target_checked=True)[1]


def decoder_failures(decoder: JLDecoder, values: torch.Tensor, used: torch.Tensor, backend: str = "auto") -> int:
    """How many of the values ``used`` (indices, (k,)) do not decode to themselves from D c_j."""
    return int(failure_count(decoder, values, used, backend))


def failure_count(decoder: JLDecoder, values: torch.Tensor, used: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """:func:`decoder_failures` as a 0-dim int64 tensor on the device, not read back."""
    margins = code_margins(decoder.codes[used], decoder.projection, values, used, backend=backend)
    return (~(margins > 0)).sum()


def jl_bound(rho: float, num_values: int, delta: float = 0.1) -> int:
    """Thm B.5.3: m ≥ 32 ρ⁻² ln(4|V|(|V|−1)/δ) guarantees decoding with probability ≥ 1 − δ.

    A worst-case bound, loose by orders of magnitude in practice.
    """
    pairs = max(num_values * (num_values - 1), 1)
    return math.ceil(32.0 / rho**2 * math.log(4.0 * pairs / delta))


def initial_m(rho: float, num_values: int) -> int:
    """Empirical starting point ρ⁻² ln|V| for the search over m (the bound's shape, constant 1)."""
    return max(1, math.ceil(math.log(max(num_values, 2)) / rho**2))


def least_m(m: Union[str, None], num_values: int) -> int:
    """The smallest m that :func:`choose_m` can return for m = None (the search's start) or "bound", before ρ is
    known: both fall as ρ grows, and ρ, a normalized cosine, is at most 1."""
    return jl_bound(1.0, num_values) if m == "bound" else initial_m(1.0, num_values)


def output_embeddings(values: torch.Tensor, outputs: Union[str, torch.Tensor], *, backend: str = "auto",
                      checked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Output embeddings U (|V|, d) and their margin ρ (0-dim tensor on the values' device, not read
    back: :func:`check_decodable` reads it) for ``outputs`` = "margin_optimal" (U*), "values" (U = V)
    or a given U. backend: for the streaming margin pass of given outputs ("auto" | "kernels" | "torch").
    checked: the caller has checked the entries of the values and of given outputs (the checks of
    :func:`geometry.output_margins` and :func:`ustar.margin_optimal_outputs` read back, and U*'s rho is then
    left on the device too)."""
    if isinstance(outputs, torch.Tensor):
        margins = geometry.checked_output_margins if checked else geometry.output_margins
        out_embed, rho = outputs, margins(values, outputs, backend=backend).min()
    elif outputs == "margin_optimal":
        out_embed, rho = (ustar.checked_margin_optimal_outputs(values, backend=backend) if checked
                          else ustar.margin_optimal_outputs(values, backend=backend))
        rho = torch.as_tensor(rho, dtype=torch.float64)
    else:
        out_embed, rho = values, geometry.checked_value_margins(values, backend=backend).min()
    return out_embed, rho


def check_decodable(rho: float, outputs: Union[str, torch.Tensor]) -> float:
    """Return ρ, or raise ValueError when ρ <= 0 (some value cannot be decoded with these outputs)."""
    if not rho > 0:
        hint = " (try outputs='margin_optimal')" if isinstance(outputs, str) and outputs == "values" else ""
        label = "the given outputs" if isinstance(outputs, torch.Tensor) else f"outputs={outputs!r}"
        raise ValueError(f"V is not decodable with {label}: rho = {rho:.3g} <= 0{hint}")
    return rho


def choose_m(m: Union[int, str, None], outputs: torch.Tensor, values: torch.Tensor, used: torch.Tensor, rho: float,
             generator: torch.Generator, backend: str) -> tuple[JLDecoder, str]:
    """JL decoder for a given m, for Thm B.5.3's bound (m = "bound"), or (m = None) the smallest m,
    searched geometrically from :func:`initial_m`, whose decoder decodes every value in ``used``.

    outputs: U (|V|, d); values: V (|V|, d); used: (k,) value indices. Returns (decoder, how m was found).
    """
    if isinstance(m, int):
        return jl_decoder(outputs, m, generator), "given"
    if m == "bound":
        bound = jl_bound(rho, values.shape[0])
        return jl_decoder(outputs, bound, generator), "Thm B.5.3 bound (delta=0.1)"
    decoder, tried, found = search_m(initial_m(rho, values.shape[0]), outputs, values, used, generator, backend)
    if not found:
        raise RuntimeError(f"no m up to {tried[-1]} decodes every value; rho={rho:.3g} is too small")
    return decoder, "auto: " + " -> ".join(map(str, tried))


def search_m(start: int, outputs: torch.Tensor, values: torch.Tensor, used: torch.Tensor, generator: torch.Generator,
             backend: str) -> tuple[JLDecoder, list[int], bool]:
    """The first m of start, x1.25, ... (up to 64·d_out) whose JL decoder decodes every value in ``used``:
    (decoder, the m tried, found). Not found: the decoder of the last m, found False.

    outputs: U (|V|, d); values: V (|V|, d); used: (k,) value indices. Draws as many decoders from
    ``generator`` as the sequential search would, whatever the batching below.
    """
    # An m that fails on a sample of the used values fails on all of them: most rejected m cost a
    # |sample| x |V| decode instead of a |used| x |V| one (the m found is the same).
    unscreened = used.numel() * values.shape[0] <= UNSCREENED_PAIRS.get(used.device.type, 0)
    screen = (used[:: max(1, used.numel() // SEARCH_SCREEN)]
              if used.numel() > 2 * SEARCH_SCREEN and not unscreened else None)
    limit = 64 * values.shape[1]
    ladder = [start]
    while ladder[-1] < limit:
        ladder.append(max(ladder[-1] + 1, math.ceil(ladder[-1] * M_GROWTH)))
    # A batch of trials per read back (one host round trip, not one per trial), drawn in the order of the
    # sequential search; the generator is left where that search would leave it, so the build that follows
    # draws the same gate. The first batch covers initial_m's usual undershoot (3-5 trials at |V| = 500-4,096),
    # later ones are smaller, each larger m costing more to decode: on a CPU the batches cost 0.054 vs 0.050
    # CPU s (values) and 0.10 vs 0.085 (U*, 5 trials) at |V| = 4,096 against one trial per read.
    first = 0
    while first < len(ladder):
        size = SEARCH_BATCH if first == 0 else SEARCH_BATCH_LATER
        trials, states = [], []
        for m_trial in ladder[first : first + size]:
            trials.append(jl_decoder(outputs, m_trial, generator))
            states.append(generator.get_state())
        passing = _first_passing(trials, values, used, screen, backend)
        if passing is not None:
            generator.set_state(states[passing])
            return trials[passing], ladder[: first + passing + 1], True
        first += size
    return trials[-1], ladder, False


def _first_passing(trials: list, values: torch.Tensor, used: torch.Tensor, screen, backend: str):
    """Index of the first decoder of ``trials`` under which every used value decodes, or None: the failures of
    all trials on the screen sample (or on all used values when ``screen`` is None) in one read back, then the
    full check of a trial that passed the sample, one read each."""
    counts = torch.stack([failure_count(t, values, used if screen is None else screen, backend) for t in trials])
    for index, failed in enumerate(counts.tolist()):
        if failed == 0 and (screen is None or decoder_failures(trials[index], values, used, backend) == 0):
            return index
    return None


def verify_margins(mlp: torch.nn.Module, keys: torch.Tensor, values: torch.Tensor, facts: torch.Tensor,
                   chunk: int = VERIFY_CHUNK) -> torch.Tensor:
    """Decode margins (F,) of every fact, ``chunk`` keys at a time (bounds the hidden activations).
    facts: (F,) int64, already checked to index ``values`` (nothing is read back from the device)."""
    with torch.no_grad():
        return torch.cat([_ops.decode(mlp(keys[i : i + chunk]), values, facts[i : i + chunk], backend=mlp.backend,
                                      target_checked=True)[1] for i in range(0, keys.shape[0], chunk)])
