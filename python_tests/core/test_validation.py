"""The shared input checks of factkernels.validation and who uses them."""

import ast
import math
from pathlib import Path

import pytest
import torch

import factkernels
from factkernels import validation
from factkernels.embeddings import random_fact_set
from factkernels.host_reads import HostReadCounter
from factkernels.validation import (check_choice, check_matrix, check_positive_int, first_duplicate, input_problems,
                                   raise_input_problems, validate_inputs)


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "4", None])
def test_positive_int_rejects_non_positive_and_non_int(bad):
    with pytest.raises(ValueError, match="hidden must be a positive int, got"):
        check_positive_int("hidden", bad)


def test_positive_int_accepts_ints_and_optional_none():
    check_positive_int("m", 1)
    check_positive_int("m", None, allow_none=True)
    with pytest.raises(ValueError, match="m must be a positive int or None"):
        check_positive_int("m", 0, allow_none=True)


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ([[1.0]], TypeError, "X must be a torch.Tensor"),
        (torch.ones(2, 2, dtype=torch.int64), TypeError, "X must be float32 or float64"),
        (torch.ones(2, 2, dtype=torch.float16), TypeError, "X must be float32 or float64"),
        (torch.ones(3), ValueError, "X must be a non-empty 2-D"),
        (torch.ones(0, 3), ValueError, "X must be a non-empty 2-D"),
        (torch.ones(3, 0), ValueError, "X must be a non-empty 2-D"),
        (torch.ones(1, 3), ValueError, "X must have at least 2 rows"),
        (torch.tensor([[math.nan, 1.0], [0.0, 1.0]]), ValueError, "X contains NaN or Inf"),
    ],
)
def test_matrix_check_names_the_argument(bad, error, match):
    with pytest.raises(error, match=match):
        check_matrix(bad, "X", min_rows=2)


def test_matrix_check_returns_its_input_and_may_skip_finiteness():
    x = torch.tensor([[math.inf, 1.0]])
    assert check_matrix(x, "U", finite=False) is x


def test_choice_and_inputs():
    with pytest.raises(ValueError, match=r"solver must be one of \('a', 'b'\), got 'c'"):
        check_choice("solver", "c", ("a", "b"))
    K, V = torch.eye(3), torch.eye(3)
    assert validate_inputs(K, V, torch.tensor([0, 1, 2], dtype=torch.int32)).dtype == torch.int64
    with pytest.raises(ValueError, match="K has duplicate rows 0 and 2"):
        validate_inputs(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]), V[:, :2], torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("module", ["nongated.py", "twohot.py", "baselines/naive.py", "baselines/ntk.py", "geometry.py", "ustar.py"])
def test_builders_do_not_import_the_orchestrator(module):
    tree = ast.parse((Path(factkernels.__file__).parent / module).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "construct" not in {name.split(".")[-1] for name in imported if name}
    assert "validation" in {name.split(".")[-1] for name in imported if name}


def _lexicographic(t):
    """The reference: torch's row-by-row unique, what the duplicate check was before it hashed rows."""
    _, group, counts = torch.unique(t, dim=0, return_inverse=True, return_counts=True)
    if int(counts.max()) == 1:
        return None
    repeated = torch.nonzero(counts[group] > 1).flatten()
    first = int(repeated[0])
    return first, int(repeated[1:][group[repeated[1:]] == group[first]][0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_duplicates_are_found_as_by_a_lexicographic_sort(dtype):
    gen = torch.Generator().manual_seed(0)
    found = 0
    for trial in range(200):
        n, d = int(torch.randint(2, 40, (1,), generator=gen)), int(torch.randint(1, 4, (1,), generator=gen))
        t = torch.randint(-2, 3, (n, d), generator=gen).to(dtype) * 0.5  # few distinct rows: many repeats
        if trial % 2:
            t = torch.randn(n, d, generator=gen, dtype=dtype)
            t[int(torch.randint(n, (1,), generator=gen))] = t[int(torch.randint(n, (1,), generator=gen))]
        assert first_duplicate(t) == _lexicographic(t)
        found += first_duplicate(t) is not None
    assert 100 < found < 200


def test_duplicate_keys_and_values_raise_the_same_message_at_scale():
    K, V, f = random_fact_set(4096, 4096, 128, seed=0)
    assert first_duplicate(K) is None and first_duplicate(V) is None
    K[4000], V[2999] = K[17], V[300]
    with pytest.raises(ValueError, match="K has duplicate rows 17 and 4000: keys must be distinct"):
        validate_inputs(K, V[:2999], f.clamp(max=2998))
    with pytest.raises(ValueError, match=r"V has duplicate rows 300 and 2999: rho\(V\) = 0"):
        validate_inputs(K[:4000], V, f[:4000])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_equal_under_comparison_are_duplicates_and_one_bit_apart_are_not(dtype):
    zero = torch.tensor([[0.0, 1.0], [2.0, 3.0], [-0.0, 1.0]], dtype=dtype)  # -0.0 == 0.0
    assert first_duplicate(zero) == _lexicographic(zero) == (0, 2)
    one = torch.tensor([1.0], dtype=dtype)
    apart = torch.stack([torch.cat([one, one]), torch.cat([one, torch.nextafter(one, 2 * one)])])
    assert first_duplicate(apart) is None


def test_rows_sharing_a_key_fall_back_to_the_exact_sort(monkeypatch):
    # Every row gets the same key: the exact comparison finds different rows and sorts them instead.
    monkeypatch.setattr(validation, "_row_keys", lambda t: torch.zeros(t.shape[0], dtype=torch.int64))
    distinct = torch.eye(5)
    assert first_duplicate(distinct) is None
    repeated = torch.cat([distinct, distinct[3:4]])
    assert first_duplicate(repeated) == _lexicographic(repeated) == (3, 5)


def test_the_entry_checks_read_back_once_and_a_key_collision_alone_raises_nothing():
    K, V, f = random_fact_set(200, 100, 12, seed=0)
    with HostReadCounter() as counter:
        validate_inputs(K, V, f)
    assert counter.reads == ["tolist"]
    with HostReadCounter() as counter:
        facts = validate_inputs(K, V, f, deferred=True)
    assert counter.reads == [] and torch.equal(facts, f)
    assert input_problems(K, V, facts).tolist() == [False] * 4
    equal = V.clone()
    equal[7] = equal[3]  # equal values: flagged, unless left to the caller (construct's rho pass finds them)
    assert input_problems(K, equal, facts).tolist() == [False, False, True, False]
    assert input_problems(K, equal, facts, value_duplicates=False).tolist() == [False] * 4
    # a flag raised by a key collision of distinct rows: the exact check decides, and finds nothing
    raise_input_problems([False, False, True, True], K, V, f)
