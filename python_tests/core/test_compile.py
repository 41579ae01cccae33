"""The kernels are torch custom ops: a FactMLP runs under torch.compile and gives eager's numbers."""

import pytest
import torch

from factkernels import _ops, construct


@pytest.mark.parametrize("backend", ["aot_eager"])  # inductor also passes; it compiles far slower
def test_fact_mlp_under_torch_compile(tiny, backend):
    keys, values, facts = tiny
    mlp = construct(keys, values, facts, outputs="values", progress=False)
    torch._dynamo.reset()
    compiled = torch.compile(mlp, backend=backend, fullgraph=True)
    with torch.no_grad():
        assert torch.allclose(compiled(keys), mlp(keys), atol=1e-6)
        assert torch.equal(compiled(keys).argmax(1), mlp(keys).argmax(1))


def test_kernels_are_registered_with_fake_shapes():
    x, w = torch.randn(5, 3), torch.randn(4, 3)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fx, fw = torch.empty(5, 3), torch.empty(4, 3)
        assert torch.ops.factkernels.gate_features(fx, fw, None, "silu").shape == (5, 4)
        index, margin = torch.ops.factkernels.decode(fx, fw, None)
        assert index.shape == margin.shape == (5,) and index.dtype == torch.int64
    assert torch.allclose(torch.ops.factkernels.gate_features(x, w, None, "silu"),
                          _ops.gate_features(x, w, None, "silu", backend="torch"), atol=1e-6)
