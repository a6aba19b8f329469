"""Train a node classifier: ``mqgnn-train model=sage data=cora [key=value ...]`` (from a clone:
``python recipes/train.py ...``).

Prints the best validation metric, the test metric of the best-validation checkpoint, the paper's
batch time, the training time and every rank's peak memory. Bad input ends with one ``error:`` line and exit code 2.
A sampled run bounded by epochs (the default cap, ``step_cap``, or ``trainer.max_steps=-1``) writes
``checkpoints/last.ckpt`` in its folder at epoch ends (``last_checkpoint_every_s``) and, when a
SIGTERM or SIGUSR1 stops it, at the end of the step the signal arrived in (one ``stopped by``
line, exit code 128 + signal); ``ckpt_path=<that file>`` or ``ckpt_path=auto`` resumes it, with
the run's own overrides.
Every run writes its RESULT fields to ``result.json`` in its folder; ``seeds=0,1,2`` (or
``seeds=range(10)``) trains once per seed, each in ``<run>/seed_<s>/``, prints a SUMMARY line (mean
± sample std of each numeric field) and writes ``summary.csv`` and ``summary.json`` in ``<run>``.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import inspect
import logging
import math
import os
import re
import sys
import traceback
import warnings
from pathlib import Path

import hydra
import lightning.pytorch as pl
import psutil
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only, rank_zero_warn
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from typing_extensions import override

from lightning_mqgnn.callbacks import (
    BatchEarlyStopping,
    BatchTimer,
    CommStatsMonitor,
    GPUBusyMonitor,
    LastCheckpoint,
    PeakMemoryMonitor,
    Preempted,
    StageTimingCallback,
    ValidationBudget,
    ValidationTimeBudget,
    ValidationWorkBudget,
)
from lightning_mqgnn.callbacks.last_checkpoint import LAST_CHECKPOINT
from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.fullgraph.strategy_base import FullGraphStrategyBase
from lightning_mqgnn.graph.link_dataset import LinkDataset
from lightning_mqgnn.recipe import CONF
from lightning_mqgnn.recipe.seed_runs import (
    RESULT_FILE,
    RunResult,
    Value,
    configuration,
    read_result,
    result_fields,
    seed_folder,
    seed_list,
    seeds_as_list,
    summarize,
    summary_line,
    write_result,
    write_summaries,
)
from lightning_mqgnn.sampling.edge_seeds import EdgeSeeds
from lightning_mqgnn.strategy import AtomicCheckpointIO, CheckpointError, MQGNNStrategy, RankFailure
from lightning_mqgnn.strategy.rank_failure import peer_failed, rank_failure

RUN_CONFIG = "run_config.yaml"  # the config a run started with, in its folder beside checkpoints/


class RecipeError(Exception):
    """A problem with the user's input, reported as one line."""


class _WithoutTips(logging.Filter):
    """Drops Lightning's "💡 Tip:" lines, which advertise its cloud services."""

    @override
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("💡 Tip:")


_WITHOUT_TIPS = _WithoutTips()


class FitPhase(pl.Callback):
    """The phase of the fit, for a rank failure under a strategy that does not name it (Lightning's
    DDP): Lightning has left the stage by the time the error reaches the recipe."""

    def __init__(self) -> None:
        self.phase = "setup"

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, *args) -> None:
        self.phase = "gradient all-reduce"  # DDP's only collective in a training step

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.phase = "validation"

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, *args) -> None:
        self.phase = "checkpoint"

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.phase = "training"


