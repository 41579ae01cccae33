"""RGR training variants of seed 002: the softmax model of Sec. 7.1 (summed scaled softmax over heads)."""

from dataclasses import replace

import pytest
import torch

from factkernels import attention
from factkernels.attention import train_heads

TINY = attention.TrainingConfig(context_length=8, check_every=100, patience=2, val_contexts=100, test_contexts=200,
                                max_steps=400, lr=1e-2)
SOFTMAX = replace(TINY, aggregation="softmax-sum")


def test_softmax_runs_learn_and_report_the_f1_of_their_heads():
    runs = attention.train_runs(12, 12, 2, [6], [0, 1], SOFTMAX, quiet=True)
    for run in runs:
        assert run.heads.aggregation == "softmax-sum" and run.test_f1 > 0.9
        data = attention.RunData.make(run.seed, 12, 12, SOFTMAX)
        # the constructions' per-context softmax scoring, independent of the training loop
        assert attention.f1(run.heads, data.graph, data.embeddings, data.test) == pytest.approx(run.test_f1)


def test_softmax_scale_uses_each_runs_own_head_width_when_batched():
    both = attention.train_runs(12, 12, 2, [2, 6], [0], SOFTMAX, quiet=True)
    alone = [attention.train_runs(12, 12, 2, [d_k], [0], SOFTMAX, quiet=True)[0] for d_k in (2, 6)]
    for a, b in zip(both, alone):
        assert a.test_f1 == pytest.approx(b.test_f1, abs=1e-3) and a.steps == b.steps
        assert torch.allclose(a.heads.query_weights, b.heads.query_weights, atol=1e-3)


def test_softmax_head_scores_with_padded_widths_equal_unpadded():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 5, 4, generator=gen), torch.randn(2, 3, 5, 4, generator=gen)
    pad = torch.nn.functional.pad
    padded = attention.softmax_head_scores(pad(q, (0, 3)), pad(k, (0, 3)), head_dim=torch.tensor([4, 4]))
    assert torch.allclose(padded, attention.softmax_head_scores(q, k), atol=1e-6)
    with pytest.raises(ValueError, match="head_dim"):
        attention.softmax_head_scores(q, k, head_dim=torch.tensor([4]))


def test_softmax_settings_and_step_cutoff():
    assert attention.TrainingConfig(aggregation="softmax-sum").steps_for(64, 16) == 80_000  # Sec. 7.1
    assert attention.TrainingConfig().steps_for(512, 16) == 80_000 and attention.TrainingConfig().steps_for(64, 16) == 20_000
    with pytest.raises(ValueError, match="aggregation"):
        attention.TrainingConfig(aggregation="mean")
    with pytest.raises(ValueError, match="softmax-sum"):
        attention.TrainingConfig(aggregation="softmax-sum", objective="messages")
    assert train_heads.SOFTMAX_STEP_CUTOFF == 80_000
