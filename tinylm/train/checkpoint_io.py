"""Lightning's checkpoint writer for `tinylm fit`: atomic saves and safe loads (`tinylm.checkpoint`). Apart from
`tinylm.checkpoint`, which the commands that only read checkpoints import, as Lightning is imported here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from tinylm.checkpoint import atomic_write, load_checkpoint, remove_checkpoint
from tinylm.checkpoint_share import StepFiles
from tinylm.paths import fsync_folder


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning ``CheckpointIO`` that writes atomically (temp file beside the target, fsync, rename) and loads
    safely; the files of one state (``best``, ``step-N``, ``last`` at one step) share their bytes on disk where that
    is safe (`tinylm.checkpoint_share`)."""

    def __init__(self) -> None:
        super().__init__()
        self._step_files = StepFiles()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        path = Path(path)
        earlier = self._step_files.earlier(checkpoint, path, lambda p: load_checkpoint(p, mmap=True))
        atomic_write(path, lambda f: torch.save(checkpoint, f))  # streamed into <path>.tmp, never whole in memory
        self._step_files.written(path, earlier)
        if earlier:
            fsync_folder(path.parent)

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        if Path(path).name == ".temp.ckpt":  # ddp_fork/ddp_notebook hand the trained weights back to the main
            # process as a bare state_dict in a fresh temp folder (Lightning's _MultiProcessingLauncher)
            return torch.load(path, map_location=map_location or "cpu", weights_only=True)
        return load_checkpoint(path, map_location=map_location or "cpu")

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        remove_checkpoint(path)
