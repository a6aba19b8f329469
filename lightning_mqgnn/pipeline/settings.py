"""How a sampled run's loaders run: ``LoaderSettings``, every plain setting of
``MQGNNDataModule`` in one checked object, and its part the multi-queue pipeline reads
(``PipelineSettings``: workers, queues, adaptive queue size)."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_mqgnn.pipeline.host_cache import POLICIES
from lightning_mqgnn.pipeline.placement import check_place
from lightning_mqgnn.pipeline.producer_choice import PRODUCERS
from lightning_mqgnn.pipeline.workers import check_start_method, default_num_workers

MODES = ("sequential", "pipeline", "device")
DEVICE_SAMPLERS = ("thread", "process")  # where the device-resident producer samples


def check_queue_size(q: int | str) -> None:
    """A device queue's size: a positive int, or ``"auto"`` for eq. 24-25."""
    if q != "auto" and (not isinstance(q, int) or q < 1):
        raise ValueError(f"queue_size must be a positive int or 'auto', got {q!r}")


def check_device_sampler(device_sampler: str, sampler_processes: int) -> None:
    """``ValueError`` naming the option unless ``device_sampler`` is one of ``DEVICE_SAMPLERS``
    and ``sampler_processes`` at least 1."""
    if device_sampler not in DEVICE_SAMPLERS:
        raise ValueError(f"device_sampler must be one of {DEVICE_SAMPLERS}, got {device_sampler!r}")
    if sampler_processes < 1:
        raise ValueError(f"sampler_processes must be >= 1, got {sampler_processes}")


@dataclass(frozen=True, kw_only=True)
class PipelineSettings:
    """What the multi-queue pipeline (``PipelinedLoader``) reads: its workers, its two queues and
    how the device queue's size adapts."""

    num_workers: int | None = None
    """Sampler worker processes of this rank; None: the cores of this rank less one."""
    queue_size: int | str = "auto"
    """Batches in the device queue: an int, or ``"auto"`` to size it by eq. 24-25 from the stage
    times (re-estimated when they drift). The device-resident loader's queue too."""
    cpu_queue_size: int | None = None
    """Batches the workers make ahead of the transfer; None: ``2 * num_workers``."""
    start_method: str = "auto"
    """How workers start: ``"auto"`` forks on Linux for single-threaded workers (fork with
    OpenMP threads can deadlock), else ``"forkserver"``/``"spawn"``."""
    worker_threads: int = 1
    """Torch threads of each worker."""
    warmup_batches: int = 5
    """Batches whose stage times the queue-size estimate drops (start-up costs)."""
    window_batches: int = 20
    """Batches of stage times each queue-size estimate averages."""
    memory_margin: float = 0.1
    """Share of the peak device memory the adaptive queue leaves free."""
    producer: str = "auto"
    """``"auto"``: the training thread makes the batches with every core, the workers start only
    where its steps on the cores they would leave are faster than that, and the faster is kept
    (``ProducerChoice``); ``"workers"``: always the workers."""

    def __post_init__(self) -> None:
        if self.num_workers is not None and self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 (or None for auto), got {self.num_workers}")
        check_queue_size(self.queue_size)
        if self.cpu_queue_size is not None and self.cpu_queue_size < 1:
            raise ValueError(f"cpu_queue_size must be >= 1 (or None for auto), got {self.cpu_queue_size}")
        if self.worker_threads < 1:
            raise ValueError(f"worker_threads must be >= 1, got {self.worker_threads}")
        check_start_method(self.start_method, self.worker_threads)
        if self.warmup_batches < 0:
            raise ValueError(f"warmup_batches must be >= 0, got {self.warmup_batches}")
        if self.window_batches < 1:
            raise ValueError(f"window_batches must be >= 1, got {self.window_batches}")
        if self.producer not in PRODUCERS:
            raise ValueError(f"producer must be one of {PRODUCERS}, got {self.producer!r}")
        if not 0.0 <= self.memory_margin < 1.0:
            raise ValueError(f"memory_margin must be in [0, 1), got {self.memory_margin}")

    @property
    def fixed_queue_size(self) -> int | None:
        """The device queue's size when fixed, None when adaptive."""
        return None if self.queue_size == "auto" else int(self.queue_size)

    def workers(self, ranks_on_node: int) -> int:
        """The number of sampler workers of one rank."""
        return self.num_workers or default_num_workers(ranks_on_node)

    def cpu_capacity(self, num_workers: int) -> int:
        return max(1, self.cpu_queue_size if self.cpu_queue_size is not None else 2 * num_workers)


