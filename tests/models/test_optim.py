"""FusedAdam: torch's fused Adam, bit for bit, with the short path taken where it can be."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lightning_mqgnn.models import optim
from lightning_mqgnn.models.optim import FusedAdam


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.Linear(16, 3), nn.Linear(3, 2))


def _train(
    model: nn.Module, opt: torch.optim.Optimizer, steps: int, frozen_last: bool = False
) -> list[float]:
    """``steps`` steps on fixed random data; the last layer gets no gradient with ``frozen_last``."""
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 7, generator=gen)
        opt.zero_grad()
        out = model[:3](x) if frozen_last else model(x)
        loss = out.square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _groups(model: nn.Module) -> list[dict]:
    return [
        {"params": list(model[0].parameters()), "lr": 1e-2},
        {
            "params": list(model[2].parameters()) + list(model[3].parameters()),
            "lr": 3e-3,
            "weight_decay": 0.1,
        },
    ]


@pytest.mark.parametrize("frozen_last", [False, True])
def test_updates_equal_torch_fused_adam_bit_for_bit(frozen_last):
    ours, theirs = _model(), _model()
    kwargs = dict(lr=1e-3, betas=(0.8, 0.99), eps=1e-7)
    a = FusedAdam(_groups(ours), **kwargs)
    b = torch.optim.Adam(_groups(theirs), fused=True, **kwargs)
    assert _train(ours, a, 12, frozen_last) == _train(theirs, b, 12, frozen_last)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(p, q)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert a.state[p].keys() == b.state[q].keys()
        for key in a.state[p]:
            assert torch.equal(a.state[p][key], b.state[q][key])


def test_the_short_path_runs_every_step_after_the_first(monkeypatch):
    calls = []
    adam_step = optim._ADAM_STEP
    monkeypatch.setattr(optim, "_ADAM_STEP", lambda self: calls.append(1) or adam_step(self))
    model = _model()
    opt = FusedAdam(model.parameters())
    _train(model, opt, 5)
    assert len(calls) == 1  # the first step initialises the state through torch's Adam.step
    assert getattr(type(opt).step, "hooked", False)  # no profiling wrapper put around it


def test_zero_grad_sets_none_or_zeros():
    model = _model()
    opt = FusedAdam(model.parameters())
    _train(model, opt, 1)
    opt.zero_grad(set_to_none=False)
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_step_hooks_and_closure_run_as_in_torch():
    model = _model()
    opt = FusedAdam(model.parameters())
    seen = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append("post"))
    x = torch.randn(4, 7)

    def closure():
        seen.append("closure")
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss

    before = [p.clone() for p in model.parameters()]
    loss = opt.step(closure)
    assert seen == ["pre", "closure", "post"]
    assert isinstance(loss, torch.Tensor)
    assert all(not torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_a_gradient_scalers_arguments_take_torchs_path():
    ours, theirs = _model(), _model()
    a, b = FusedAdam(ours.parameters()), torch.optim.Adam(theirs.parameters(), fused=True)
    _train(ours, a, 2)
    _train(theirs, b, 2)
    for opt in (a, b):
        opt.grad_scale, opt.found_inf = torch.tensor(4.0), torch.tensor(0.0)
    assert _train(ours, a, 3) == _train(theirs, b, 3)
    assert all(torch.equal(p, q) for p, q in zip(ours.parameters(), theirs.parameters()))


def test_state_dict_loads_into_torch_adam_and_training_goes_on_identically():
    ours, theirs = _model(), _model()
    a = FusedAdam(ours.parameters(), lr=1e-2)
    _train(ours, a, 3)
    theirs.load_state_dict(ours.state_dict())
    b = torch.optim.Adam(theirs.parameters(), lr=1e-2, fused=True)
    b.load_state_dict(copy.deepcopy(a.state_dict()))  # loading keeps the tensors it is given
    assert _train(ours, a, 4) == _train(theirs, b, 4)
    assert all(torch.equal(p, q) for p, q in zip(ours.parameters(), theirs.parameters()))


@pytest.mark.parametrize(
    "expected",
    [
        pytest.param(FusedAdam, id="torch>=2.4"),
        # the DGL environment's torch 2.2.1 has the fused kernel for CUDA only
        pytest.param(torch.optim.Adam, id="torch-2.2", marks=pytest.mark.dgl),
    ],
)
def test_adam_is_fused_where_torch_has_the_kernel_and_torchs_adam_elsewhere(expected):
    if (expected is FusedAdam) != (torch.__version__ >= (2, 4)):
        pytest.skip(f"for the other environment (torch {torch.__version__})")
    model = _model()
    opt = optim.adam(model.parameters(), lr=0.01, weight_decay=0.1)
    assert type(opt) is expected
    assert (opt.defaults["lr"], opt.defaults["weight_decay"]) == (0.01, 0.1)
    assert len(opt.param_groups[0]["params"]) == 6  # every parameter, the generator read once
    losses = _train(model, opt, 20)
    assert losses[-1] < losses[0]
