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
        "strategy/mqgnn.py: starts every rank from rank 0's parameters and buffers exactly as "
        "DistributedDataParallel's constructor does, without wrapping the model in DDP"
    ),
    "lightning.fabric.strategies._StrategyRegistry": (
        "strategy/mqgnn.py: the type of the registry Lightning passes to register_strategies, "
        "through which the strategy is registered under the names 'mqgnn' and 'mqgnn_spawn'"
    ),
    "lightning.fabric.utilities.types._PATH": (
        "strategy/mqgnn.py: the path type of the overridden save_checkpoint/load_checkpoint, "
        "kept identical to the signatures of the Strategy methods they override"
    ),
}
