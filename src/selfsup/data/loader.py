"""Batches of indices → batches of uint8 images, one indexing operation per batch.

``EpochBatchSampler`` draws one permutation per (seed, epoch); global batch i is the slice
``perm[i·B·W:(i+1)·B·W]`` and process r takes its r-th sub-slice, so the processes' batches
concatenated in rank order are exactly the single-process batch.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Callable

import torch
from torch.utils.data import DataLoader, Sampler

from selfsup.data.datasets import ImageDataset, FolderImages
from selfsup.data.decode import FolderCrops
from selfsup.data.shards import ShardCrops


class EpochBatchSampler(Sampler):
    """Yields this process's index batches for one epoch; ``set_epoch`` reshuffles (drop_last)."""

    def __init__(self, n: int, batch_size: int, *, seed: int = 0, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, drop_last: bool = True, consumed: Callable[[], int] | None = None,
                 tag_epoch: bool = False):
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.tag_epoch = tag_epoch  # yield (epoch, indices): the dataset crops at decode time per (epoch, index)
        self.rank, self.world_size, self.shuffle, self.drop_last = rank, world_size, shuffle, drop_last
        self.consumed = consumed  # batches of this epoch already trained (mid-epoch resume), read at each __iter__
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        global_batch = self.batch_size * self.world_size
        return self.n // global_batch if self.drop_last else -(-self.n // global_batch)

    def __iter__(self):
        epoch = self.epoch
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
        else:
            order = torch.arange(self.n)
        global_batch = self.batch_size * self.world_size
        for i in range(self.consumed() if self.consumed else 0, len(self)):
            chunk = order[i * global_batch : (i + 1) * global_batch]
            mine = chunk[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
            yield (epoch, mine) if self.tag_epoch else mine


class StreamBatchSampler(Sampler):
    """This process's batches of a shard stream for one epoch (``selfsup.data.shards``): ``(epoch, s, k)``, batch
    i of the epoch being batch k = i // S of stream s = i mod S; ``batches`` per epoch in every process."""

    def __init__(self, batches: int, streams: int, consumed: Callable[[], int] | None = None):
        self.batches, self.streams, self.consumed, self.epoch = batches, streams, consumed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.batches

    def __iter__(self):
        epoch = self.epoch
        for i in range(self.consumed() if self.consumed else 0, self.batches):
            yield epoch, i % self.streams, i // self.streams


class DeferredLoader(DataLoader):
    """A DataLoader whose iterator starts on the first ``next()``, not at ``iter()``.

    Lightning makes the train iterator once before it restores a checkpoint and sets the epoch, and
    uses it for the first epoch; a loader with workers would prefetch from its sampler at that moment
    (epoch 0, nothing consumed). Deferring the start lets a resumed run draw the resumed epoch's batches.
    """

    def __iter__(self):
        def deferred():
            yield from DataLoader.__iter__(self)

        return deferred()


_END = object()


class Lookahead:
    """An iterator one item ahead of its consumer, started on the first ``next()``: ``upcoming`` is the item the next
    ``next()`` returns (None before the first and after the last), so the training module can start work on batch
    k+1 while step k runs (``device_decode.DecodePrefetcher``). The items and their order are the iterator's."""

    def __init__(self, make):
        self.make, self.it, self.buffer = make, None, _END

    def __iter__(self):
        return self

    def _pull(self) -> None:
        try:
            self.buffer = next(self.it)
        except StopIteration:
            self.buffer = _END

    def __next__(self):
        if self.it is None:
            self.it = self.make()
            self._pull()
        item = self.buffer
        if item is _END:
            raise StopIteration
        self._pull()
        return item

    @property
    def upcoming(self):
        return None if self.buffer is _END else self.buffer


class LookaheadLoader(DataLoader):
    """A DataLoader (deferred as ``DeferredLoader``) whose current iterator, ``current``, is a ``Lookahead``."""

    current: Lookahead | None = None

    def __iter__(self):
        self.current = Lookahead(lambda: DataLoader.__iter__(self))
        return self.current


def ignore_stop_signal(worker_id: int) -> None:
    """A loader worker's start: a SIGTERM from anyone but its parent is ignored, as PyTorch's workers ignore SIGINT.
    A SIGTERM sent to the run's process group (SLURM, ``timeout``, a supervisor) then stops the training process at
    its step boundary, with a checkpoint and the resume line, while its workers feed it until it shuts them down,
    instead of dying first and ending the run in a DataLoader traceback. Its parent's own SIGTERM (the loader's or
    multiprocessing's ``terminate()`` at shutdown) still ends it: the signal is taken by a thread that reads who
    sent it (``sigwaitinfo``)."""
    parent = os.getppid()

    def wait() -> None:
        while True:
            if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
                os._exit(0)

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=wait, daemon=True, name="sigterm-from-parent").start()


def batch_loader(dataset: ImageDataset, sampler: EpochBatchSampler, num_workers: int = 0,
                 pin_memory: bool = False, lookahead: bool = False) -> DataLoader:
    """A DataLoader whose items are whole batches ``(uint8 images, labels)`` picked by ``sampler``; ``lookahead``: a
    ``LookaheadLoader`` (data.decode=device: the module decodes the next batch during the step)."""
    lazy = isinstance(dataset.images, (FolderImages, FolderCrops))
    workers = num_workers if lazy else 0
    kind = LookaheadLoader if lookahead else DeferredLoader if workers else DataLoader
    # Its own generator: a DataLoader draws a base seed at every iter(), from the global RNG by default, which
    # would shift the global stream (drop path's masks) between a run and its resume at a new epoch's iterator.
    return kind(dataset, sampler=sampler, batch_size=None, num_workers=workers, pin_memory=pin_memory,
                persistent_workers=workers > 0, generator=torch.Generator().manual_seed(0),
                worker_init_fn=ignore_stop_signal if workers else None)


def stream_loader(crops: ShardCrops, sampler: StreamBatchSampler, num_workers: int = 0,
                  pin_memory: bool = False) -> DataLoader:
    """Whole batches ``(uint8 views, labels)`` of a shard stream, decoded in ``num_workers`` workers."""
    return (DeferredLoader if num_workers else DataLoader)(crops, sampler=sampler, batch_size=None,
                                                           num_workers=num_workers, pin_memory=pin_memory,
                                                           persistent_workers=num_workers > 0,
                                                           worker_init_fn=ignore_stop_signal if num_workers else None)


def sequential_loader(dataset: ImageDataset, batch_size: int, num_workers: int = 0,
                      pin_memory: bool = False) -> DataLoader:
    """All samples in order, in batches (feature extraction)."""
    sampler = EpochBatchSampler(len(dataset), batch_size, shuffle=False, drop_last=False)
    return batch_loader(dataset, sampler, num_workers, pin_memory)