def quiet_lightning() -> None:
    """Silence what Lightning prints that is not the user's to act on, each by its own message,
    class and origin: its tips advertising its cloud services, and the deprecation warning that
    its own use of torch's ``LeafSpec`` raises under torch 2.13 on every fit. A warning of any
    other text or origin, the user's own among them, still shows."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_WITHOUT_TIPS)
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree\Z",
    )


def quiet_resumed_checkpoint_dir(checkpoint_dir: Path) -> None:
    """A resumed run writes its checkpoints into the folder it wrote them to before, by design:
    Lightning's warning that this folder is not empty is not the user's to act on."""
    warnings.filterwarnings(
        "ignore",
        message=re.escape(f"Checkpoint directory {os.path.realpath(checkpoint_dir)} exists and is not empty.")
        + r"\Z",
        category=UserWarning,
        module=r"lightning\.pytorch\.callbacks\.model_checkpoint\Z",
    )


def check_config_names(argv: list[str]) -> None:
    """Reject ``group=name`` overrides whose config file does not exist, before Hydra prints
    several lines about it."""
    for arg in argv:
        if "=" not in arg or arg.startswith(("-", "+", "~", "hydra")):
            continue
        key, value = arg.split("=", 1)
        group = CONF / key
        if group.is_dir() and "," not in value and not (group / f"{value}.yaml").exists():
            options = ", ".join(sorted(p.stem for p in group.glob("*.yaml")))
            raise RecipeError(f"unknown {key} config {value!r} (available: {options})")


def validation_schedule(val_every: int, batches_per_epoch: int) -> dict:
    """Trainer arguments that validate every ``val_every`` batches, also when an epoch is shorter
    (then every few epochs); 0 means once per epoch. Not a function of the run's length: a run
    resumed with a later end must validate where it did (Lightning resumes an epoch-end checkpoint
    wrongly under another schedule: it trains one batch more). A run that ends before its first
    validation is scored on its last weights (``train``). At epoch ends: Lightning's default
    interval (None), which, unlike an explicit 1.0, it does not announce on every fit."""
    if val_every <= 0:
        return {"val_check_interval": None, "check_val_every_n_epoch": 1}
    if val_every <= batches_per_epoch:
        return {"val_check_interval": val_every, "check_val_every_n_epoch": 1}
    return {"val_check_interval": None, "check_val_every_n_epoch": math.ceil(val_every / batches_per_epoch)}


def logging_interval(cfg: DictConfig, batches_per_epoch: int) -> int:
    """``Trainer(log_every_n_steps)``: ``trainer.log_every_n_steps``, else Lightning's 50, or an
    epoch's batches when it has fewer (with a longer interval Lightning warns on every fit)."""
    configured = cfg.trainer.get("log_every_n_steps")
    return int(configured) if configured is not None else min(50, batches_per_epoch)


