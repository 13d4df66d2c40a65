"""Checkpoint files: atomic writes and safe, clearly-failing reads.

Lightning's own writer moves a temp file from ``$TMPDIR`` without fsync; a crash mid-move can leave a corrupt
``last.ckpt`` and lose the previous good one. Here every save streams torch.save into ``<path>.tmp`` beside
the target (a checkpoint is never held whole in memory), fsyncs it, then ``os.replace``s it: the old file stays
whole until the new one is complete. A save that fails (disk full, Ctrl+C) removes its ``.tmp`` and raises its own
error (a full disk: an OSError naming the checkpoint); one killed outright (kill -9, a crash) leaves it, and the next
successful save into that folder removes it.
Every load uses ``torch.load(weights_only=True)`` (a sharded checkpoint's ``.metadata``, torch.distributed.checkpoint's
own, an unpickler as restricted): a checkpoint can hold tensors and plain values, never code.
"""

from __future__ import annotations

import io
import os
import pickle
import pickletools
import re
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, BinaryIO

import torch

from tinylm.checkpoint_share import one_name_left_writable
from tinylm.device import resolve_device
from tinylm.errors import TinyLMError, is_out_of_memory, named_option
from tinylm.paths import fsync_folder, is_utf8, naming, refuse_model_folder, remove_path, swap_in


class CheckpointError(TinyLMError, ValueError):
    """A checkpoint file that cannot be used: truncated, foreign, unsafe, or from another model."""


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the new one, never a mix."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Write the file ``path`` by ``write(f)`` so that readers see either the old file or the new one, never a mix:
    ``f`` is ``<path>.tmp`` beside it (buffered), flushed and fsynced, then swapped in. What ``write`` streams goes
    to the disk as it comes (``torch.save`` of a 1.5 GB checkpoint is never held whole in memory). A write that
    fails removes the ``.tmp`` and raises its own error: an OSError (a full disk) naming ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = beside(path, ".tmp")
    # a killed save's: a folder (FSDP2's) that open() cannot replace, or a read-only hard link of the step's
    # sharing (checkpoint_share._share) that opening it for writing would truncate for its other name too
    remove_path(tmp)
    out = None
    try:
        with open(tmp, "wb", buffering=_BUFFER) as f:
            out = _Recorded(f)
            write(out)
            f.flush()
            os.fsync(f.fileno())
        # a file: one rename; a sharded checkpoint (FSDP2's folder) that a resume on one device or DDP replaces:
        # exchanged with it, then removed (at .tmp, or .old where the file system cannot exchange)
        with one_name_left_writable(path):
            swap_in(tmp, path, aside=beside(path, ".old"))
    except BaseException as e:  # disk full, Ctrl-C: no half-written temp file left behind (kill -9: see below)
        remove_path(tmp)
        # torch's zip writer reports a failed write as "unexpected pos": the write's own error, naming the file
        cause = naming(out.error if out is not None and out.error is not None else e, path)
        if cause is not e:
            raise cause from None
        raise
    if path.suffix:  # a failed save of step-100.ckpt leaves step-100.ckpt.tmp, which no later save overwrites
        # one writer per folder: rank zero, one at a time; FSDP2's leave folders (.old: the one replaced)
        remove_leftovers(path)
        fsync_folder(path.parent)  # the removals too


_BUFFER = 1 << 20  # the small writes between torch.save's tensors (zip headers, padding) go out in 1 MiB pieces


class _Recorded:
    """A file whose ``write`` remembers the error it raised: torch.save, writing through it, goes on to close its
    zip archive and replaces that error (ENOSPC, a KeyboardInterrupt) by a RuntimeError of its own."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.error = f, None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except BaseException as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def beside(path: Path, suffix: str) -> Path:
    """``path`` with ``suffix`` added to its name (``last.ckpt`` -> ``last.ckpt.tmp``)."""
    return path.with_name(path.name + suffix)


def remove_checkpoint(path: str | os.PathLike) -> None:
    """Delete a checkpoint in either form, first set aside as ``<name>.old`` (one rename): a kill mid-delete
    leaves no half folder under a checkpoint's name (which ``--ckpt_path last`` would try to read)."""
    path, old = Path(path), beside(Path(path), ".old")
    if path.exists() or path.is_symlink():
        remove_path(old)
        os.replace(path, old)
    with one_name_left_writable(old):  # the step's other name, when it was shared and is now alone
        remove_path(old)


