"""Input validation shared by every builder: one home for the checks of keys, values and facts.

Builders (``construct``, ``FactBuilder``, ``nongated``, ``twohot``, the baselines) and the
geometry functions call these instead of each keeping a copy; every error is a
``TypeError``/``ValueError`` naming the argument and the fix.
"""

from __future__ import annotations

import math

from typing import Optional, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float64)


def check_positive_int(name: str, value: object, *, allow_none: bool = False) -> None:
    """Raise ValueError unless ``value`` is an int >= 1 (or None when ``allow_none``); bools are rejected."""
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        alternative = " or None" if allow_none else ""
        raise ValueError(f"{name} must be a positive int{alternative}, got {value!r}")


def check_choice(name: str, value: object, choices: Sequence[str]) -> None:
    """Raise ValueError unless ``value`` is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_matrix(x: object, name: str, *, min_rows: int = 1, finite: bool = True) -> torch.Tensor:
    """Check that ``x`` is a float32/float64 (n, d) tensor with n >= min_rows, d >= 1 and (when
    ``finite``) no NaN/Inf; return it unchanged."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of shape (n, d), got {type(x).__name__}; "
            f"convert with torch.as_tensor({name}, dtype=torch.float32)"
        )
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}; convert with {name}.float()")
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty 2-D tensor of shape (n, d) (rows = embeddings), "
                         f"got shape {tuple(x.shape)}")
    if x.shape[0] < min_rows:
        raise ValueError(f"{name} must have at least {min_rows} rows (values), got shape {tuple(x.shape)}")
    # (the largest |entry| is NaN or Inf iff some entry is: three launches on a GPU, isfinite(x).all() five)
    if finite and not bool(x.abs().amax() < math.inf):
        raise ValueError(f"{name} contains NaN or Inf entries; remove or replace them")
    return x


def first_duplicate(t: torch.Tensor) -> Optional[tuple[int, int]]:
    """(i, j): the first row i of t (n, d) that has an equal row, and the next such row j > i; None
    when all rows differ. Exact (equal means equal coordinates, -0.0 == 0.0, as ``==``), so it does not
    depend on how a product rounds.

    Rows are grouped by an exact integer hash of their bits and one sort of n keys, not a
    lexicographic row sort (torch's ``unique(dim=0)`` compares rows one by one on a CPU: 8,000
    tensor ops for 4,096 rows). Rows with equal keys are compared exactly; should two different
    rows ever share a key (probability ~n² 2⁻⁴², far below one in a million at n = 4,096), the rows
    are sorted lexicographically instead."""
    if t.shape[0] < 2:
        return None
    order, same = _key_neighbours(t)
    if not bool(same.any()):
        return None
    if not bool((t[order[1:][same]] == t[order[:-1][same]]).all()):
        return _first_duplicate_sorted(t)  # a key shared by different rows
    run = torch.cat([same.new_zeros(1), same]).logical_not_().cumsum(0) - 1  # run of equal keys, in key order
    group = torch.empty_like(run)
    group[order] = run
    return _first_of_groups(group, torch.bincount(run))