def train(cfg: DictConfig) -> dict[str, Value]:
    """Fit, validate and test one run; its RESULT fields, the recipe's own figures at full precision."""
    quiet_lightning()
    pl.seed_everything(cfg.seed, workers=True)
    # everything the configuration alone decides is built and checked before the dataset loads,
    # which takes minutes on a large graph
    make_module = instantiate(cfg.model.module)  # a partial: the dataset gives its sizes
    link = cfg.task.name == "link"
    if link and getattr(make_module.func, "full_graph", False):
        raise RecipeError(
            "task=link trains sampled edge batches: the full-graph strategies train node classification"
        )
    check_module_arguments(cfg.model.name, make_module)
    # a strategy config is either a Lightning registry name ({name: ddp}) or a _target_ to build
    strategy = instantiate(cfg.strategy) if "_target_" in cfg.strategy else cfg.strategy.name
    world = int(cfg.trainer.devices) * int(cfg.trainer.num_nodes) if str(cfg.trainer.devices).isdigit() else 1
    accumulate = int(cfg.trainer.get("accumulate_grad_batches") or 1)
    # a sampled run's LoaderSettings (checked here), or a full-graph DataModule's partial
    loader = instantiate(cfg.loader)
    full_graph = getattr(make_module.func, "full_graph", False)
    sampled = isinstance(loader, LoaderSettings)
    if full_graph == sampled:
        raise RecipeError(
            f"model {cfg.model.name!r} and a {'sampled' if sampled else 'full-graph'} loader do not fit: "
            "full-graph training takes strategy=graph_parallel, pipegcn, pipeqs or gnnpipe, which pick "
            "the model and loader"
        )
    if isinstance(strategy, MQGNNStrategy):  # the recipe's models optimise automatically
        strategy.check_prediction_applies(True, accumulate)
    run_checkpoints = Path(cfg.trainer.get("default_root_dir") or ".") / "checkpoints"
    ckpt_path = resolve_ckpt_path(cfg.ckpt_path, run_checkpoints)
    if ckpt_path is not None:
        check_resumable(cfg, ckpt_path, full_graph)
    data = instantiate(cfg.data)  # a GraphDataset, or a LinkDataset: a graph with its own edge split
    if not link:
        check_node_task(data)
    seeds = None
    if link:  # the dataset over the training graph, and the split's edges as the batches' seeds
        dataset, seeds = instantiate(cfg.task.seeds)(dataset=data)
        print(seeds.summary(dataset), flush=True)
        module = make_module(
            in_dim=dataset.num_features, num_nodes=dataset.num_nodes, **link_scoring(make_module, data)
        )
        check_link_scoring(module, seeds)
    else:
        dataset = data
        print(dataset.summary(), flush=True)
        module = make_module(
            in_dim=dataset.num_features,
            num_classes=dataset.num_classes,
            metric=dataset.metric,
            multilabel=dataset.multilabel,
        )
    if full_graph:  # each rank's partition is the one batch of an epoch
        datamodule, batches = loader(dataset=dataset, aggregation=module.aggregation), 1
    else:
        datamodule = sampled_datamodule(cfg, loader, dataset, module, seeds)
        batches = datamodule_batches(datamodule, world)
    resume = None
    if ckpt_path is not None:
        steps_per_epoch = math.ceil(batches / accumulate)
        resume = checked_resume_checkpoint(cfg, ckpt_path, dict(module.hparams), steps_per_epoch)
        quiet_resumed_checkpoint_dir(resume.parent)
    # a resumed run goes on writing checkpoints where it wrote them before, so ModelCheckpoint keeps
    # its best score and file
    checkpoint_dir = resume.parent if resume is not None else run_checkpoints
    # only an epoch-bounded run writes one (LastCheckpoint): trainer.max_steps bounds the others by steps
    last_checkpoint = not full_graph and cfg.last_checkpoint_every_s is not None and epoch_bounded(cfg)
    if last_checkpoint and resume is None and rank_zero_only.rank == 0:
        # how the run was started, in the folder of the checkpoints that resume it (Hydra rewrites
        # <run>/.hydra/config.yaml when a job restarts in the same folder)
        checkpoint_dir.parent.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, checkpoint_dir.parent / RUN_CONFIG)
    log_every = logging_interval(cfg, batches)
    callbacks = recipe_callbacks(cfg, strategy, checkpoint_dir, last_checkpoint, log_every)
    timer, gpu_busy, checkpoint, memory = callbacks[:4]
    stages = next(c for c in callbacks if isinstance(c, StageTimingCallback))
    budgeted = any(isinstance(c, ValidationBudget) for c in callbacks)  # it schedules validation
    trainer = instantiate(
        cfg.trainer,
        callbacks=callbacks,
        strategy=strategy,
        plugins=checkpoint_plugins(strategy),
        log_every_n_steps=log_every,
        **run_length(cfg, batches),
        **({} if budgeted else validation_schedule(cfg.val_every_batches, batches)),
    )
    # Everything built so far (imports, config, dataset, model: hundreds of thousands of Python
    # objects) lives for the whole run; freezing it keeps the cyclic collector from scanning it
    # again, which a full collection otherwise does once early in training, inside a step
    gc.freeze()
    phase = next(c for c in callbacks if isinstance(c, FitPhase))
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume)
    except RuntimeError as err:  # MQGNNStrategy names a peer's failure itself (RankFailure)
        if isinstance(err, RankFailure) or not (torch.distributed.is_initialized() and peer_failed(err)):
            raise
        raise rank_failure(phase.phase, err) from err
    if checkpoint.best_model_path:
        # the path, not "best": with two checkpoint callbacks Lightning warns about which it reads
        result, best = {"val": float(checkpoint.best_model_score)}, checkpoint.best_model_path
    elif trainer.limit_val_batches == 0:  # validation off (+trainer.limit_val_batches=0): no metric
        result, best = {"val": float("nan")}, None
    else:  # training ended (max_steps, max_time) before the first validation: score the last weights
        validated = trainer.validate(module, datamodule=datamodule, verbose=False)
        result, best = {"val": float(validated[0]["val/metric"])}, None
    link_fields = ""
    if cfg.test:
        tested = trainer.test(module, datamodule=datamodule, ckpt_path=best, verbose=False)
        result["test"] = float(tested[0]["test/metric"])
        if link:  # the test split's other scores: AUC, and MRR where it has per-source negatives
            result.update(
                {k.removeprefix("test/"): float(v) for k, v in tested[0].items() if k != "test/metric"}
            )
            link_fields = "".join(f" test_{k}={result[k]:.4f}" for k in ("auc", "mrr", "hits") if k in result)
    result.update(timer.summary())
    busy = ""
    if gpu_busy.busy_fraction is not None:
        result["gpu_busy"] = gpu_busy.busy_fraction
        busy = f" gpu_busy={gpu_busy.busy_fraction:.3f}"
    line = (
        f"RESULT model={cfg.model.name} data={dataset.name}"
        f"{f' task=link metric={link_metric_name(module)}' if link else ''} val={result['val']:.4f} "
        f"test={result.get('test', float('nan')):.4f}{link_fields} epochs={trainer.current_epoch} "
        f"batches={result['batches']} batch_time_ms={result['batch_time_ms']:.2f} "
        f"batch_time_std_ms={result['batch_time_std_ms']:.2f} train_time_s={result['train_time_s']:.2f}{busy}"
        f"{stages.result_fields()}{strategy_result_fields(strategy)}{memory.result_fields()}"
        f"{loader_result_fields(datamodule)}"
    )
    if trainer.global_rank == 0:
        print(line, flush=True)
    return {**result_fields(line), **result}


