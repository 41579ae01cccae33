"""HostReadCounter: every host read counted once, from Python or inside an operator; work is not a read."""

import torch

from factkernels.host_reads import HostReadCounter


def test_python_reads_are_counted_once_under_their_python_names():
    x = torch.arange(-3.0, 5.0)
    with HostReadCounter() as counter:
        x.sum().item()
        bool(x[0] > 0)
        x.tolist()
        x[x > 0]
        float(x.max())
        torch.equal(x, x)
    assert counter.reads == ["item", "__bool__", "tolist", "__getitem__", "__float__", "equal"]


def test_arithmetic_and_indexing_by_integers_read_nothing():
    x = torch.randn(16, 8)
    with HostReadCounter() as counter:
        y = (x @ x.T).softmax(-1)[torch.arange(4)]
        torch.linalg.cholesky(x.T @ x + torch.eye(8))
        y.topk(3, dim=-1)
        torch.nonzero_static(x[:, 0] > 0, size=3)  # its size is given: nothing waits
    assert counter.count == 0


def test_a_read_made_below_python_is_counted_as_its_operator():
    x = torch.randn(5)
    with HostReadCounter() as counter:
        torch.ops.aten._local_scalar_dense(x[0])
    assert counter.reads == ["aten::local_scalar_dense"]
