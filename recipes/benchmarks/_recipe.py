"""What benchmarks that run ``recipes/train.py`` share: the overrides of a fixed-length comparison
fit, the fields of the RESULT line a fit prints, the configuration a fit runs with, and the
overrides that give one model another's network."""

from __future__ import annotations

from collections.abc import Sequence

from lightning_mqgnn.recipe import CONF


def fixed_epochs_overrides(epochs: int) -> list[str]:
    """Exactly ``epochs`` epochs: early stopping off, one validation per epoch, no progress bar, no
    checkpoint to resume from (the fits ``bench grid`` and ``bench loaders`` compare, against
    loops that write none)."""
    return [
        f"trainer.max_epochs={epochs}",
        "early_stopping.patience_batches=1000000000",
        "val_every_batches=0",
        "trainer.enable_progress_bar=false",
        "last_checkpoint_every_s=null",
    ]


def result_fields(stdout: str) -> dict[str, str] | None:
    """The ``key=value`` fields of the last ``RESULT`` line in ``stdout``; None without one."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return dict(item.split("=", 1) for item in lines[-1].split()[1:]) if lines else None


def epoch_seconds(fields: dict[str, str]) -> float:
    """Training time per epoch of a fit's RESULT fields (validation not included)."""
    return float(fields["train_time_s"]) / max(int(fields["epochs"]), 1)


def recipe_config(overrides: list[str]):
    """The recipe's configuration (``lightning_mqgnn/conf/config.yaml``) composed with ``overrides``, as
    ``recipes/train.py`` would run it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


NETWORK = ("lr", "hidden", "glorot_init")


def network_overrides(model: str, keys: tuple[str, ...] = NETWORK, extra: Sequence[str] = ()) -> list[str]:
    """``model.module.<key>=<value>`` for each of ``keys`` as ``model=<model>`` (with ``extra``)
    sets it (a key it leaves out as null: the module's default): what a benchmark comparing
    samplers or loaders gives every model, so they train one network (``model=sage`` ships another
    width, start and rate than its GNS and LABOR variants)."""
    module = recipe_config([f"model={model}", *extra]).model.module
    return [f"model.module.{key}={override_value(module.get(key))}" for key in keys]


def override_value(value) -> str:
    """``value`` as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)
