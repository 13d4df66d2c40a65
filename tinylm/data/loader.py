"""Reading a packed dataset: seekable training batches, fixed validation windows, a resumable DataLoader.

Letters in shape comments: B = batch size, T = block size (context length in tokens).
"""

from __future__ import annotations

import os
import signal
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

_M1, _M2, _M3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A bijective 64-bit mix (splitmix64's finalizer): consecutive inputs give unrelated outputs."""
    x = x + _M1
    x = (x ^ (x >> np.uint64(30))) * _M2
    x = (x ^ (x >> np.uint64(27))) * _M3
    return x ^ (x >> np.uint64(31))


WINDOWS_PER_MAP = 4096
"""Windows read through one memmap before it is mapped anew: every page a mapping has touched (64 KiB a random
window, with the kernel's fault-around) stays in the process's resident memory until it is unmapped, so a memmap
kept open grew each rank and worker to the size of the file over a long run (8 GB after 256k windows)."""


class _TokenWindows(Dataset):
    """Reads windows of T + 1 tokens from a .bin file, memory-mapped lazily in whichever process reads
    (an open memmap is never pickled into DataLoader workers), and mapped anew every WINDOWS_PER_MAP windows."""

    def __init__(self, path: str | Path, *, dtype: str, n_tokens: int, block_size: int, batch_size: int) -> None:
        self.path, self.dtype, self.n_tokens = str(path), dtype, n_tokens
        self.block_size, self.batch_size = block_size, batch_size
        self._data: np.memmap | None = None
        self._mapped = 0  # windows read through self._data
        self._file = None  # the file mapped, held open: a re-map reads the file the run opened (deleted or replaced
        # since: a cache cleaned, a dataset prepared again) as one memmap kept open did

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_data": None, "_file": None}

    def windows(self, offsets: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if self._data is None or self._mapped >= WINDOWS_PER_MAP:
            if self._file is None:
                self._file = open(self.path, "rb")  # noqa: SIM115 (held for the dataset's life, as a memmap was)
                weakref.finalize(self, self._file.close)  # closed with it (a ResourceWarning each fit otherwise)
            self._data = np.memmap(self._file, dtype=np.dtype(self.dtype).newbyteorder("<"), mode="r")
            self._mapped = 0
        self._mapped += len(offsets)
        idx = offsets[:, None] + np.arange(self.block_size + 1)  # (B, T + 1): the target needs the next token too
        buf = torch.from_numpy(self._data[idx].astype(np.int64))  # (B, T + 1)
        return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()  # x, y: (B, T) each


class TrainBatches(_TokenWindows):
    """Batch k (of this rank) is B windows at random offsets that are a pure function of (seed, sample index),
    where rank r's batch k holds samples (k * world_size + r) * B ... + B - 1. So resuming at batch k needs only
    k, ranks never share windows, and 1 device x batch 2B draws the same windows as 2 devices x batch B."""

    def __init__(self, path: str | Path, *, dtype: str, n_tokens: int, block_size: int, batch_size: int,
                 seed: int, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(path, dtype=dtype, n_tokens=n_tokens, block_size=block_size, batch_size=batch_size)
        if n_tokens < block_size + 1:
            raise ValueError(f"train split has {n_tokens} tokens, fewer than block_size + 1 = {block_size + 1}")
        self.seed, self.rank, self.world_size = seed, rank, world_size

    def offsets(self, k: int) -> np.ndarray:
        first = (k * self.world_size + self.rank) * self.batch_size
        samples = np.arange(first, first + self.batch_size, dtype=np.uint64)
        key = _splitmix64(np.array([self.seed], dtype=np.uint64))
        high = np.uint64(self.n_tokens - self.block_size)  # offsets 0 .. n - T - 1 leave room for the target
        return (_splitmix64(samples ^ key) % high).astype(np.int64)  # (B,)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.windows(self.offsets(k))


class MixedTrainBatches(Dataset):
    """Training batches drawn from several datasets in proportion to `weights`. Sample s comes from the source
    that a second hash of (seed, s) picks (source j when the hash, read as a number in [0, 1), falls in the j-th
    slice of the cumulative weights), at the offset that source's own `TrainBatches` gives sample s. So a batch is
    still a pure function of (seed, batch index, rank): exact and elastic resume hold as for one dataset."""

    def __init__(self, parts: list[TrainBatches], weights: list[float]) -> None:
        assert len(parts) == len(weights) > 0 and all(w > 0 for w in weights)
        self.parts, self.weights = parts, [w / sum(weights) for w in weights]
        self.cum = np.cumsum(self.weights)
        self.cum[-1] = 1.0  # float rounding must not leave a gap at the top
        self.batch_size, self.block_size = parts[0].batch_size, parts[0].block_size
        self.n_tokens = sum(p.n_tokens for p in parts)

    def sources(self, k: int) -> np.ndarray:
        """Which part each of batch k's samples comes from: (B,) ints."""
        p = self.parts[0]
        first = (k * p.world_size + p.rank) * self.batch_size
        samples = np.arange(first, first + self.batch_size, dtype=np.uint64)
        key = _splitmix64(np.array([p.seed ^ 0x6D6978], dtype=np.uint64))  # "mix": unrelated to the offsets' key
        u = (_splitmix64(samples ^ key) >> np.uint64(11)).astype(np.float64) * 2.0**-53  # uniform in [0, 1)
        return np.searchsorted(self.cum, u, side="right")

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        src = self.sources(k)
        x = torch.empty(self.batch_size, self.block_size, dtype=torch.int64)  # (B, T)
        y = torch.empty_like(x)
        for j, part in enumerate(self.parts):
            rows = np.flatnonzero(src == j)
            if len(rows):
                x[rows], y[rows] = part.windows(part.offsets(k)[rows])
        return x, y


IGNORE = -100  # F.cross_entropy's ignore_index: a target that counts in no loss (training's and validation's)


class ValBatches(_TokenWindows):
    """Windows tiling the whole split in order (the last batch may be smaller), every target scored once: the
    non-overlapping windows, then, when the split's last targets are left over (fewer than T), one window ending
    at the split's end whose earlier targets, scored already, are IGNORE (they keep their full context). `limit`
    keeps the first batches only. The same on every call.

    Under several ranks each takes every `world_size`-th batch from its `rank` on (their sums add up to the
    split's, also with fewer batches than ranks). Every rank runs as many batches: a rank whose share is one short
    ends on a batch whose targets are all IGNORE (it counts nothing). Under FSDP each forward gathers the weights
    from every rank, and a rank with a batch fewer left the others waiting for it forever (3 batches on 2 ranks).
    (With fewer batches than ranks every rank once took all of them: val/loss and val/bpb, ratios, came out the
    same, but the bytes of text `tinylm validate` says it scored were counted once per rank.)"""

    def __init__(self, path: str | Path, *, dtype: str, n_tokens: int, block_size: int, batch_size: int,
                 limit: int | None = None, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(path, dtype=dtype, n_tokens=n_tokens, block_size=block_size, batch_size=batch_size)
        whole = (n_tokens - 1) // block_size
        self.tail = (n_tokens - 1) - whole * block_size if whole else 0  # targets after the whole windows
        self.n_windows = whole + (self.tail > 0)
        n = -(-self.n_windows // batch_size)
        self.n_batches = n if limit is None else min(n, limit)  # in all, over every rank
        self.rank, self.world_size = rank, world_size

    def __len__(self) -> int:
        return -(-self.n_batches // self.world_size)  # the same on every rank

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        j = self.rank + i * self.world_size  # the batch of the split
        if j >= self.n_batches:  # this rank's share is one short: a batch that counts nothing
            x, y = self._batch(0)  # (the split's first batch: any one, as its targets are all ignored)
            return x, torch.full_like(y, IGNORE)
        return self._batch(j)

    def _batch(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``j`` of the split (0 <= j < n_batches): x, y (B, T), y's targets scored already IGNORE."""
        T = self.block_size
        w = np.arange(j * self.batch_size, min((j + 1) * self.batch_size, self.n_windows), dtype=np.int64)
        x, y = self.windows(np.minimum(w * T, self.n_tokens - 1 - T))  # the last window ends at the split's end
        if self.tail and w[-1] == self.n_windows - 1:
            y = y.clone()  # x and y may be views of one buffer (a batch of one window)
            y[-1, : T - self.tail] = IGNORE
        return x, y


class _EpochSampler(Sampler[int]):
    """This rank's batch ids from `start` to the end of its notional epoch (ids keep counting across epochs). Epochs
    end at the ids `offset` + a multiple of `epoch_length` (a resume shifts them to where Lightning's restored loop
    counts its epoch to end: `TinyLMDataModule.resume_split`)."""

    def __init__(self, epoch_length: int, offset: int = 0) -> None:
        self.epoch_length, self.offset, self.start = epoch_length, offset, 0

    def __len__(self) -> int:
        return self.epoch_length

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.start + self.epoch_length - (self.start - self.offset) % self.epoch_length))


WORKER_GRACE_S = 60
"""How long a DataLoader worker lives on after a SIGTERM (see `worker_signals`)."""


def worker_signals(worker_id: int) -> None:
    """A DataLoader worker's `worker_init_fn`: SIGTERM leaves the worker running, for WORKER_GRACE_S seconds, and
    Ctrl+C (SIGINT) and SIGHUP do nothing to it. A SIGTERM sent to every process of a job (SLURM's time limit and
    scancel, systemd, `kill -TERM -- -PGID`) reached the workers too, and torch's handler ended them: the main
    process then failed with "DataLoader worker ... is killed by signal" instead of saving at the step boundary
    (tinylm.train.interrupt), which needs its next batch. A worker stuck past the grace ends by SIGALRM.

    A SIGTERM from the loader itself ends the worker at once: torch stops its workers by a message on their queues,
    and terminates (SIGTERM) those still alive 5 s later. The message never arrives when the loader's iterator is
    freed as part of a reference cycle (the garbage collector finalizes the queues first), and the worker then
    outlived the loader's SIGTERM: each such iterator cost WORKER_GRACE_S at exit, or at a garbage collection."""
    # torch's worker loop, which calls this, holds the event the loader sets before it stops its workers
    stopping = sys._getframe(1).f_locals.get("done_event")
    grace = False

    def on_sigterm(signum: int, frame: Any) -> None:
        nonlocal grace
        if stopping is not None and _set_now(stopping):
            os._exit(0)  # the loader is stopping this worker: nothing of its work is waited for
        if not grace:  # a second SIGTERM to the group does not extend (or end) the grace
            grace = True
            signal.alarm(WORKER_GRACE_S)

    signal.signal(signal.SIGTERM, on_sigterm)
    # the grace's end: a SIGALRM handler the main process installed (a script's own time limit, pytest-timeout's),
    # which a forked worker inherits, would run here instead of ending the worker
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    # Ctrl+C reaches every process of the terminal's foreground group: the workers too, where a KeyboardInterrupt
    # ended them, and the run failed on its next batch instead of stopping. The main process decides what it stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a closed terminal's SIGHUP reaches the job's whole group (the shell passes it on): likewise the main process's
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _set_now(event: Any) -> bool:
    """Whether the loader's stop event (multiprocessing's Event) is set, read from a signal handler: without the
    lock of its condition, which Event.is_set takes and which the signal may have found held, by this worker (in its
    loop's own is_set) or by another worker of the loader (it shares the event): the handler waited for it for good,
    and with it every worker and the loader (a SIGTERM to the job hung the run). Taken by another process at that
    very moment, a set event reads as not set: the worker then lives on its grace, and its loop sees the stop."""
    flag = getattr(event, "_flag", None)  # (the semaphore that is_set tries under the condition's lock)
    if flag is None:
        return event.is_set()
    if flag.acquire(False):
        flag.release()
        return True
    return False


_iterators: weakref.WeakSet = weakref.WeakSet()  # the iterators of this process's StoppingLoaders with workers
_stopping_in: int | None = None  # the process that registered _stop_workers to run at its exit


def _stop_workers() -> None:
    """Stop the workers of every loader iterator still open as this process exits, as the iterator does when it is
    deleted (its `_shutdown_workers`: they finish and exit 0). Runs before multiprocessing ends the daemonic children
    with SIGTERM, which these workers outlive (`worker_signals`): a script, or a test, that exited with an iterator
    open waited WORKER_GRACE_S, then printed "DataLoader worker ... is killed by signal: Alarm clock"."""
    for iterator in list(_iterators):
        stop = getattr(iterator, "_shutdown_workers", None)
        if stop is not None:
            stop()


class StoppingLoader(DataLoader):
    """A DataLoader whose workers (`worker_signals`) are stopped when the process exits with one of its iterators
    still open."""

    def __iter__(self) -> Any:
        iterator = super().__iter__()
        global _stopping_in
        if self.num_workers:
            if _stopping_in != os.getpid():  # once per process (a forked one starts with no exit hooks)
                from multiprocessing.util import Finalize

                Finalize(None, _stop_workers, exitpriority=20)  # at exit: before the queues close (10), and the
                # daemonic children are ended
                _stopping_in = os.getpid()
            _iterators.add(iterator)
        return iterator


class ResumableLoader(StoppingLoader):
    """A DataLoader over `TrainBatches` that counts the batches it has yielded. Lightning saves `state_dict()` in
    checkpoints (it does so only for loaders that have one) and after `load_state_dict` iteration resumes at that
    batch (the data module saves the same count with its own state, for the checks it makes on a resume). Its own
    `generator` keeps iteration from drawing on the global RNG (resumed dropout stays exact)."""

    def __init__(self, dataset: TrainBatches, *, epoch_length: int, start: int = 0, num_workers: int = 0,
                 pin_memory: bool = False, seed: int = 0, epoch_offset: int = 0) -> None:
        self.epoch_length, self.batches_yielded = epoch_length, start
        self._positions = _EpochSampler(epoch_length, epoch_offset)
        super().__init__(dataset, batch_size=None, sampler=self._positions, num_workers=num_workers,
                         pin_memory=pin_memory, generator=torch.Generator().manual_seed(seed),
                         worker_init_fn=worker_signals if num_workers else None)

    def __iter__(self) -> Iterator[Any]:
        self._positions.start = self.batches_yielded
        for batch in super().__iter__():
            self.batches_yielded += 1  # before yielding: a checkpoint taken while this batch trains counts it
            yield batch

    def state_dict(self) -> dict:
        return {"batches_yielded": self.batches_yielded}

    def load_state_dict(self, state: dict) -> None:
        self.batches_yielded = int(state["batches_yielded"])