def check_node_task(data) -> None:
    """Node classification needs a dataset of labelled nodes: not a graph that comes with its own
    edge split, nor one without labels (both are link-prediction data)."""
    if isinstance(data, LinkDataset):
        raise RecipeError(
            f"data {data.name!r} is a link-prediction dataset with its own edge split: run it with task=link"
        )
    if not data.has_node_task:
        raise RecipeError(
            f"data {data.name!r} has no node labels to classify (data.labels=... gives them); "
            "task=link predicts its links"
        )


# how a link run is scored where neither the model config nor the data name it
LINK_SCORING = {"hits_k": 50, "metric": "hits"}


def link_scoring(make_module, data) -> dict:
    """The ``hits_k`` and ``metric`` the model config leaves open (null): the data's own where it
    is a ``LinkDataset`` that names them (OGB's: ogbl-ppa Hits@100, ogbl-citation2 MRR), else
    ``LINK_SCORING``."""
    own = {"hits_k": data.hits_k, "metric": data.metric} if isinstance(data, LinkDataset) else {}
    return {
        key: own.get(key) if own.get(key) is not None else default
        for key, default in LINK_SCORING.items()
        if make_module.keywords.get(key) is None
    }


def check_link_scoring(module, seeds: EdgeSeeds) -> None:
    """MRR ranks each positive against its own negatives: the split must have them."""
    if module.link_metric == "mrr" and seeds.split.val_neg_per_source is None:
        raise RecipeError(
            "model.module.metric=mrr ranks each positive against its own negatives, but the link split "
            "has none: give task.seeds.neg_per_source=<k>, or val_neg_per_source/test_neg_per_source files"
        )


def link_metric_name(module) -> str:
    """The RESULT line's name of ``val/metric``: ``hits@50``, ``mrr``."""
    return f"hits@{module.hits_k}" if module.link_metric == "hits" else module.link_metric


def check_module_arguments(model: str, make_module) -> None:
    """Every ``model.module`` key is an argument of the module it builds: a preset (``conf/preset/``)
    or the command line may set keys that some modules lack (``hidden`` for a PyG layer stack)."""
    parameters = inspect.signature(make_module.func).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(make_module.keywords) - set(parameters))
    if unknown:
        raise RecipeError(
            f"model {model!r}: {make_module.func.__qualname__} takes no "
            f"{', '.join(f'model.module.{key}' for key in unknown)} (set by the model config, a preset "
            "or the command line)"
        )


def validation_budget(cfg: DictConfig) -> ValidationBudget | None:
    """The validation schedule's budget: ``val_share`` of the work (``val_budget=work``) or of
    the wall time (``time``), checked every ``val_every_batches`` batches; None where the schedule
    is fixed in batches: ``val_share=null``, or ``val_every_batches=0``, a validation at every
    epoch's end."""
    share, of = cfg.get("val_share"), cfg.get("val_budget", "work")
    if of not in BUDGETS:
        raise RecipeError(f"val_budget={of!r}: not one of {', '.join(BUDGETS)}")
    if share is None or cfg.val_every_batches < 1:
        return None
    return BUDGETS[of](share=float(share), every_batches=cfg.val_every_batches)


BUDGETS = {"work": ValidationWorkBudget, "time": ValidationTimeBudget}


def check_resumable(cfg: DictConfig, ckpt_path: str, full_graph: bool) -> None:
    """What resuming from ``ckpt_path`` needs of the run's settings (the checkpoint's own checks
    come once the dataset has given the epoch's length)."""
    if full_graph:
        raise RecipeError(
            f"ckpt_path={ckpt_path}: full-graph strategies do not resume (their stale halo and "
            "activation buffers are not in a checkpoint); sampled training does"
        )
    if not epoch_bounded(cfg):
        raise RecipeError(
            f"ckpt_path={ckpt_path}: only a run bounded by epochs resumes (Lightning resumes a "
            f"step-bounded run's epoch-end checkpoint one batch off), not trainer.max_steps="
            f"{cfg.trainer.max_steps}: start and resume it with trainer.max_steps=null (the recipe's "
            "cap, step_cap) or -1, and trainer.max_epochs=N"
        )


