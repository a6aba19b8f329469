"""Adam through torch's fused kernel, stepped without the Python torch wraps around that kernel;
torch's own Adam where that kernel is missing."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

# ``Adam.step`` as torch defines it, without the profiling wrapper ``Optimizer`` puts around the
# ``step`` of each optimizer class it constructs (``Optimizer._patch_step_function``)
_ADAM_STEP = (
    torch.optim.Adam.step.__wrapped__
    if getattr(torch.optim.Adam.step, "hooked", False)
    else torch.optim.Adam.step
)
_HOOKED_ADAM_STEP = torch.optim.Optimizer.profile_hook_step(_ADAM_STEP)


class FusedAdam(torch.optim.Adam):
    """``torch.optim.Adam(fused=True)``: the same kernel, state and updates, bit for bit, with
    ``step`` and ``zero_grad`` cut down to the kernel where nothing more is asked of them.

    Around its kernel torch's ``step`` opens a profiler scope, runs the step hooks, checks every
    parameter and groups the tensors by device and dtype, and ``zero_grad`` opens a scope of its
    own: about 0.1 ms a call for a 2-layer GNN's kernel of 0.05 ms, 0.35 ms of a training step on
    2 CPU cores (BENCHMARKS.md), host time that on a GPU keeps the device waiting. The short path
    runs a parameter group whose tensors share a device and dtype and have their state already;
    a gradient scaler's ``grad_scale``/``found_inf``, amsgrad, a tensor ``lr`` or betas and the
    first step go through torch's ``Adam.step``, and registered step hooks through it with its
    hooks and profiler scope.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        if self._has_step_hooks():
            return _HOOKED_ADAM_STEP(self, closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = [self._fused_arguments(group) for group in self.param_groups]
        if self._scaled() or any(arguments is None for arguments in groups):
            _ADAM_STEP(self)
            return loss
        for tensors, options in groups:
            if tensors[0]:
                steps = tensors[-1]
                torch._foreach_add_(steps, 1)
                torch._fused_adam_(*tensors[:4], [], steps, **options)
        return loss

    step.hooked = True  # the profiling wrapper stays off this class's step (the hooks are handled above)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none:
            return super().zero_grad(set_to_none=False)
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def _has_step_hooks(self) -> bool:
        return bool(
            self._optimizer_step_pre_hooks
            or self._optimizer_step_post_hooks
            or _global_optimizer_pre_hooks
            or _global_optimizer_post_hooks
        )

    def _scaled(self) -> bool:
        """Whether a gradient scaler handed this step its scale (``grad_scale``/``found_inf``)."""
        return getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is not None

    def _fused_arguments(self, group: dict) -> tuple[list[list[Tensor]], dict] | None:
        """``([params, grads, exp_avgs, exp_avg_sqs, steps], options)`` of ``torch._fused_adam_``
        for ``group``, or None where it takes torch's path."""
        lr = group["lr"]
        beta1, beta2 = group["betas"]
        if (
            group["amsgrad"]
            or group["differentiable"]
            or group.get("decoupled_weight_decay", False)  # a key of torch 2.6 and later
            or any(isinstance(x, Tensor) for x in (lr, beta1, beta2))
        ):
            return None
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        first = None
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            state = self.state.get(p)
            if not state or grad.is_sparse:
                return None
            if first is None:
                first = p
            if p.device != first.device or p.dtype != first.dtype or grad.dtype != p.dtype:
                return None
            params.append(p)
            grads.append(grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        options = dict(
            amsgrad=False,
            lr=lr,
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
            grad_scale=None,
            found_inf=None,
        )
        return [params, grads, exp_avgs, exp_avg_sqs, steps], options


def adam(params, lr: float = 1e-3, weight_decay: float = 0.0) -> torch.optim.Adam:
    """``FusedAdam`` where torch has Adam's fused kernel for the parameters' device (CUDA; CPU
    from torch 2.4), else ``torch.optim.Adam``: the same updates up to rounding. With torch 2.2,
    which DGL 2.1's wheels need, the fused optimiser refuses CPU parameters."""
    params = list(params)
    try:
        return FusedAdam(params, lr=lr, weight_decay=weight_decay)
    except RuntimeError as err:
        if "fused=True" not in str(err):
            raise
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
