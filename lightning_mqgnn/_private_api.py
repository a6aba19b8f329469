"""Every private Lightning and torch API this package uses, and why no public one serves.

Private names may change in any release; keeping them in one list makes an upgrade a check of this
list. A test compares it with the code, so a new use must be added here with its reason.
"""

PRIVATE_APIS: dict[str, str] = {
    "torch.UntypedStorage._new_shared": (
        "pipeline/packing.py: allocates a worker slot directly in shared memory; the public "
        "tensor.share_memory_() first allocates private memory and then copies it over "
        "(a fallback to it is kept)"
    ),
    "lightning.pytorch.overrides.distributed._sync_module_states": (
        "strategy/mqgnn.py, fullgraph/strategy_base.py: starts every rank from rank 0's parameters and buffers exactly as "
        "DistributedDataParallel's constructor does, without wrapping the model in DDP"
    ),
    "lightning.fabric.strategies._StrategyRegistry": (
        "strategy/mqgnn.py, fullgraph/strategy.py, fullgraph/gnnpipe.py: the type of the registry Lightning passes to register_strategies, "
        "through which each strategy registers its names ('mqgnn', 'mqgnn_spawn', ...)"
    ),
    "torch.autograd._profiler_enabled": (
        "models/dropout.py: whether a profiler records, so that the compiled ReLU + dropout opens "
        "its profiler scope only then (record_function costs 10-100 us a call, profiling or not); "
        "torch.profiler offers no public query of it"
    ),
    "lightning.pytorch.core.module.LightningModule._trainer": (
        "models/node_classifier.py, strategy/mqgnn.py: the module's trainer or None; the public "
        "LightningModule.trainer raises when no trainer is attached (a module stepped by hand, a "
        "checkpoint saved outside fit), where these callers only need to know that"
    ),
    "lightning.pytorch.core.module.LightningModule._current_fx_name": (
        "models/node_classifier.py: the attribute in which Lightning names the running hook, "
        "written about 46 times a training step; NodeClassifierBase stores it without going "
        "through nn.Module.__setattr__, which costs microseconds a write"
    ),
    "lightning.pytorch.strategies.ddp.DDPStrategy._ddp_kwargs": (
        "strategy/mqgnn.py: the DistributedDataParallel arguments the user passed, checked "
        "against what the gradient queues support; DDPStrategy keeps them only in this attribute"
    ),
    "torch.distributed.distributed_c10d._set_pg_timeout": (
        "strategy/process_group.py, for strategy/mqgnn.py: shortens the timeout of the default process group (and the comm "
        "hooks' group) for the training loop and restores it after (step_timeout): Lightning "
        "broadcasts on the default group before every training step and swallows that "
        "broadcast's error, so a hung rank holds the others for the group's whole timeout, which "
        "must stay long for the rendezvous and setup. Up to torch 2.13 no public API changes a "
        "group's timeout after its creation; the public torch.distributed.set_timeout is taken "
        "where a torch has it"
    ),
    "torch.distributed.distributed_c10d._get_default_store": (
        "strategy/epoch_meeting.py: the store of the default process group, in which the ranks "
        "meet at an epoch's first batch while each watches the others on its host; a collective "
        "would wait there for a stopped rank as long as for a slow one. torch exposes no public "
        "accessor of a group's store, and a TCPStore built from MASTER_ADDR/MASTER_PORT would miss "
        "groups started from a file, a custom store or torchrun's agent store"
    ),
    "lightning.fabric.utilities.types._PATH": (
        "strategy/mqgnn.py: the path type of the overridden save_checkpoint/load_checkpoint, "
        "kept identical to the signatures of the Strategy methods they override"
    ),
    "lightning.pytorch.trainer.trainer.Trainer._val_check_time_interval": (
        "callbacks/validation_budget.py: the seconds after the last validation at which Lightning's "
        "time-based schedule validates, read after every training batch; ValidationBudget sets "
        "it to 0 after the batch it validates after and to infinity otherwise. No public API lets a "
        "callback choose the batches after which to validate"
    ),
    "torch._fused_adam_": (
        "models/optim.py: the kernel of torch.optim.Adam(fused=True), called directly by FusedAdam; "
        "Adam.step reaches it only through about 0.1 ms a step of Python (a profiler scope, "
        "hooks, per-call checks and grouping), which no public argument turns off"
    ),
    "torch._foreach_add_": (
        "models/optim.py: FusedAdam advances the step counters as Adam.step does before its kernel"
    ),
    "torch.optim.optimizer._global_optimizer_pre_hooks": (
        "models/optim.py: whether any global step hook is registered, in which case FusedAdam "
        "takes torch's Adam.step, which runs them; torch exposes registering them, not the registry"
    ),
    "torch.optim.optimizer._global_optimizer_post_hooks": (
        "models/optim.py: the same, for the hooks that run after a step"
    ),
}