def _key_neighbours(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(order (n,), same (n - 1,)): the rows of t (n >= 2, d) in the order of their keys, and whether each
    row's key equals the next one's. Nothing is read back from the device."""
    keys = _row_keys(t)
    order = torch.argsort(keys, stable=True)
    return order, keys[order[1:]] == keys[order[:-1]]


def may_have_duplicates(t: torch.Tensor) -> torch.Tensor:
    """0-dim bool on t's device, not read back: False when the rows of t (n, d) are distinct; True when two
    rows share a key (equal rows, or with probability ~n² 2⁻⁴² a collision: :func:`first_duplicate` decides)."""
    if t.shape[0] < 2:
        return torch.zeros((), dtype=torch.bool, device=t.device)
    return _key_neighbours(t)[1].any()


# Bits of a coordinate in 16-bit chunks times weights below 2**21: every product is an integer below 2**37
# and a sum of at most 2**16 of them is exact in float64, so one GEMM hashes a block of columns exactly.
_CHUNK_BITS, _WEIGHT_BITS, _COLUMNS_PER_BLOCK, _KEY_PRIME = 16, 21, 1 << 16, (1 << 31) - 1


def _row_keys(t: torch.Tensor) -> torch.Tensor:
    """(n,) int64 keys of the rows of t (n, d): equal rows (``==``) get equal keys; two different rows
    the same key with probability < 2⁻⁴² (two random linear hashes of the coordinates' bit chunks)."""
    bits = (t + 0.0).view(torch.int32 if t.element_size() == 4 else torch.int64)  # + 0.0 turns -0.0 into 0.0
    shifts = torch.arange(0, 8 * t.element_size(), _CHUNK_BITS, device=t.device, dtype=bits.dtype)
    num_chunks = t.shape[1] * shifts.numel()
    # drawn where they are used: a host draw copied to a GPU would synchronize the stream (the keys need not
    # agree across devices)
    weights = torch.randint(1 << _WEIGHT_BITS, (num_chunks, 2), generator=torch.Generator(t.device).manual_seed(0),
                            dtype=torch.float64, device=t.device)
    columns = _COLUMNS_PER_BLOCK // shifts.numel()
    rows = max(1, (1 << 22) // min(num_chunks, _COLUMNS_PER_BLOCK))  # temporaries of ~32 MB
    hashes = torch.zeros(t.shape[0], 2, dtype=torch.int64, device=t.device)
    for c in range(0, t.shape[1], columns):
        w = weights[c * shifts.numel() : (c + columns) * shifts.numel()]
        for r in range(0, t.shape[0], rows):
            chunks = (bits[r : r + rows, c : c + columns, None] >> shifts).bitwise_and_(0xFFFF)
            hashes[r : r + rows] += (chunks.flatten(1).to(torch.float64) @ w).to(torch.int64) % _KEY_PRIME
    hashes %= _KEY_PRIME
    return hashes[:, 0] * _KEY_PRIME + hashes[:, 1]


def _first_duplicate_sorted(t: torch.Tensor) -> Optional[tuple[int, int]]:
    """:func:`first_duplicate` by a lexicographic sort of the rows (exact whatever the keys)."""
    _, group, counts = torch.unique(t, dim=0, return_inverse=True, return_counts=True)
    if int(counts.max()) == 1:
        return None
    return _first_of_groups(group, counts)


def _first_of_groups(group: torch.Tensor, counts: torch.Tensor) -> tuple[int, int]:
    """The first row whose group (group: (n,) group ids, counts: rows per group) has another row, and that row."""
    repeated = torch.nonzero(counts[group] > 1).flatten()
    first = int(repeated[0])
    second = int(repeated[1:][group[repeated[1:]] == group[first]][0])
    return first, second


def check_facts(facts: object, num_keys: int, num_values: int, device: torch.device, name: str = "f", *,
                check_range: bool = True) -> torch.Tensor:
    """Check a fact map (num_keys,) of value indices in [0, num_values) on ``device``; return it as int64.
    check_range: also check the indices (one read back from the device)."""
    if not isinstance(facts, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of value indices, got {type(facts).__name__}")
    if facts.dtype.is_floating_point or facts.dtype.is_complex or facts.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {facts.dtype}")
    if facts.dim() != 1 or facts.shape[0] != num_keys:
        raise ValueError(f"{name} must have shape ({num_keys},) (one value index per key), got {tuple(facts.shape)}")
    if facts.device != device:
        raise ValueError(f"{name} is on {facts.device} but K is on {device}; use one device")
    if check_range and facts.numel() and (int(facts.min()) < 0 or int(facts.max()) >= num_values):
        raise ValueError(f"{name} must index values in [0, {num_values}), "
                         f"got range [{int(facts.min())}, {int(facts.max())}]")
    return facts.to(torch.int64)


def check_distinct(t: torch.Tensor, name: str) -> None:
    """Raise ValueError naming the first pair of equal rows of t (n, d)."""
    dup = first_duplicate(t)
    if dup is not None:
        _raise_duplicate(name, *dup)


def check_distinct_added(rows: torch.Tensor, added: torch.Tensor, name: str) -> None:
    """Raise ValueError naming the first pair of equal rows of ``[rows; added]`` when ``rows`` (n, d) are
    distinct already. A row of ``added`` (k, d) equal to one of ``rows`` shares its first coordinate, so only
    those rows are compared exactly: O((n + k) log k) instead of sorting all n + k rows of d coordinates."""
    near = torch.nonzero(torch.isin(rows[:, 0], added[:, 0])).flatten()
    dup = first_duplicate(torch.cat([rows[near], added]))
    if dup is not None:
        positions = torch.cat([near, torch.arange(rows.shape[0], rows.shape[0] + added.shape[0], device=near.device)])
        _raise_duplicate(name, int(positions[dup[0]]), int(positions[dup[1]]))


def _raise_duplicate(name: str, first: int, second: int) -> None:
    if name == "V":
        raise ValueError(f"V has duplicate rows {first} and {second}: rho(V) = 0, no MLP can tell them apart")
    raise ValueError(f"{name} has duplicate rows {first} and {second}: keys must be distinct (generic)")


def input_problems(keys: torch.Tensor, values: torch.Tensor, facts: torch.Tensor, *,
                   value_duplicates: bool = True) -> torch.Tensor:
    """(4,) bool on the device, nothing read back: whether K or V has a NaN/Inf entry, f has an index outside
    [0, |V|), V may have equal rows, K may have equal rows (:func:`may_have_duplicates`). Shapes, dtypes and
    devices are checked already (:func:`validate_inputs` with ``deferred=True``). value_duplicates=False: V's
    flag is False, its rows left to the caller (a margin pass over V finds equal rows: rho <= 0)."""
    finite = torch.stack([torch.isfinite(keys).all(), torch.isfinite(values).all()]).all()
    out_of_range = ((facts < 0) | (facts >= values.shape[0])).any()
    equal_values = may_have_duplicates(values) if value_duplicates else torch.zeros_like(out_of_range)
    return torch.stack([finite.logical_not(), out_of_range, equal_values, may_have_duplicates(keys)])


def raise_input_problems(problems: Sequence[bool], keys: torch.Tensor, values: torch.Tensor,
                         facts: torch.Tensor) -> None:
    """Raise the error of the first of the :func:`input_problems` (read back: ``problems`` is on the host) by
    the exact checks, which name the argument, the rows and the fix. A key collision with distinct rows raises
    nothing."""
    if any(problems):
        check_matrix(keys, "K")
        check_matrix(values, "V")
        check_facts(facts, keys.shape[0], values.shape[0], keys.device)
        check_distinct(values, "V")
        check_distinct(keys, "K")


def validate_inputs(keys: torch.Tensor, values: torch.Tensor, facts: torch.Tensor, *,
                    deferred: bool = False) -> torch.Tensor:
    """Check K (F, d_in), V (|V|, d_out), f (F,) and return f as int64; raise naming the argument.

    The checks of the entries (finite, f in range, distinct rows) cost one read back from the device. With
    ``deferred`` only shapes, dtypes and devices are checked here: the caller queues :func:`input_problems`
    when it likes (on a GPU: behind its large work), reads them with its next read and passes them to
    :func:`raise_input_problems`, and clamps the indices it uses before that read into [0, |V|) (an index out of
    range would end the CUDA context with a device-side assert before the read reports it)."""
    for name, x in (("K", keys), ("V", values)):
        check_matrix(x, name, finite=False)
    if values.dtype != keys.dtype:
        raise TypeError(f"V has dtype {values.dtype} but K has {keys.dtype}; use one dtype")
    if values.device != keys.device:
        raise ValueError(f"V is on {values.device} but K is on {keys.device}; use one device")
    facts = check_facts(facts, keys.shape[0], values.shape[0], keys.device, check_range=False)
    if not deferred:
        raise_input_problems(input_problems(keys, values, facts).tolist(), keys, values, facts)
    return facts


__all__ = ["check_positive_int", "check_choice", "check_matrix", "check_facts", "check_distinct", "check_distinct_added",
           "first_duplicate", "may_have_duplicates", "input_problems", "raise_input_problems", "validate_inputs"]
