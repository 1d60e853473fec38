"""The elastic global-batch plan (pure): coverage of every epoch whatever the replica counts,
the global batch kept by accumulation, and the learning-rate rules when it cannot be kept."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyperpod_lab.runtime.checkpointless.elastic import ElasticBatches, scaled_lr


@settings(max_examples=60, deadline=None)
@given(n=st.integers(8, 200), gbs=st.integers(1, 64), mbs=st.integers(1, 9),
       replicas=st.lists(st.integers(1, 5), min_size=1, max_size=40), local=st.integers(1, 3),
       cap=st.one_of(st.none(), st.integers(1, 4)))
def test_every_sample_once_per_epoch_whatever_the_replica_counts(n, gbs, mbs, replicas, local, cap):
    b = ElasticBatches(n, gbs, mbs, seed=3, max_accumulation_steps=cap)
    cursor, seen = 0, []
    for step, r in enumerate(replicas):
        shares = [b.plan(step, cursor, r, rr, lr_, local) for rr in range(r) for lr_ in range(local)]
        taken = [i for p in shares for i in p.samples]
        assert sorted(taken) == sorted(b.positions(cursor, shares[0].effective_batch))
        for p in shares:
            assert [i for mb in p.micro_batches for i in mb] == list(p.samples)
            assert all(len(mb) <= mbs for mb in p.micro_batches)
            assert len(p.micro_batches) <= p.accumulation_steps
        if cap is None:
            assert shares[0].effective_batch == gbs
        seen.extend(b.positions(cursor, shares[0].effective_batch))  # in sequence order
        cursor += shares[0].effective_batch
    for e in range(len(seen) // n):  # each complete epoch holds every sample exactly once
        assert sorted(seen[e * n:(e + 1) * n]) == list(range(n))


def test_global_batch_kept_by_accumulation():
    b = ElasticBatches(1024, 64, 8)
    two, one = b.plan(0, 0, 2, 0), b.plan(0, 0, 1, 0)
    assert (two.accumulation_steps, one.accumulation_steps) == (4, 8)
    assert two.effective_batch == one.effective_batch == 64 and two.lr == one.lr
    assert sum(two.weight(len(mb)) for mb in two.micro_batches) == pytest.approx(0.5)


@pytest.mark.parametrize("rule,expected", [("none", 0.1), ("linear", 0.05), ("sqrt", 0.1 / math.sqrt(2))])
def test_lr_rule_when_the_global_batch_cannot_be_kept(rule, expected):
    b = ElasticBatches(1024, 64, 8, base_lr=0.1, lr_rule=rule, max_accumulation_steps=4)
    full, half = b.plan(0, 0, 2, 0), b.plan(0, 0, 1, 0)
    assert full.effective_batch == 64 and full.lr == pytest.approx(0.1)
    assert half.effective_batch == 32 and half.accumulation_steps == 4
    assert half.lr == pytest.approx(expected)
    assert scaled_lr(0.1, 32, 64, rule) == pytest.approx(expected)


@pytest.mark.parametrize("kwargs,msg", [
    ({"dataset_size": 0}, "dataset_size"), ({"global_batch_size": -1}, "global_batch_size"),
    ({"micro_batch_size": 1.5}, "micro_batch_size"), ({"lr_rule": "cubic"}, "lr_rule"),
    ({"max_accumulation_steps": 0}, "max_accumulation_steps")])
def test_bad_input_names_the_field(kwargs, msg):
    args = {"dataset_size": 10, "global_batch_size": 4, "micro_batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=msg):
        ElasticBatches(args.pop("dataset_size"), args.pop("global_batch_size"), args.pop("micro_batch_size"), **args)


def test_plan_backward_over_every_replica_is_the_mean_loss_gradient_of_the_effective_batch():
    """StepPlan.backward: each replica's weighted micro-batch losses, summed over the replicas, are
    the mean loss of the step's effective batch, and their gradients (accumulated in one model
    here, as the all-reduce sums them) that mean loss's gradient."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(64, 3, generator=g), torch.randn(64, 1, generator=g)
    model = torch.nn.Linear(3, 1)
    b = ElasticBatches(64, 12, 4, seed=1)
    plans = [b.plan(0, 0, 3, r) for r in range(3)]  # 4 samples a replica: one micro-batch each
    plans += [b.plan(1, 12, 2, r) for r in range(2)]  # 6 a replica: micro-batches of 4 and 2
    for step in (0, 1):
        model.zero_grad()
        ps = [p for p in plans if p.step == step]
        total = sum(p.backward(lambda idx: F.mse_loss(model(X[idx]), Y[idx])) for p in ps)
        got = [t.grad.clone() for t in model.parameters()]
        model.zero_grad()
        idx = torch.tensor([i for p in ps for i in p.samples])
        want = F.mse_loss(model(X[idx]), Y[idx])
        want.backward()
        assert total == pytest.approx(want.item(), rel=1e-6)
        for a, t in zip(got, model.parameters()):
            assert torch.allclose(a, t.grad, rtol=1e-5, atol=1e-7)
    assert {len(mb) for p in plans if p.step == 1 for mb in p.micro_batches} == {4, 2}
    empty = b.plan(0, 0, 13, 12)  # 13 replicas share 12 samples: the last takes none
    assert empty.micro_batches == () and empty.backward(lambda idx: 1 / 0) == 0.0