def remove_leftovers(path: Path) -> None:
    """Delete what killed saves and removals left beside checkpoint ``path`` (one writer per folder: rank zero, one
    save at a time): every ``*<suffix>.tmp`` and ``*<suffix>.old`` of its folder (its own name's, if suffixless)."""
    pattern = f"*{path.suffix}" if path.suffix else path.name
    for stale in [*path.parent.glob(f"{pattern}.tmp"), *path.parent.glob(f"{pattern}.old")]:
        remove_path(stale)


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu", *, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint safely, turning every way it can be broken into one clear :class:`CheckpointError`.

    ``mmap=True`` maps tensors lazily from the file: cheap when only metadata (step, hyperparameters) is needed.
    A sharded checkpoint (FSDP2's DCP folder) is read as one: `load_sharded` (with ``mmap``, without optimizer state).
    """
    if not str(path).strip():  # Path("") is ".", a folder: name what was really given
        raise FileNotFoundError("--ckpt_path is empty (an unset shell variable?); pass the path of a .ckpt written by "
                                "`tinylm fit` (e.g. runs/NAME/checkpoints/last.ckpt)")
    path = Path(path)
    if is_sharded_checkpoint(path):
        ckpt = load_sharded(path, optimizer=not mmap)
        tinylm_section(ckpt, path)
        return ckpt
    if not path.is_file():
        if found := checkpoint_in_folder(path):
            raise FileNotFoundError(f"checkpoint {str(path)!r} is a folder, a run's: pass one of its checkpoints, "
                                    f"--ckpt_path {found}")
        refuse_model_folder(path)  # an export's: read with transformers, or by --model.init_from
        what = "is a folder" if path.is_dir() else "is not a regular file" if path.exists() else "not found"
        raise FileNotFoundError(f"checkpoint {str(path)!r} {what}; pass --ckpt_path PATH to a .ckpt written by "
                                "`tinylm fit` (e.g. runs/NAME/checkpoints/last.ckpt)")
    with open(path, "rb"):  # a file that cannot be read is that (PermissionError, the path), not a damaged one
        pass  # (zipfile.is_zipfile says False for it, and torch.load's OSError read as a broken file)
    if not zipfile.is_zipfile(path):  # torch.save's format is a zip archive; its index sits at the end of the file
        with open(path, "rb") as f:
            head = f.read(4)
        if not head:
            raise CheckpointError(f"{str(path)!r} is empty (0 bytes: a save that never wrote, or a copy cut short); "
                                  "pass --ckpt_path PATH to a .ckpt written by `tinylm fit` (e.g. an earlier "
                                  "step-*.ckpt of the same run)")
        if not head.startswith(b"PK"):  # not the start of a zip either: another kind of file, not a damaged save
            raise CheckpointError(f"{str(path)!r} is not a checkpoint (not a torch file: a {path.suffix or 'text'} "
                                  "file?); pass --ckpt_path PATH to a .ckpt written by `tinylm fit` (e.g. "
                                  "runs/NAME/checkpoints/last.ckpt)")
        raise CheckpointError(
            f"{str(path)!r} is not a readable checkpoint (truncated or not a torch file); "
            "use another one, e.g. an earlier step-*.ckpt from the same run"
        )
    try:
        ckpt = _torch_load(path, map_location, mmap)
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as e:
        raise code_refused(path, e) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError, TypeError, KeyError, IndexError) as e:
        if is_out_of_memory(e):  # its mapping refused (`ulimit -v`): no damage, the CLI says the memory ran out
            raise
        raise CheckpointError(  # garbled bytes inside the pickle surface as any of these (UnicodeDecodeError...)
            f"{str(path)!r} is not a readable checkpoint (truncated or not a torch file: {_first_line(e)}); "
            "use another one, e.g. an earlier step-*.ckpt from the same run") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        what = ("nanoGPT's ckpt.pt" if isinstance(ckpt, dict) and {"model", "model_args"} <= ckpt.keys()
                else "a plain torch.save of weights, or another tool's file")
        raise CheckpointError(f"{str(path)!r} is a torch file but not a Lightning checkpoint (no 'state_dict': "
                              f"{what}); pass a .ckpt written by `tinylm fit`, or, to start a run from other "
                              "weights, a GPT-2 folder transformers saved (save_pretrained) as --model.init_from DIR")
    _check_sections(ckpt, path)
    tinylm_section(ckpt, path)
    return ckpt


_COUNTS = ("epoch", "global_step")
"""The counters of a Lightning checkpoint that tinylm reads, whole numbers >= 0."""


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_sections(ckpt: dict[str, Any], path: Path) -> None:
    """Each section and counter that tinylm reads of the type Lightning writes (an edited file is named in one line,
    not an AttributeError traceback or a bare "invalid literal for int()" at every reader)."""
    wrong = next((k for k, kind in _SECTIONS.items() if k in ckpt and not isinstance(ckpt[k], kind)), None)
    if wrong is not None:
        raise CheckpointError(f"{str(path)!r} holds a {wrong!r} that is a {type(ckpt[wrong]).__name__}, not the "
                              f"{_SECTIONS[wrong].__name__} Lightning writes: the file was edited or written by "
                              "another tool; use another checkpoint of the run")
    count = next((k for k in _COUNTS if not _whole(ckpt.get(k, 0))), None)
    if count is not None:
        raise CheckpointError(f"{str(path)!r} holds {count} {ckpt[count]!r}, not the whole number >= 0 Lightning "
                              "writes: the file was edited or written by another tool; use another checkpoint of "
                              "the run")


_SECTIONS = {"state_dict": dict, "hyper_parameters": dict, "datamodule_hyper_parameters": dict, "loops": dict,
             "callbacks": dict, "optimizer_states": list, "lr_schedulers": list}
"""The type of each section of a Lightning checkpoint that tinylm reads."""


def _torch_load(path: Path, map_location: Any, mmap: bool, tries: int = 5) -> Any:
    """torch.load, of one file even while a running fit replaces it. With ``mmap`` torch opens the path twice (the
    zip index, then the mapping): a `tinylm fit` saving last.ckpt in between (a new file renamed over it) had the
    old file's index read the new file's bytes, which loaded weights no checkpoint holds, NaN, or a "truncated"
    error. The file's identity (inode, size, mtime) is compared before and after; a load it changed under is
    done again; one removed meanwhile (a step-N.ckpt that `run.keep_checkpoints` rotated out) is not found."""
    def identity() -> tuple[int, int, int]:
        try:
            st = path.stat()
        except FileNotFoundError:
            raise FileNotFoundError(f"checkpoint {str(path)!r} was removed as it loaded (a running `tinylm fit` "
                                    "keeping its newest checkpoints?); pass --ckpt_path PATH to one it keeps, "
                                    "e.g. runs/NAME/checkpoints/last.ckpt") from None
        return st.st_ino, st.st_size, st.st_mtime_ns

    for attempt in range(tries if mmap else 1):
        before = identity()
        try:
            with warnings.catch_warnings():  # (a file of pickle protocol 3-5: torch's "please file an issue" line
                # came before tinylm's own one, which says what to do when the load fails)
                warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
                ckpt = _load_named(path, map_location, mmap)
        except Exception:
            if not mmap or identity() == before or attempt == tries - 1:
                raise
            continue
        if not mmap or identity() == before:
            return ckpt
    raise CheckpointError(f"{str(path)!r} was replaced {tries} times while it loaded (a running `tinylm fit` saving "
                          "it every step?); copy it elsewhere first, or pass a step-*.ckpt of the run")


def _load_named(path: Path, map_location: Any, mmap: bool) -> Any:
    """torch.load of ``path``; a name that is no UTF-8 text (Latin-1 bytes, or UTF-8 read under the C locale: Python
    keeps such bytes as lone surrogates) read through a file Python opened: torch's reader takes only UTF-8 names,
    and such a checkpoint was refused as "truncated or not a torch file" ('utf-8' codec can't encode ...). Without
    its mapping then (torch maps only a name): loaded whole."""
    if not is_utf8(path):
        with open(path, "rb") as f:
            return torch.load(f, map_location=map_location, weights_only=True)
    return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)


SHARDED_METADATA = "meta.pt"  # Lightning's name for the non-tensor part of a DCP checkpoint folder


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a sharded checkpoint: the folder FSDP2 (tinylm.train.parallel) writes, one file per rank
    plus the loops', callbacks' and tinylm's state in ``meta.pt``."""
    return Path(path).is_dir() and (Path(path) / SHARDED_METADATA).is_file()


def checkpoint_in_folder(folder: str | os.PathLike, names: tuple[str, ...] = ("best.ckpt", "last.ckpt")) -> str | None:
    """A run folder's (or its checkpoints/ folder's) best.ckpt or last.ckpt, for a folder given where a checkpoint
    goes (`--ckpt_path runs/NAME`); None for any other path."""
    folder = Path(folder)
    if not folder.is_dir() or is_sharded_checkpoint(folder):
        return None
    return next((str(p) for sub in (folder / "checkpoints", folder) for p in (sub / name for name in names)
                 if is_checkpoint(p)), None)  # (FSDP2's are folders)


def is_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a checkpoint in either form: a file, or a sharded folder."""
    return Path(path).is_file() or is_sharded_checkpoint(path)


def load_sharded(path: str | os.PathLike, *, optimizer: bool = True, weights: bool = True) -> dict[str, Any]:
    """A sharded (DCP) checkpoint folder consolidated into the dict a single-file checkpoint holds: whole tensors
    in ``state_dict``, and (``optimizer``) ``optimizer_states`` indexed by parameter as torch.optim saves them, so
    that one device or DDP resumes it, and generate, validate, export and init_from read it. Read on one process,
    without torch.distributed, and safely: the folder's pickles are unpickled with an allowlist of DCP's metadata
    classes, its other values with ``weights_only=True``. ``weights=False``: meta.pt's values alone (the step)."""
    from torch.distributed.checkpoint.api import CheckpointException

    path = Path(path)
    try:
        meta = torch.load(path / SHARDED_METADATA, map_location="cpu", weights_only=True)
        if not weights and isinstance(meta, dict):
            return meta
        with open(path / ".metadata", "rb") as f:  # checked here: inside the DCP reader an error is re-wrapped
            _DCPUnpickler(f).load()
        states = _read_dcp(path, ["state_dict"] + (["optimizer_0"] if optimizer else []))
    except pickle.UnpicklingError as e:
        raise code_refused(path, e) from None
    except PermissionError:
        raise  # not damage: the CLI names the path and the fix
    except (RuntimeError, EOFError, OSError, ValueError, TypeError, KeyError, AttributeError, CheckpointException) as e:
        raise CheckpointError(f"{str(path)!r} is not a readable sharded checkpoint ({_first_line(e)}); use another "
                              "one, e.g. an earlier step-* checkpoint from the same run") from None
    if not isinstance(meta, dict) or not isinstance(states.get("state_dict"), dict):
        raise CheckpointError(f"{str(path)!r} is a folder but not a Lightning sharded checkpoint")
    ckpt = {**meta, "state_dict": states["state_dict"]}
    if "optimizer_0" in states:
        ckpt["optimizer_states"] = [_indexed_optimizer_state(states["optimizer_0"])]
    return ckpt


def _read_dcp(path: Path, keys: list[str]) -> dict[str, Any]:
    """The top-level entries ``keys`` of the DCP checkpoint in folder ``path``, with whole tensors (torch's
    format_utils.dcp_to_torch_save reads it the same way, without its unrestricted pickles)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.metadata import StorageMeta

            with open(Path(self.path) / ".metadata", "rb") as f:
                metadata = _DCPUnpickler(f).load()
            metadata.storage_meta = metadata.storage_meta or StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafePlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:  # plain values: no code
            from torch.distributed.checkpoint._nested_dict import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn],
                        torch.load(value, weights_only=True))

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=SafeReader(path), planner=SafePlanner(keys=set(keys)), no_dist=True)
    return state


class _DCPUnpickler(pickle.Unpickler):
    """Unpickles a DCP folder's ``.metadata`` (torch reads it with a bare pickle.load): DCP's own metadata classes,
    torch.Size, dtypes, layouts and paths; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if module in ("pathlib", "pathlib._local") and name in ("PosixPath", "WindowsPath", "PurePosixPath",
                                                                 "PureWindowsPath"):
            import pathlib  # Python 3.13 pickles paths as pathlib._local.*, a module 3.10-3.12 lack

            return getattr(pathlib, name)
        allowed = (module in ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
                   or (module, name) in {("torch", "Size"), ("torch.serialization", "_get_layout")}
                   or module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        if not allowed:
            raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")
        return super().find_class(module, name)


def _indexed_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """A torch.distributed.checkpoint optimizer state (per-parameter entries keyed by parameter name) keyed by
    parameter index instead, in the order of the groups' parameters, as ``Optimizer.state_dict`` numbers them."""
    if "param_groups" not in state:
        return state
    index = {name: i for i, name in enumerate(n for group in state["param_groups"] for n in group["params"])}
    return {"state": {index[name]: value for name, value in state.get("state", {}).items()},
            "param_groups": [{**group, "params": [index[n] for n in group["params"]]}
                             for group in state["param_groups"]]}


CHECKPOINT_FORMAT = 1  # version of the checkpoint's "tinylm" section; bump when its meaning changes


def tinylm_section(ckpt: dict[str, Any], path: str | os.PathLike = "checkpoint") -> dict[str, Any]:
    """The checkpoint's ``tinylm`` section (format, tokenizer state, W&B run id and project, the run's
    model.init_from), checked: the one place it is read."""
    meta = ckpt.get("tinylm")
    if not isinstance(meta, dict):
        raise CheckpointError(f"{str(path)!r} was not written by tinylm (no 'tinylm' section); pass a .ckpt from "
                              "`tinylm fit`")
    fmt = meta.get("format")
    if fmt != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{str(path)!r} has tinylm checkpoint format {fmt!r}, this tinylm reads "
                              f"{CHECKPOINT_FORMAT}; use the tinylm version that wrote it")
    return meta


_OPCODE_PROTO = {ord(o.code): o.proto for o in pickletools.opcodes}  # opcode -> the protocol it is of


def code_refused(path: str | os.PathLike, e: pickle.UnpicklingError, what: str = "it",
                 fix: str = "") -> CheckpointError:
    """The error of a weights-only load that refused a file (``what`` in it) pickling code: what it needed (torch's
    "Unsupported global: GLOBAL x.y" line), without torch's advice to load with weights_only=False, the one thing
    tinylm never does; ``fix``, what to pass instead."""
    found = re.search(r"GLOBAL ([\w.]+)", str(e))  # "Unsupported global: GLOBAL x" / "unsupported GLOBAL x whose"
    op = re.search(r"Unsupported operand (\d+)", str(e))
    if not found and op and op[1] != "147" and _OPCODE_PROTO.get(int(op[1]), 0) >= 3:  # a real opcode of pickle
        # protocol 3-5 (FRAME: `torch.save(..., pickle_protocol=5)`), which torch's loader does not read
        return CheckpointError(f"cannot read {str(path)!r}: {what} uses pickle protocol "
                               f"{_OPCODE_PROTO[int(op[1])]}'s opcode {int(op[1])}, which torch's weights-only loader "
                               "does not read; save it again with torch.save's default pickle_protocol (if tinylm "
                               "wrote it, it is damaged: use an earlier step-*.ckpt of the same run)")
    damage = re.search(r"Unsupported operand (?!147\b)\d+|String is too long|invalid load key[^\n]*", str(e))
    if not found and damage:  # bytes no pickle writer makes (147 is STACK_GLOBAL: a global of protocol 4): damage
        return CheckpointError(f"{str(path)!r} is not a readable checkpoint ({what} is damaged: {damage[0]}); use "
                               "another one, e.g. an earlier step-*.ckpt of the same run")
    needs = f"it needs {found[1]}" if found else "it needs code to load"
    return CheckpointError(f"refusing to load {str(path)!r}: {what} holds objects other than tensors and plain values "
                           f"({needs}); tinylm never executes code from a checkpoint{fix}")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def load_model(ckpt_path: str | os.PathLike, map_location: Any = "cpu", *,
               option: str = "--ckpt_path") -> tuple[Any, Any, dict[str, Any]]:
    """(GPT, Tokenizer | None, hyperparameters): the GPT (eval mode, on `map_location`), its tokenizer and
    hyperparameters from a `tinylm fit` checkpoint. ``option``: the flag that gave the path, named in refusals.

    The tokenizer is None only for checkpoints written without one (a TinyLM fit without the tinylm data module).
    Raises FileNotFoundError / CheckpointError naming what is wrong: a missing or broken file, a tensor of another
    shape than the hyperparameters say (the message names the tensor and both shapes), missing or extra weights.
    """
    try:  # one line for "gpu", or cuda on a machine without one; the commands resolve --device before this
        device = resolve_device(str(map_location or "cpu"))
    except ValueError as e:  # so a script's map_location is named, not a flag it has none of
        raise ValueError(re.sub(r"--device (\w+)", r"map_location='\1'", str(e))) from None
    with named_option(option):  # mmap: tensors read lazily, the optimizer state (2x the weights) never pulled in
        return gpt_from_checkpoint(load_checkpoint(ckpt_path, map_location="cpu", mmap=True), ckpt_path, device)


def gpt_from_checkpoint(ckpt: dict[str, Any], ckpt_path: str | os.PathLike,
                        map_location: Any = "cpu") -> tuple[Any, Any, dict[str, Any]]:
    """`load_model` of a checkpoint already loaded (``ckpt``, read from ``ckpt_path``): its step and its weights
    from one reading of the file."""
    from tinylm.model import GPT, GPTConfig
    from tinylm.train.options import check_known_options

    hparams = dict(ckpt.get("hyper_parameters") or {})
    check_known_options(hparams, ckpt_path, (ckpt.get("tinylm") or {}).get("options"))  # (a newer tinylm's option:
    # dropped, it built another model)
    names = {f.name for f in fields(GPTConfig)}
    try:
        config = GPTConfig(**{k: v for k, v in hparams.items() if k in names})
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {str(ckpt_path)!r} has hyperparameters that build no GPT ({e}); "
                              "pass a .ckpt written by `tinylm fit`") from None
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    check_size(config, state, ckpt_path)  # before the model is built: n_layer 10**6 took the machine's memory
    with torch.random.fork_rng(devices=[]):  # the random init, overwritten below, leaves the caller's seed alone
        model = GPT(config)
    check_weights(state, model.state_dict(), ckpt_path)
    check_finite(state, ckpt_path)
    model.load_state_dict(state)
    tokenizer = checkpoint_tokenizer(ckpt, ckpt_path)
    return model.to(map_location).eval(), tokenizer, hparams


def check_size(config: Any, state: dict[str, Any], ckpt_path: str | os.PathLike) -> None:
    """Refuse hyperparameters (``config``, a GPTConfig) whose model is another size than the weights ``state`` (a GPT
    state_dict) before that model is built: an edited n_layer, n_embd or vocab_size allocated the model it names
    (10**6 layers, or 10**12 embedding rows) and ended in an allocation traceback, or took all the machine's memory."""
    # a tensor larger than the bytes it holds (torch.zeros(32).expand(10**9, 32): a 145 KB file) stands for no weights
    hollow = next((k for k, t in state.items() if isinstance(t, torch.Tensor)
                   and t.numel() * t.element_size() > t.untyped_storage().nbytes()), None)
    if hollow is not None:
        raise CheckpointError(f"checkpoint {str(ckpt_path)!r}: tensor {hollow!r} of shape {tuple(state[hollow].shape)} "
                              f"holds {state[hollow].untyped_storage().nbytes():,} bytes, fewer than its shape needs "
                              "(an expanded view: the file was edited or written by another tool); use another "
                              "checkpoint of the run")
    # the tables sized by the hyperparameters: vocab_size, and block_size (learned positions: 10**9 allocated 128 GB)
    for name, want in (("wte", (config.padded_vocab_size, config.n_embd)), ("wpe", (config.block_size, config.n_embd))):
        table = state.get(f"transformer.{name}.weight")
        if isinstance(table, torch.Tensor) and tuple(table.shape) != want:  # (none, or no tensor: check_weights)
            raise CheckpointError(f"checkpoint {str(ckpt_path)!r}: tensor 'transformer.{name}.weight' has shape "
                                  f"{tuple(table.shape)} but its hyperparameters make {want}; the weights and "
                                  "hyper_parameters come from different models (was the file edited or merged?)")
    layers = len({k.split(".")[2] for k in state if k.startswith("transformer.h.")})
    if layers != config.n_layer:
        raise CheckpointError(f"checkpoint {str(ckpt_path)!r} does not match its hyperparameters: n_layer "
                              f"{config.n_layer:,}, but its weights hold {layers} layers (was the file edited or "
                              "merged?)")


def non_finite(state: dict[str, Any]) -> list[str]:
    """The names of the floating tensors of ``state`` (a state_dict) that hold NaN or inf."""
    # a sum first (NaN and inf carry through it: ~10x cheaper than isfinite's mask over a 1.5B model); a non-finite
    # sum of finite weights (an overflow) is looked at whole
    return [k for k, t in state.items() if isinstance(t, torch.Tensor) and t.is_floating_point()
            and not torch.isfinite(t.sum()) and not torch.isfinite(t).all()]


def check_finite(state: dict[str, Any], ckpt_path: str | os.PathLike, what: str = "checkpoint",
                 fix: str = "the run diverged before this save; use an earlier step-*.ckpt of the run",
                 optimizer: Any = ()) -> None:
    """Refuse weights (``state``: a state_dict) holding NaN or inf: a run that diverged before it saved them (a
    resume or a validation of them trained from NaN, or scored `val/loss nan`, and named the LR as the cause).
    ``what`` names the file (a Hugging Face model folder: ``fix`` says what to do instead). A resume passes the
    ``optimizer`` states too: NaN moments over finite weights made every step after it NaN (the guard skipped them
    and rolled back, or the run stopped, steps later, without naming the file)."""
    broken = non_finite(state)
    if broken:
        raise CheckpointError(f"{what} {str(ckpt_path)!r} holds non-finite weights (NaN or inf) in {len(broken)} "
                              f"tensors, e.g. {broken[0]!r}: {fix}")
    moments = {f"{name!r} of parameter {i}": t for opt in optimizer or ()
               for i, s in (opt.get("state") or {}).items() for name, t in s.items()}
    if broken := non_finite(moments):
        raise CheckpointError(f"{what} {str(ckpt_path)!r} holds a non-finite optimizer state (NaN or inf) in "
                              f"{len(broken)} tensors, e.g. {broken[0]}: {fix}")


def checkpoint_tokenizer(ckpt: dict[str, Any], ckpt_path: str | os.PathLike) -> Any:
    """The tokenizer a checkpoint carries (None if it has none), refused in one line when it is damaged or does not
    fit the checkpoint's model: more ids than the model's vocab_size have no embedding row, and the model would be
    fed, or sample, ids it has no row for (a shorter one is fine: an imported model's padded vocabulary; generation
    never samples the ids it lacks)."""
    from tinylm.tokenize.tokenizer import Tokenizer

    tok_state = tinylm_section(ckpt, ckpt_path).get("tokenizer")
    try:
        tokenizer = Tokenizer.from_state_dict(tok_state) if tok_state else None
    except Exception as e:
        if type(e) is not Exception and not isinstance(e, (ValueError, KeyError, TypeError)):
            raise  # a bug, not a damaged file (tokenizers raises a bare Exception on a damaged tokenizer.json)
        raise CheckpointError(f"checkpoint {str(ckpt_path)!r} holds a tokenizer this tinylm cannot rebuild "
                              f"({type(e).__name__}: {str(e)[:200]}): the file is damaged, or was written by another "
                              "tinylm version; use another checkpoint of the run, "
                              "or the version that wrote it") from None
    vocab_size = (ckpt.get("hyper_parameters") or {}).get("vocab_size")
    if tokenizer is not None and isinstance(vocab_size, int) and tokenizer.vocab_size > vocab_size:
        raise CheckpointError(f"checkpoint {str(ckpt_path)!r} holds a tokenizer of {tokenizer.vocab_size:,} ids but a "
                              f"model of vocab_size {vocab_size:,}: ids {vocab_size:,} and up have no embedding row; "
                              "the file was edited or put together from two runs: use another checkpoint of the run")
    return tokenizer


def load_draft(ckpt_path: str | os.PathLike, tokenizer: Any, map_location: Any = "cpu",
               option: str = "--draft_ckpt_path") -> Any:
    """The GPT of a draft checkpoint for speculative decoding (eval mode, on ``map_location``), refused in one line
    (naming ``option``, as the user spelled it) unless it was trained with ``tokenizer``, the model's."""
    draft, draft_tokenizer, _ = load_model(ckpt_path, map_location=map_location, option=option)
    if draft_tokenizer is None or draft_tokenizer.fingerprint != tokenizer.fingerprint:
        theirs = "no tokenizer" if draft_tokenizer is None else f"a {draft_tokenizer.kind} tokenizer of " \
            f"{draft_tokenizer.vocab_size:,} ids"
        raise CheckpointError(f"{option} {str(ckpt_path)!r} has {theirs}, not the model's ({tokenizer.kind}, "
                              f"{tokenizer.vocab_size:,} ids); a draft must be trained with the model's tokenizer "
                              "(the same --data.tokenizer and corpus)")
    return draft

def check_weights(state: dict[str, Any], expected: dict[str, Any], ckpt_path: str | os.PathLike) -> None:
    """Refuse weights ``state`` that are not those of the model the checkpoint's hyperparameters build (``expected``:
    its state_dict): a tensor of another shape, or one missing or extra, names the tensor (load_state_dict would
    list every mismatch in a traceback)."""
    for key, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):  # (an edited file: .shape below was an AttributeError traceback)
            raise CheckpointError(f"checkpoint {str(ckpt_path)!r}: {key!r} is a {type(tensor).__name__}, not a tensor; "
                                  "the file was edited or written by another tool: use another checkpoint of the run")
        if key in expected and tensor.shape != expected[key].shape:
            raise CheckpointError(
                f"checkpoint {str(ckpt_path)!r}: tensor {key!r} has shape {tuple(tensor.shape)} but its "
                f"hyperparameters make {tuple(expected[key].shape)}; the weights and hyper_parameters come from "
                "different models (was the file edited or merged?)"
            )
    missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {str(ckpt_path)!r} does not match its hyperparameters: missing weights "
                              f"{missing[:5]}, unexpected weights {unexpected[:5]}")