def checkpoint_plugins(strategy) -> list:
    """Checkpoints whole or not at all, whatever the strategy: this package's strategies write with
    ``AtomicCheckpointIO`` already (Lightning refuses a second one), any other gets it as a plugin."""
    ours = isinstance(strategy, (MQGNNStrategy, FullGraphStrategyBase))
    return [] if ours else [AtomicCheckpointIO()]


def resolve_ckpt_path(ckpt_path: str | None, run_checkpoints: Path) -> str | None:
    """The checkpoint to resume: ``ckpt_path`` as given, or for ``auto`` the run folder's own
    ``checkpoints/last.ckpt`` when there is one (a job restarted in the same ``hydra.run.dir``,
    by a scheduler's requeue or ``torchrun --max-restarts``) and None when there is none yet."""
    if ckpt_path != "auto":
        return ckpt_path
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if restarts > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        rank_zero_warn(
            "torchrun shares its rendezvous store with the process group, so a restarted group reads "
            "the addresses of the group before and fails to connect: launch "
            "torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for --max-restarts to resume the run"
        )
    last = run_checkpoints / LAST_CHECKPOINT
    if not last.is_file():
        rank_zero_info(f"ckpt_path=auto: no {last} yet, starting the run")
        return None
    rank_zero_info(f"ckpt_path=auto: resuming from {last}")
    return str(last)


def checked_resume_checkpoint(cfg: DictConfig, path: str, hparams: dict, steps_per_epoch: int) -> Path:
    """The checkpoint ``path`` (the run's ``ckpt_path``), once it is known to continue this run: of a run
    started with the same settings (``check_same_run``), a Lightning checkpoint with the optimiser's
    state, written by a model of the same hyperparameters, at an epoch's end or where a signal
    stopped the run (``last.ckpt``; ``best.ckpt`` holds the weights only)."""
    file = Path(path)
    if not file.is_file():
        raise RecipeError(
            f"ckpt_path={path}: no such file (a run writes checkpoints/last.ckpt in its folder)"
        )
    check_same_run(cfg, file)
    try:
        checkpoint = torch.load(file, map_location="cpu", weights_only=True)  # as Lightning loads it
    except Exception as err:  # a truncated or foreign file: whatever the unpickler raises
        first_line = (str(err).splitlines() or [""])[0]
        raise RecipeError(
            f"ckpt_path={path}: not a readable checkpoint ({type(err).__name__}: {first_line})"
        ) from err
    if not isinstance(checkpoint, dict) or not {"global_step", "state_dict", "loops"} <= checkpoint.keys():
        raise RecipeError(
            f"ckpt_path={path}: not a Lightning training checkpoint (no global_step, state_dict, loops)"
        )
    saved = checkpoint.get("hyper_parameters", {})
    differ = [
        f"{key}={saved[key]!r} (this run: {value!r})"
        for key, value in hparams.items()
        if key in saved and saved[key] != value
    ]
    if differ:
        raise RecipeError(
            f"ckpt_path={path} was written by a different model: {', '.join(differ)}; resume with the run's own overrides"
        )
    if "optimizer_states" not in checkpoint:
        raise RecipeError(
            f"ckpt_path={path} holds a model's weights only (best.ckpt: the best validation's); "
            "resume from checkpoints/last.ckpt, which is written at epoch ends and where a signal stops the run"
        )
    step = int(checkpoint["global_step"])
    stopped_by = checkpoint.get("callbacks", {}).get(LastCheckpoint.__qualname__, {}).get("stopped_by", 0)
    if step % steps_per_epoch and not stopped_by:
        raise RecipeError(
            f"ckpt_path={path} was written inside an epoch (step {step}, {steps_per_epoch} steps an epoch); "
            "resume from checkpoints/last.ckpt, which is written at epoch ends and where a signal stops the run"
        )
    return file


# the settings a resumed run must keep: what decides the model and which batches it trains on (the
# loader's mode, queues and workers do not: the loaders make the same batches)
RUN_DEFINING = (
    "seed",
    "data",
    "model",
    "loader.batch_size",
    "loader.seed",
    "loader.shuffle",
    "loader.drop_last",
    "val_every_batches",  # Lightning resumes an epoch-end checkpoint wrongly under another schedule
    "val_share",  # and what it is of: which batches are validated, and so the best checkpoint
    "val_budget",
    "trainer.accumulate_grad_batches",
)


