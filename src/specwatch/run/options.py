"""How one `specwatch run` on a GPU host runs: the options the runner, its schedules and its groups share."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from specwatch.core.placement import ExecutorKind, TimingScope
from specwatch.core.record import CaseRecord


@dataclass(frozen=True)
class Shard:
    """``--shard I/N``: this process runs engine groups whose index % N == I (1-based I)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> "Shard":
        try:
            i, n = (int(x) for x in text.split("/"))
        except ValueError:
            raise ValueError(f"--shard takes I/N (e.g. 1/3), got {text!r}") from None
        if not 1 <= i <= n:
            raise ValueError(f"--shard {text}: need 1 <= I <= N")
        return cls(i, n)


@dataclass(frozen=True)
class RunOptions:
    """Everything about a run but its suites and results root (``run.runner.run_suites``)."""

    faults: tuple[Optional[str], ...] = (None,)
    """Faults each suite runs under, one pass each (None: a clean pass)."""
    resume: bool = False
    """Leave out cases already recorded ok or skipped in the results file."""
    shard: Optional[Shard] = None
    """Run only this shard's engine groups (``--shard I/N``)."""
    models_dir: Path = Path("/tmp/specwatch-models")
    """Where the workers write and find the oracle checkpoints."""
    progress: Optional[Callable[[CaseRecord], None]] = None
    """Called with every record as it is appended."""
    start_progress: Optional[Callable[[CaseRecord, int, int], None]] = None
    """Called with each ok engine start of a multi-start case as it is journaled, its number among
    the case's starts so far and the starts planned (the merged record comes after the last)."""
    max_groups: Optional[int] = None
    """Run at most this many engine groups (the rest stay unrecorded)."""
    gpus: Optional[int] = None
    """GPUs the host has, instead of the count the host reports (cases wider are recorded skipped)."""
    worker_module: str = "specwatch.worker"
    """Module the worker processes run (``python -m MODULE SPEC``); tests give a fake one."""
    extra_env: Optional[dict] = field(default=None, hash=False)
    """Environment entries added to every worker's environment."""
    where: Optional[dict] = field(default=None, hash=False)
    """Only cases whose fields match (``suite.parse_where``)."""
    parallel_starts: int = 1
    """Engines started at once, timed one at a time (``core.timing_lock``); 1: one after another."""
    stop_after_s: Optional[float] = None
    """Start no new group (or wave) after this many seconds; the rest is left to ``resume``."""
    group_timeout_s: Optional[float] = None
    """Wall-clock limit per engine group instead of the suites' ``timeout_s``; a group past it is
    recorded ``timeout`` with its log tail."""
    bare: bool = False
    """Run SGLang without specwatch's probe (records in ``SUITE+bare``): the harness-overhead baseline."""
    baseline: bool = False
    """Also time each speculative case's baseline: the plain loop of ``sglang.Engine.generate`` in
    a process of its own, interleaved with the probed engine group (``run.baseline``)."""
    paired: bool = False
    """With ``baseline``: the plain loop's engine up beside the probed engine; with two ``faults``:
    the two passes' engines up together; the two taking turns batch by batch (``core.turns``)
    instead of running one after the other."""
    baseline_module: str = "specwatch.worker.baseline"
    """Module the baseline processes run (``python -m MODULE SPEC``); tests give a fake one."""
    known_root: Optional[Path] = None
    """Another results root whose records (any status) of the same machine, SGLang version, suite and
    fault leave their cases out (e.g. the committed ``results/``)."""
    overlap_starts: bool = False
    """With ``parallel_starts`` > 1: no waves, that many groups in flight (``run.schedule._run_rolling``)."""
    timing_lock: Optional[Path] = None
    """With ``overlap_starts``: a lock file shared with other runs on the host, so no two timed
    batches of any of them overlap."""
    executor: ExecutorKind = ExecutorKind.local
    """Who runs the engine groups (``run.executors``): this host as one pool, its GPUs one set per
    group, or a Ray cluster."""
    gpu_ids: Optional[tuple[str, ...]] = None
    """``executor`` gpus: the GPUs to use (``--gpus 0,1,2,3``); None: every GPU the host lists."""
    timing_scope: TimingScope = TimingScope.host
    """``executor`` gpus or ray: whether timed batches exclude each other host-wide or per GPU set."""
    ray_address: Optional[str] = None
    """``executor`` ray: the cluster to join (``ray.init(address=...)``); None: ``RAY_ADDRESS`` or a
    Ray started here."""

    def __post_init__(self) -> None:
        """``executor`` and ``timing_scope`` given by name read as their enums."""
        object.__setattr__(self, "executor", ExecutorKind(self.executor))
        object.__setattr__(self, "timing_scope", TimingScope(self.timing_scope))

    @property
    def probe(self) -> bool:
        """Whether SGLang's processes carry specwatch's probe (not a bare run)."""
        return not self.bare