@dataclass(frozen=True, kw_only=True)
class LoaderSettings(PipelineSettings):
    """Every plain setting of a sampled run's loaders, checked when made (before a dataset loads),
    a bad one refused with its field and value. The pipeline's settings (``PipelineSettings``) are
    fields of it too, so one flat object, or one flat ``loader`` config of the recipe, sets them
    all; the dataset, the sampler and a feature cache, which hold state, are the DataModule's own
    arguments."""

    mode: str = "sequential"
    """``"sequential"``: sample, gather, then compute in the training process, no overlap (the
    baseline). ``"pipeline"``: the multi-queue pipeline (``PipelinedLoader``). ``"device"``: the
    device-resident loader on the training device, whatever it is (on a CPU trainer the same
    code on the CPU). Every mode seeds a batch's sampling from (``seed``, epoch, batch index),
    so all train on the same batches."""
    batch_size: int = 1024
    """Training seeds per batch."""
    shuffle: bool = True
    """Shuffle the training seeds every epoch (from ``seed`` and the epoch)."""
    drop_last: bool = False
    """Drop each rank's last, short batch of an epoch."""
    seed: int = 0
    """Seeds the shuffle and every batch's sampling."""
    aggregate_inputs: bool = False
    """The gather stage computes the first layer's aggregation (``batch.aggregated``) instead of
    gathering its input rows, for a module that declares ``accepts_aggregated_inputs`` (as
    ``NodeClassifier`` does; others get ``batch.features``); not with a feature cache."""
    sample_on: str = "cpu"
    """Where the graph lives and batches are sampled: ``"auto"``, ``"cpu"`` or ``"cuda"``
    (``pipeline/placement.py``). Sampling on the CUDA device takes the device-resident loader,
    whatever ``mode`` says."""
    features_on: str = "auto"
    """Where the feature matrix lives: ``"auto"``, ``"cpu"`` or ``"cuda"``; features that do not
    fit the device stay in host memory (logged)."""
    device_sampler: str = "thread"
    """Who samples for the device-resident loader: ``"thread"`` of the training process, or
    ``"process"``: ``sampler_processes`` spawned processes taking the batches in turn, apart from
    the training loop's interpreter (resident features without a feature cache only, else the
    thread)."""
    sampler_processes: int = 2
    """Processes of ``device_sampler="process"``."""
    host_cache_gb: float = 0.0
    """For features on disk: GB of the rows batches read most, held in memory for the sequential
    and pipelined loaders' gather stage (``pipeline/host_cache.py``); 0: the page cache alone.
    With several ranks, one tier per machine, filled by its local rank 0."""
    host_cache_policy: str = "walk"
    """Which rows the host tier holds: ``"walk"`` (the sampler's random-walk mass from the training
    set) or ``"degree"``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        check_place("sample_on", self.sample_on)
        check_place("features_on", self.features_on)
        check_device_sampler(self.device_sampler, self.sampler_processes)
        if self.host_cache_gb < 0:
            raise ValueError(f"host_cache_gb must be >= 0, got {self.host_cache_gb}")
        if self.host_cache_policy not in POLICIES:
            raise ValueError(f"host_cache_policy must be one of {POLICIES}, got {self.host_cache_policy!r}")
        if self.host_cache_gb and self.mode == "device":
            raise ValueError(
                f"host_cache_gb={self.host_cache_gb} with mode='device': the host tier serves the "
                "sequential and pipeline loaders' gather stage; the device loader gathers on the device"
            )