def check_same_run(cfg: DictConfig, checkpoint: Path) -> None:
    """Refuse to resume a run under other ``RUN_DEFINING`` settings than it was started with
    (another batch size or fan-out would train on other batches without a word), read from the
    config the run saved in its folder (``<run>/run_config.yaml``, beside ``<run>/checkpoints``); a
    checkpoint moved out of its run folder is not checked."""
    saved_file = checkpoint.parent.parent / RUN_CONFIG
    if not saved_file.is_file():
        return
    saved = OmegaConf.to_container(OmegaConf.load(saved_file), resolve=False)
    now = OmegaConf.to_container(cfg, resolve=False)
    differ = [
        f"{key}={old!r} (this run: {new!r})"
        for path in RUN_DEFINING
        for key, old, new in _differences(path, _at(saved, path), _at(now, path))
    ]
    if differ:
        raise RecipeError(
            f"ckpt_path={checkpoint} belongs to a run started with other settings ({saved_file}): "
            f"{', '.join(differ)}; resume with the run's own overrides"
        )


def _at(tree: dict, dotted: str):
    """The value at a dotted key of a plain config tree; None where it has none."""
    for key in dotted.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def _differences(key: str, old, new) -> list[tuple[str, object, object]]:
    """The dotted keys under ``key`` whose values differ between two plain config trees."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            d
            for k in sorted(old.keys() | new.keys())
            for d in _differences(f"{key}.{k}", old.get(k), new.get(k))
        ]
    return [] if old == new else [(key, old, new)]


def epoch_bounded(cfg: DictConfig) -> bool:
    """Whether the run ends at an epoch's end (``trainer.max_steps`` null: the recipe's cap, or -1),
    the runs ``LastCheckpoint`` writes for and the recipe resumes."""
    return cfg.trainer.get("max_steps") in (None, -1)


def run_length(cfg: DictConfig, batches_per_epoch: int) -> dict:
    """``max_steps`` and ``max_epochs`` of the trainer: with ``trainer.max_steps`` given, the
    trainer config's own; else the data-sized cap of ``step_cap``, in whole epochs: at least
    ``min_steps`` batches, rounded up to an epoch's end, and at least ``epochs`` epochs (a
    shorter ``trainer.max_epochs`` stands)."""
    if cfg.trainer.get("max_steps") is not None:
        return {"max_steps": int(cfg.trainer.max_steps)}
    cap = max(int(cfg.step_cap.epochs), math.ceil(int(cfg.step_cap.min_steps) / batches_per_epoch))
    epochs = cfg.trainer.get("max_epochs")
    epochs = -1 if epochs is None else int(epochs)
    return {"max_steps": -1, "max_epochs": cap if epochs < 0 else min(epochs, cap)}


def sampled_datamodule(
    cfg: DictConfig, loader: LoaderSettings, dataset, module, seeds: EdgeSeeds | None = None
) -> pl.LightningDataModule:
    """The mini-batch DataModule: the model config's sampler over ``dataset``, checked against
    the model's layers; ``seeds``: what seeds a batch (None: the training nodes; ``EdgeSeeds``)."""
    sampler = build_sampler(instantiate(cfg.model.sampler), dataset)
    if sampler.aggregation != module.aggregation:
        raise RecipeError(
            f"model {cfg.model.name!r}: sampler aggregation {sampler.aggregation!r} does not match "
            f"the layers' {module.aggregation!r}"
        )
    if sampler.num_layers != len(module.layers):
        raise RecipeError(
            f"model {cfg.model.name!r}: sampler has {sampler.num_layers} layers, model {len(module.layers)}"
        )
    # a sampler with a feature cache (GNS) shares it with the DataModule, which keeps it on the device
    return MQGNNDataModule(dataset, sampler, loader, seeds, feature_cache=getattr(sampler, "cache", None))


def recipe_callbacks(
    cfg: DictConfig,
    strategy,
    checkpoint_dir: Path | None = None,
    last_checkpoint: bool = False,
    log_every_n_steps: int = 50,
) -> list[pl.Callback]:
    """The recipe's callbacks: batch timer, GPU busy monitor, best-validation checkpoint and peak
    memory first (``train`` reads them), then early stopping, stage timing, the strategy's counters,
    with ``last_checkpoint`` the epoch-end checkpoint to resume from and, with the progress bar on,
    a bar refreshed once per logging interval (``log_every_n_steps``). Checkpoints go to ``checkpoint_dir`` (None:
    Lightning's default)."""
    callbacks = [
        BatchTimer(),
        GPUBusyMonitor(),
        ModelCheckpoint(
            dirpath=checkpoint_dir,
            monitor="val/metric",
            mode="max",
            save_top_k=1,
            filename="best",
            save_weights_only=True,  # what the test at the best validation reads: a third of the bytes under Adam
        ),
        PeakMemoryMonitor(),
        BatchEarlyStopping(**cfg.early_stopping),
        StageTimingCallback(cuda_sync=False),  # no device wait inside a step: host-side times
        *strategy_callbacks(strategy),
        FitPhase(),
    ]
    if (budget := validation_budget(cfg)) is not None:
        callbacks.append(budget)
    if last_checkpoint:
        if checkpoint_dir is None:
            raise ValueError("last_checkpoint needs a checkpoint_dir")
        callbacks.append(LastCheckpoint(checkpoint_dir, every_s=float(cfg.last_checkpoint_every_s)))
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(TQDMProgressBar(refresh_rate=log_every_n_steps))
    return callbacks


