"""Checkpoint files: atomic writes and safe, clearly-failing reads.

Lightning's own writer moves a temp file from ``$TMPDIR`` without fsync; a crash mid-move can leave a corrupt
``last.ckpt`` and lose the previous good one (see LIGHTNING-NOTES). Here every save writes ``<path>.tmp`` beside
the target, fsyncs it, then ``os.replace``s it: the old file stays whole until the new one is complete.
Every load uses ``torch.load(weights_only=True)``: a checkpoint can hold tensors and plain values, never code.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: truncated, foreign, unsafe, or from another model."""


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the new one, never a mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # some filesystems (and Windows) cannot fsync a directory
        pass


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu", *, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint safely, turning every way it can be broken into one clear :class:`CheckpointError`.

    ``mmap=True`` maps tensors lazily from the file: cheap when only metadata (step, hyperparameters) is needed.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} not found; pass --ckpt_path PATH to a .ckpt written by `tinylm fit`")
    if not zipfile.is_zipfile(path):  # torch.save's format is a zip archive; its index sits at the end of the file
        raise CheckpointError(
            f"{str(path)!r} is not a readable checkpoint (truncated or not a torch file); "
            "use another one, e.g. an earlier step-*.ckpt from the same run"
        )
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"refusing to load {str(path)!r}: it holds objects other than tensors and plain values ({_first_line(e)}); "
            "tinylm never executes code from a checkpoint"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(
            f"{str(path)!r} is not a readable checkpoint (truncated or not a torch file: {_first_line(e)}); "
            "use another one, e.g. an earlier step-*.ckpt from the same run"
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"{str(path)!r} is a torch file but not a Lightning checkpoint (no 'state_dict')")
    if "tinylm" not in ckpt:
        raise CheckpointError(f"{str(path)!r} was not written by tinylm (no 'tinylm' section); pass a .ckpt from `tinylm fit`")
    return ckpt


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning ``CheckpointIO`` that writes atomically (temp file beside the target, fsync, rename) and loads safely."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(f"AtomicCheckpointIO takes no storage_options, got {storage_options!r}")
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        atomic_write_bytes(path, buffer.getvalue())

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return load_checkpoint(path, map_location=map_location or "cpu")


def load_model(path: str | os.PathLike, map_location: Any = "cpu"):
    """(GPT in eval mode, Tokenizer, hyperparameters) from a tinylm checkpoint: all that generate/export need.

    A checkpoint whose weights do not fit the shape its hyperparameters describe raises :class:`CheckpointError`
    naming the first mismatching tensor.
    """
    import dataclasses

    from tinylm.model import GPT, GPTConfig
    from tinylm.tokenizer import Tokenizer

    ckpt = load_checkpoint(path, map_location=map_location)
    hp = dict(ckpt.get("hyper_parameters", {}))
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    try:
        model = GPT(GPTConfig(**{k: v for k, v in hp.items() if k in fields}))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{str(path)!r} has hyperparameters tinylm cannot build a model from: {e}") from None
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    expected = model.state_dict()
    for name, tensor in expected.items():
        if name not in state:
            raise CheckpointError(f"{str(path)!r} lacks weight {name!r}: it is not a checkpoint of this model")
        if state[name].shape != tensor.shape:
            raise CheckpointError(
                f"{str(path)!r} holds {name!r} of shape {tuple(state[name].shape)} but its hyperparameters describe "
                f"{tuple(tensor.shape)}: the file mixes two model shapes; use a checkpoint written by one run"
            )
    model.load_state_dict(state, strict=False)  # extra keys (none expected) are harmless
    model.eval()
    tok_state = ckpt["tinylm"].get("tokenizer")
    if tok_state is None:
        raise CheckpointError(f"{str(path)!r} carries no tokenizer; it was saved before training started")
    return model, Tokenizer.from_state_dict(tok_state), hp
