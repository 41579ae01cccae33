"""The shared input checks of factkernels.validation and who uses them."""

import ast
import math
from pathlib import Path

import pytest
import torch

import factkernels
from factkernels.validation import check_choice, check_matrix, check_positive_int, validate_inputs


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