def build_sampler(factory, dataset):
    """Call a sampler config's partial with the graph, and the training split when it asks for
    one (GNS draws its cache from it)."""
    if "train_idx" in inspect.signature(factory.func).parameters:
        return factory(graph=dataset.graph, train_idx=dataset.train_idx)
    return factory(graph=dataset.graph)


def strategy_callbacks(strategy) -> list[pl.Callback]:
    """MQGNNStrategy's communication counters (gradient wait, syncs) are logged as ``comm/*``."""
    return (
        [CommStatsMonitor()]
        if isinstance(strategy, MQGNNStrategy) or strategy in ("mqgnn", "mqgnn_spawn")
        else []
    )


def strategy_result_fields(strategy) -> str:
    """Extra RESULT fields a strategy reports (the full-graph strategies: ``comm_bytes=`` per epoch)."""
    fields = getattr(strategy, "result_fields", None)
    return fields() if callable(fields) else ""


def loader_result_fields(datamodule) -> str:
    """Extra RESULT fields of the pipelined loader: who produced the batches (``ProducerChoice``)."""
    loader = getattr(datamodule, "pipeline_loader", None)
    return loader.producer_choice.result_fields() if loader is not None else ""


def datamodule_batches(datamodule, world_size: int) -> int:
    """Training batches an epoch on every rank: of the nodes or edges that seed them."""
    return datamodule.source.num_batches(world_size)


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except (RecipeError, ValueError, FileNotFoundError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except Preempted as err:  # a scheduler's signal: last.ckpt is written, the same command resumes
        if err.rank == 0:
            print(f"{err}; run again with ckpt_path=auto to resume", file=sys.stderr, flush=True)
        sys.exit(err.code)
    except CheckpointError as err:  # not the input's fault: the disk's, or a file damaged since
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    except RankFailure as err:  # the line says what happened; the traceback goes to the run's folder
        log = Path(HydraConfig.get().runtime.output_dir) / f"error_rank{err.rank}.log"
        log.write_text("".join(traceback.format_exception(err)))
        print(f"error: {err} (traceback: {log})", file=sys.stderr, flush=True)
        end_launched_ranks()
        sys.exit(1)
    except (InstantiationException, OmegaConfBaseException) as err:
        print(f"error: {config_error_line(err)}", file=sys.stderr, flush=True)
        sys.exit(2)
    except BaseException:  # unforeseen: the traceback stands, and no rank this one started outlives it
        end_launched_ranks()
        raise


def run(cfg: DictConfig) -> None:
    """``train`` once, or with ``seeds=`` once per seed, each in a folder of its own
    (``<run>/seed_<s>/``, where its checkpoints, logs and ``ckpt_path=auto`` look), then their
    summary. Rank 0 writes each run's ``result.json`` and the summary; ``ckpt_path=auto`` goes on
    with a ``seeds=`` run that stopped, not running again a seed that has its ``result.json``."""
    task = list(HydraConfig.get().overrides.task)
    config = configuration(task)
    seeds = checked_seeds(cfg, task)
    root = Path(cfg.trainer.get("default_root_dir") or ".")
    if seeds is None:
        record(cfg, root, config)
        return
    runs = []
    for seed in seeds:
        folder = root / seed_folder(seed)
        if cfg.ckpt_path == "auto" and (folder / RESULT_FILE).is_file():
            runs.append(finished_run(folder / RESULT_FILE, config))
            continue
        seed_cfg = copy.deepcopy(cfg)
        seed_cfg.seed = seed
        seed_cfg.trainer.default_root_dir = str(folder)
        runs.append(record(seed_cfg, folder, config))
    if rank_zero_only.rank == 0:
        summary = summarize(runs)
        csv_file, json_file = write_summaries([summary], root)
        print(summary_line(summary), flush=True)
        rank_zero_info(f"seeds: {len(runs)} runs summarised in {csv_file} and {json_file}")


def checked_seeds(cfg: DictConfig, task: list[str]) -> list[int] | None:
    """``seeds=`` as a list, None where it is not given; it sets every run's seed and folder, so
    a ``seed=`` beside it, or a ``ckpt_path`` other than ``auto``, is an error."""
    given = cfg.get("seeds")
    seeds = seed_list(OmegaConf.to_container(given) if isinstance(given, ListConfig) else given)
    if seeds is None:
        return None
    if any(o.split("=", 1)[0].lstrip("+~") == "seed" for o in task):
        raise RecipeError(
            f"seed={cfg.seed} and seeds={','.join(map(str, seeds))}: seeds= sets each run's seed, give one of them"
        )
    if cfg.ckpt_path not in (None, "auto"):
        raise RecipeError(
            f"ckpt_path={cfg.ckpt_path}: one checkpoint resumes one run, not the runs of seeds=; "
            "ckpt_path=auto in the seeds= run's folder (hydra.run.dir=<run>) resumes each seed's"
        )
    return seeds


def record(cfg: DictConfig, folder: Path, config: tuple[str, ...]) -> RunResult:
    """``train``, its RESULT fields written to ``<folder>/result.json`` on rank 0."""
    run = RunResult(int(cfg.seed), config, train(cfg), folder)
    # train() froze its heap for one fit: a next one in this process (the next seed, a -m sweep's
    # next job) starts without this one's dataset, model and trainer
    gc.unfreeze()
    gc.collect()
    if rank_zero_only.rank == 0:
        write_result(run)
    return run


def finished_run(path: Path, config: tuple[str, ...]) -> RunResult:
    """A seed's run that ended before this ``ckpt_path=auto`` start, read back from its
    ``result.json``: of the same overrides, or the summary would mix two configurations."""
    run = read_result(path)
    if run.config != config:
        raise RecipeError(
            f"{path} is of a run with other overrides ({' '.join(run.config) or 'none'}; this run: "
            f"{' '.join(config) or 'none'}): resume with the run's own overrides"
        )
    rank_zero_info(f"ckpt_path=auto: seed {run.seed} ended before ({path}), not run again")
    return run


def end_launched_ranks(grace_s: float = 0.5) -> None:
    """End what this process started and left running: Lightning's launcher starts a machine's
    other ranks as children of rank 0 and leaves them when rank 0 fails, so a rank that hangs
    would outlive the run. Each gets ``grace_s`` to end by itself (a rank whose collective failed
    too says its own line), then it is killed, its sampler workers with it."""
    children = psutil.Process().children(recursive=True)
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def config_error_line(err: InstantiationException | OmegaConfBaseException) -> str:
    """The first line of what a bad configuration raised (Hydra wraps the cause in more lines)."""
    return str(err.__cause__ or err).splitlines()[0]


def check_config_keys(argv: list[str], config_name: str) -> None:
    """Reject an override of a key the configuration does not have (``data.pth=...``), which
    Hydra reports in six lines: the configuration is composed once with the overrides (Hydra's
    compose API, the same rules as the run's), and only that error is turned into one line; any
    other problem is left to Hydra. Sweeps (``-m``) are left alone."""
    overrides = [a for a in argv if "=" in a and not a.startswith(("-", "hydra"))]
    if not overrides or any(a in ("-m", "--multirun") for a in argv):
        return
    with hydra.initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        try:
            hydra.compose(config_name=config_name, overrides=overrides)
        except Exception as err:  # whatever else failed, Hydra reports it in the run
            match = re.match(r"Could not override '([^']+)'", str(err))
            if match and "not in struct" in str(err.__cause__ or ""):
                key = match.group(1)
                if key in RENAMED:
                    raise RecipeError(f"{key}: no such config key; it is now {RENAMED[key]}") from err
                raise RecipeError(
                    f"{key}: no such config key (to add a key the config lacks: +{key}=...)"
                ) from err


# keys the recipe once had, and what says the same now
RENAMED = {"val_time_share": "val_share=<share> val_budget=time (val_share=null: every val_every_batches)"}


def exit_on_unknown_config_names(argv: list[str], config_name: str = "config") -> None:
    """``check_config_names`` and ``check_config_keys`` as a script's first step: one
    ``error:`` line and exit code 2."""
    try:
        check_config_names(argv)
        check_config_keys(argv, config_name)
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)


def cli() -> None:
    """The ``mqgnn-train`` command (and ``recipes/train.py`` in a clone): the command line's
    ``seeds=`` as a list and its config names and keys checked, then the Hydra run."""
    sys.argv[1:] = seeds_as_list(sys.argv[1:])
    exit_on_unknown_config_names(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
