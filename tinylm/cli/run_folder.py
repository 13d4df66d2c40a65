"""Run folders: where a run lives, one writer at a time, and nothing another run wrote overwritten.

A run lives in ``<trainer.default_root_dir>/<run.name>/`` (default ``runs/NAME``):
    config.yaml                 the config that started the run (a resume adds config.resume-step<N>[-2, -3...].yaml)
                                (a config.yaml found in the folder before the run is kept as config.previous.yaml)
    checkpoints/                best.ckpt, last.ckpt, step-<N>.ckpt
    csv/metrics.csv             every logged metric, one file continued across resumes
    samples.txt, wandb/         text samples; the W&B run (offline when there are no credentials; in $WANDB_DIR/wandb
                                when WANDB_DIR is set)
    validate/metrics.csv        one row per `tinylm validate` of one of this run's checkpoints
A fresh `fit` refuses a folder that already holds a run: continue it with `--ckpt_path last`, or pick a new
`--run.name`. Nothing a run wrote is ever overwritten by another run.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinylm.cli.run_lock import lock_run_folder
from tinylm.errors import TinyLMError
from tinylm.paths import not_utf8

log = logging.getLogger("tinylm")


@dataclass
class RunOptions:
    """Where a run lives and what it logs.

    Args:
        name: Run name: the run folder is ``<trainer.default_root_dir>/<name>`` and W&B shows this name.
        wandb_project: W&B project to log to; null disables W&B (the CSV log is always written).
        checkpoint_every: Save ``step-N.ckpt`` and ``last.ckpt`` every this many optimizer steps
            (and always at the end of training).
        keep_checkpoints: How many periodic ``step-N.ckpt`` files to keep (-1 keeps all).
        threads: Torch's CPU threads for a run on one CPU process. Unset: the CPUs other processes leave free when
            the run starts, at most torch's default (OMP_NUM_THREADS or MKL_NUM_THREADS in the environment set it
            instead). The start line says the choice.
    """

    name: str = "tinylm"
    wandb_project: str | None = "tinylm"
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    threads: int | None = None

    def __post_init__(self) -> None:
        _check_run_name(self.name)
        check_wandb_project(self.wandb_project)
        if self.wandb_project is not None and os.environ.get("WANDB_PROJECT"):  # wandb.init reads it, flag or not
            check_wandb_project(os.environ["WANDB_PROJECT"], "WANDB_PROJECT=")
        if self.checkpoint_every < 1:
            raise ValueError(f"run.checkpoint_every must be >= 1 optimizer steps, got {self.checkpoint_every}; pass "
                             "--run.checkpoint_every N (steps between saves), or --trainer.enable_checkpointing "
                             "false to save none")
        if self.keep_checkpoints < -1:
            raise ValueError(f"run.keep_checkpoints must be -1 (keep all) or >= 0, got {self.keep_checkpoints}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"run.threads must be >= 1 (or unset: chosen from the free CPUs), got {self.threads}")


RUNS_ROOT = "runs"  # trainer.default_root_dir's default: the folder holding all runs


def _check_run_name(name: str) -> None:
    if why := not_utf8(name, "pick another, e.g. --run.name my-run"):  # (not "a control character")
        raise ValueError(f"run.name {name!r} is no UTF-8 text: {why}")
    why = ("empty" if not name.strip() else "not a folder of its own" if name in (".", "..") else "has a '/'"
           if Path(name).name != name else "holds a control character (a line break, a tab, ...)"
           if any(not c.isprintable() for c in name) else f"{len(name.encode())} bytes, over the 255 a folder name "
           "may have" if len(name.encode()) > 255 else None)
    if why:  # (blank, or a line break: the run's summary and next: lines broke; too long: OSError's traceback)
        raise ValueError(f"run.name must be a plain folder name (runs/NAME), got {name!r} ({why}); pick another, "
                         "e.g. --run.name my-run")


def check_wandb_project(project: str | None, what: str = "--run.wandb_project") -> None:
    """A project name W&B takes (wandb.init's rule): it failed with a traceback after the data was prepared, and an
    empty one logged to a project named lightning_logs. ``what`` names where it came from: the flag, or
    ``WANDB_PROJECT=`` (wandb checks the variable even where the flag overrides it)."""
    if project is None:
        return
    env = what.endswith("=")
    said = f"{what}{project}" if env else f"run.wandb_project {project!r}"
    if not project.strip():
        if env:
            raise ValueError("WANDB_PROJECT is set and blank; unset it, or name a W&B project: WANDB_PROJECT=tinylm")
        raise ValueError("run.wandb_project is empty; name a W&B project (--run.wandb_project tinylm), or null to log "
                         "without W&B")
    if "/" in project and (parts := project.split("/")) and len(parts) == 2 and all(parts):
        raise ValueError(f"{said} is a team and a project; W&B takes the project alone: {what}"
                         f"{'' if env else ' '}{parts[1]}, with the team in WANDB_ENTITY={parts[0]}")
    if bad := sorted(set(project) & set("/\\#?%:")):
        raise ValueError(f"{said} holds {' '.join(bad)}, which W&B project names cannot; pick another name")
    if len(project) > 128:
        raise ValueError(f"{said.split(' ')[0] if not env else 'WANDB_PROJECT'} is {len(project)} characters; "
                         "W&B takes at most 128")


def run_dir_of(root: str | Path | None, name: str) -> Path:
    from tinylm.paths import missing_path

    _check_run_name(name)  # before anything is made: the data prepared, a folder runs/a for the name a/b
    if root is not None and not str(root).strip():  # (Path("") is the working folder: the run landed in ./NAME)
        raise ValueError("--trainer.default_root_dir is empty (an unset shell variable?); pass the folder that holds "
                         f"the run folders, or leave it out for {RUNS_ROOT}/")
    if root is not None and (why := not_utf8(str(root), "rename it in UTF-8 (mv) or pass another")):  # (the run's
        raise ValueError(f"--trainer.default_root_dir {str(root)!r} is no UTF-8 text: {why}")  # config.yaml's)
    run_dir = Path(root if root is not None else RUNS_ROOT).expanduser() / name  # (a config file's ~/runs too)
    if (why := missing_path(run_dir)).startswith("is a loop"):  # (Path.resolve's RuntimeError traceback)
        raise TinyLMError(f"{run_dir} {why} where the run folder should be; or choose another --run.name or "
                          "--trainer.default_root_dir")
    return run_dir


SLURM_JOB = "slurm_job_id"  # the SLURM job that last trained the run (tinylm.cli.resume.requeued)


def slurm_job_of(run_dir: Path) -> str:
    """The SLURM job id recorded in the run folder by the last fit there under SLURM; '' for none."""
    try:
        return (run_dir / SLURM_JOB).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def copied_from(ckpt: dict, ckpt_path: str) -> Path | None:
    """The run folder that the one holding ``ckpt_path`` was copied from (`cp -r runs/a runs/b`), said in a line,
    where that one is still there with the same W&B run: the checkpoints folder that saved ``ckpt`` (the checkpoint
    callbacks' state keeps it) is another one, whose newest checkpoint names the same W&B run. None for a folder
    moved since (`mv`: the original gone, or another run's by now) or in its place."""
    from tinylm.checkpoint import CheckpointError, load_checkpoint
    from tinylm.checkpoint_steps import checkpoints_by_step

    wandb_id = (ckpt.get("tinylm") or {}).get("wandb_id")
    saved = {state.get("dirpath") for key, state in (ckpt.get("callbacks") or {}).items()  # (tinylm's own: a user's
             if key.startswith(("PeriodicCheckpoint{", "BestCheckpoint{")) and isinstance(state, dict)}  # saves apart)
    for was in [Path(p) for p in saved if isinstance(p, str) and p] if wandb_id else []:
        if not was.is_dir() or any(was.parent.samefile(p) for p in Path(ckpt_path).resolve().parents):
            continue  # (samefile: the folder itself by another path, a bind mount's, is no copy)
        try:
            found = checkpoints_by_step(was)[0]
            if found and (load_checkpoint(max(found)[2], mmap=True).get("tinylm") or {}).get("wandb_id") == wandb_id:
                log.info("%s is in a copy of the run folder %s, which logs to W&B run %s: this run logs to a W&B run "
                         "of its own", ckpt_path, was.parent, wandb_id)
                return was.parent
        except (OSError, CheckpointError):  # (unreadable: not taken for the original)
            continue
    return None


def holds_run(run_dir: Path) -> bool:
    """Whether a folder holds another run's results (checkpoints or logged metrics)."""
    ckpts = run_dir / "checkpoints"
    if ckpts.is_dir() and any(ckpts.glob("*.ckpt")):
        return True
    metrics = run_dir / "csv" / "metrics.csv"
    if not metrics.is_file():
        return False
    with open(metrics, "rb") as f:  # a row under the header: two lines read, not a long run's whole file
        return bool(f.readline()) and bool(f.readline())


def check_run_folder(run_dir: Path, ckpt_path: str | None, asked: str | None = None, *, continues: bool = False):
    """Lock the run folder for this process (held until it ends: one writer per run folder) and refuse to start
    over another run's results, or to continue a run from a checkpoint it has gone past; returns the lock."""
    from tinylm.checkpoint_steps import checkpoints_by_step  # (torch: this module is also read before the imports)

    lock = lock_run_folder(run_dir)
    ckpts = run_dir / "checkpoints"  # made at the first save: found now, not after the training
    if ckpts.is_symlink() and not ckpts.exists() or ckpts.exists() and not ckpts.is_dir():
        raise FileExistsError(errno.EEXIST, "File exists", str(ckpts))
    # the folders a run writes into, found read-only now: at the first save (step 500 by default) every step before
    # it was lost; under W&B, wandb's own traceback
    for folder in (run_dir, ckpts, run_dir / "csv", run_dir / "wandb"):
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "Permission denied", str(folder))
    if holds_run(run_dir) and not continues:
        what = f"a run from {ckpt_path}" if ckpt_path else "the run again from step 0 (what --ckpt_path last " \
            "does without a checkpoint)" if asked == "last" else "a fresh run"
        found, broken = checkpoints_by_step(run_dir / "checkpoints")
        if not found:  # logs only, or only damaged checkpoints: --ckpt_path last has nothing to go on from
            why = f"its checkpoints ({', '.join(broken)}) are damaged" if broken else \
                "it stopped before its first, or trained with checkpointing off"
            raise TinyLMError(
                f"{run_dir} holds a run that saved no readable checkpoint ({why}), so there is nothing to "
                f"continue; refusing to start {what} over it. Start a new run with --run.name NEW_NAME, or delete "
                f"{run_dir} to reuse its name")
        raise TinyLMError(
            f"{run_dir} already holds a run; refusing to start {what} over it. Continue it with "
            f"--ckpt_path last, or start a new run with --run.name NEW_NAME")
    if continues:
        # the newest readable checkpoint, whatever its name (last.ckpt may be missing or damaged)
        found, _ = checkpoints_by_step(run_dir / "checkpoints")
        latest = max((step for step, _, _ in found), default=None)
        at = next((step for step, _, p in found if p.resolve() == Path(ckpt_path).resolve()), None)
        if at is None:  # a checkpoint kept elsewhere in the run folder (runs/NAME/backup.ckpt): its own step
            from tinylm.checkpoint import load_checkpoint

            at = int(load_checkpoint(ckpt_path, mmap=True).get("global_step", 0))
        if latest is not None and at < latest:  # going back here would drop later history and checkpoints
            raise TinyLMError(
                f"{ckpt_path} is at step {at} but {run_dir} has gone on to step {latest}; continuing from it "
                f"here would discard steps {at}-{latest} of this run's logs and overwrite its last.ckpt. Branch "
                f"from it into a new folder with --run.name NEW_NAME --ckpt_path {ckpt_path}, or continue the run "
                f"with --ckpt_path last")
    if job := os.environ.get("SLURM_JOB_ID", "").strip():  # the job this run is trained by: its requeue goes on
        (run_dir / SLURM_JOB).write_text(job + "\n", encoding="utf-8")
    return lock


# ---- a run's config records -------------------------------------------------------------------------------------
def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)`` for YAML that tinylm wrote (a run's config records, a checkpoint's copy of its config),
    parsed by libyaml where PyYAML has it: the same values (the same constructor and resolver), ~8x faster than
    PyYAML's own parser, which took ~40 ms a tiny run's config.yaml, read two or three times by every resume."""
    import yaml

    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (UnicodeEncodeError, yaml.YAMLError):  # a lone surrogate, which libyaml cannot take, written or escaped
        return yaml.safe_load(text)  # ("\uDCE9", which PyYAML reads): PyYAML's value, or its error


def read_yaml(path: Path) -> dict:
    """The mapping a YAML file holds; {} for a file that is not there, not YAML or not a mapping."""
    import yaml

    try:
        loaded = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def run_config_file(run_dir: Path) -> Path | None:
    """The run folder's newest config record: ``config.resume-step<N>[-k].yaml`` of its latest resume, else
    ``config.yaml`` (the one it started with); None when it has none (config.previous.yaml is another run's)."""
    import re

    newest, key = None, (-1, 0)
    for path in run_dir.glob("config*.yaml") if run_dir.is_dir() else ():
        m = re.fullmatch(r"config(?:\.resume-step(\d+)(?:-(\d+))?)?\.yaml", path.name)
        if m and path.is_file() and (found := (int(m[1] or 0), int(m[2] or 1))) > key:
            newest, key = path, found
    return newest


def run_record(run_dir: Path) -> tuple[Path | None, dict]:
    """The run folder's newest config record (`run_config_file`) and its settings; (None, {}) when it has none."""
    record = run_config_file(run_dir)
    return record, read_yaml(record) if record else {}


def _checkpoint_named(asked: str, run_dir: Path) -> str | None:
    """The checkpoint ``--ckpt_path`` names, found quietly (`tinylm.cli.resume.resolve_ckpt_path` says why later)."""
    if asked == "best":  # (none yet: resolve_ckpt_path says when one is saved)
        best = run_dir / "checkpoints" / "best.ckpt"
        return str(best) if best.exists() else None
    if asked == "last":
        from tinylm.checkpoint_steps import checkpoints_by_step

        found, _ = checkpoints_by_step(run_dir / "checkpoints")
        return str(max(found)[2]) if found else None
    return asked


def kept_settings(ckpt: dict) -> dict:
    """The run's settings that a checkpoint keeps (its config's text: tinylm.cli.run_config.RunConfig), as a mapping;
    {} for one written before checkpoints kept them, or a damaged text."""
    import yaml

    kept = (ckpt.get("tinylm") or {}).get("config")
    try:
        settings = load_yaml(kept) if isinstance(kept, str) else None
    except yaml.YAMLError:
        return {}
    return settings if isinstance(settings, dict) else {}


_TRUSTED_CLASSES = ("lightning.", "pytorch_lightning.", "tinylm.", "torch.")
"""What settings read without --config (a run folder's record, a checkpoint's kept config) may name as a class_path:
a class there is imported and built with the file's arguments."""
_CALLING_CLASSES = ("LambdaCallback",)
"""Classes whose arguments are functions, named by import path, that the run calls."""


_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")  # builtins.print: a Callable argument's value


def _importable(module: str) -> bool:
    """Whether a top-level module of this name is installed (found, not imported)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _plain_type(annotation: Any) -> bool:
    """Whether an argument typed ``annotation`` takes plain values alone (text, numbers, paths, literals, Any, lists
    and unions of these), which jsonargparse keeps as given; a Callable or a class type may import what a text names."""
    import inspect
    import types
    import typing

    if annotation in (Any, inspect.Parameter.empty, str, int, float, bool, type(None), Path, Ellipsis):
        return True
    origin = typing.get_origin(annotation)
    return origin is typing.Literal or origin in (typing.Union, types.UnionType, list, tuple, dict, set) and all(
        _plain_type(arg) for arg in typing.get_args(annotation))


def _takes_no_function(class_path: str, key: str) -> bool:
    """Whether init argument ``key`` of the trusted class ``class_path`` takes plain values alone: jsonargparse imports
    a text by its import path only for a Callable or class type, so a logger's name 'test.run' is text (it was refused
    as a function). The type is jsonargparse's own: an argument taken by ``**kwargs: Any`` has the type of the
    parameter the kwargs reach (WeightAveraging's multi_avg_fn is AveragedModel's Callable). False when the class or
    its parameters cannot be read (refused, as before)."""
    import importlib

    from jsonargparse._parameter_resolvers import get_signature_parameters  # (what the parse itself types them by)

    module, _, name = class_path.rpartition(".")
    try:
        params = {p.name: p for p in get_signature_parameters(getattr(importlib.import_module(module), name), None)}
    except Exception:  # (any failure to read it: the check stays strict)
        return False
    return key in params and _plain_type(params[key].annotation)


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False for text that names none (a W&B logger's notes: a name over 255 bytes made
    Path.is_file raise "file name too long", and the user's own run could not be resumed)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def check_kept_classes(settings: Any, source: str, where: str = "", folder: Path | None = None,
                       may_call: bool = True) -> None:
    """Refuse settings that tinylm reads on its own (``source``: a run folder's config record, or the config text a
    checkpoint keeps: files a user may have been sent) naming a class_path outside Lightning, tinylm and torch, or a
    LambdaCallback: jsonargparse imports and instantiates those, and LambdaCallback calls the functions it names. A
    trainer option naming a file (beside the record, ``folder``, or here) is refused too: jsonargparse reads such a
    file as the option's settings, class_path and all."""
    if isinstance(settings, str) and where.startswith("trainer.") and settings.strip() and any(
            _is_file(base / settings) for base in ([folder] if folder else []) + [Path.cwd()]):
        raise TinyLMError(f"{source} sets {where} to the file {settings!r}: settings tinylm reads without --config may "
                          "not take a trainer option's settings from another file (class_path and all); if you trust "
                          "them, pass them yourself with --config FILE")
    if isinstance(settings, str) and where.startswith("trainer.") and may_call and _IMPORT_PATH.fullmatch(settings) \
            and not settings.startswith(_TRUSTED_CLASSES) and _importable(settings.partition(".")[0]):
        raise TinyLMError(f"{source} sets {where} to {settings!r}, a function by import path: settings tinylm reads "
                          "without --config may name no function outside Lightning's, torch's and tinylm's (the run "
                          "calls it, e.g. ThroughputMonitor's batch_size_fn); if you trust the file, pass its settings "
                          "yourself with --config FILE")
    if isinstance(settings, dict):
        path = settings.get("class_path")
        if isinstance(path, str) and (("." in path and not path.startswith(_TRUSTED_CLASSES))
                                      or path.rpartition(".")[2] in _CALLING_CLASSES):
            raise TinyLMError(f"{source} names class_path {path!r} (at {where or 'the top'}): settings tinylm reads "
                              "without --config may name only Lightning's, torch's and tinylm's classes, and no "
                              "LambdaCallback, as building them runs code; if you trust the file, pass its settings "
                              "yourself with --config FILE")
        for key, value in settings.items():
            at = f"{where}.{key}" if where else str(key)
            if key == "init_args" and isinstance(path, str) and isinstance(value, dict):  # the class's arguments:
                for arg, given in value.items():  # text an argument typed to take no function reads as text
                    check_kept_classes(given, source, f"{at}.{arg}", folder, not (
                        isinstance(given, str) and _IMPORT_PATH.fullmatch(given) and _takes_no_function(path, arg)))
            else:
                check_kept_classes(value, source, at, folder)
    elif isinstance(settings, list):
        for i, value in enumerate(settings):
            check_kept_classes(value, source, f"{where}[{i}]", folder)


def _with_checkpoint_config(args: list[str], ckpt_path: str | None, quiet: bool, run_dir: Path | None = None
                            ) -> list[str]:
    """``fit`` ``args`` from a checkpoint outside a run folder that holds a config (copied, downloaded), or in a run
    folder without its config records (``run_dir``): with the run's own settings that the checkpoint keeps
    (tinylm.cli.run_config.RunConfig), given as the config's text; the run folder is ``run_dir``, else the
    command's own (run.name, trainer.default_root_dir: the early check found it from the flags). Without them a
    checkpoint alone resumed with the defaults' gradient clipping, validation and logging (losses off by 3e-3 from
    step 10) and refused the defaults' batch and block sizes one at a time."""
    if quiet or args[0] != "fit" or not ckpt_path or ckpt_path in ("hpc", "registry") or \
            ckpt_path.startswith("registry:"):  # (Lightning's names: the resume refuses them by name)
        return args
    from tinylm.checkpoint import load_checkpoint
    from tinylm.cli.argv import reloadable_yaml

    # a file that is none (missing, broken, not tinylm's) is said now: left to the resume's own checks, it was refused
    # first for what the settings it keeps would have given ("trainer.max_steps is not set")
    ckpt = load_checkpoint(ckpt_path, mmap=True)
    settings = kept_settings(ckpt)
    try:
        check_kept_classes(settings, f"the config that checkpoint {ckpt_path} keeps")
    except TinyLMError as e:  # the settings are inside the checkpoint, no file of the user's: say how to write it
        import json
        import shlex  # (quoted for the shell whatever the path holds: ' " $ ` spaces)

        code = f'import torch; print(torch.load({json.dumps(str(ckpt_path))}, weights_only=True)["tinylm"]["config"])'
        raise TinyLMError(f"{e} (write the checkpoint's settings into one: python -c {shlex.quote(code)} > run.yaml, "
                          "then add --config run.yaml)") from None
    if not settings:
        if "tinylm" in ckpt:  # written before checkpoints kept their run's settings
            log.warning("%s keeps no settings of its run (a checkpoint of an older tinylm) and no config record of "
                        "its run is beside it: it resumes with this command's options; pass the run's own "
                        "--config (its config.yaml) to go on as it trained", ckpt_path)
        return args
    for (section, key), value in zip((("run", "name"), ("trainer", "default_root_dir")),
                                     (run_dir.name, str(run_dir.parent)) if run_dir else (None, None)):
        if isinstance(settings.get(section), dict):
            settings[section].pop(key, None)
            if value is not None:  # (flags still override them)
                settings[section][key] = value
    log.info("%s: the run's own settings, from the checkpoint (no --config given; flags override them)", ckpt_path)
    return [args[0], "--config", reloadable_yaml(settings), *args[1:]]


VALIDATE_LEAVES = ("logger", "callbacks", "profiler", "limit_val_batches")
"""Trainer options of a run's config that `tinylm validate` of its checkpoint leaves at their defaults (flags set
them): it logs only to ``<run dir>/validate/metrics.csv``, and validates the whole validation split."""


def with_run_config(args: list[str], *, quiet: bool = False) -> list[str]:
    """``fit``/``validate`` ``args`` from a run's checkpoint that name no ``--config``: with the run's own settings
    read first (the run folder's newest config*.yaml: the one it started with, or its newest resume's record), so
    that `tinylm fit --ckpt_path runs/x/checkpoints/last.ckpt` goes on as the run did (data, batch size, trainer,
    max_steps) and the command's flags still override. ``--ckpt_path last|best`` finds the run by
    ``--trainer.default_root_dir`` and ``--run.name``; a checkpoint outside a run folder (or a folder without a
    config) leaves ``args`` as they are. Said in a line unless ``quiet`` (the early check before the imports,
    tinylm.cli.early, reads the run folder from these args too: the same folder as the run's own check)."""
    from tinylm.cli.argv import reloadable_yaml, values

    if not args or args[0] not in ("fit", "validate"):
        return args
    flags = values(args[1:])
    asked = flags.get("ckpt_path")
    if not asked or "config" in flags:
        return args
    if asked in ("last", "best"):
        run_dir = Path(flags.get("trainer.default_root_dir") or RUNS_ROOT) / (flags.get("run.name") or RunOptions.name)
    elif Path(asked).parent.name == "checkpoints":
        run_dir = Path(asked).parent.parent
    else:
        return _with_checkpoint_config(args, asked, quiet)
    config, settings = run_record(run_dir)
    if config is None:  # a run folder without its records (copied without them): its checkpoint's settings
        return args if quiet else _with_checkpoint_config(args, _checkpoint_named(asked, run_dir), quiet, run_dir)
    if not settings:  # a record edited by hand into no YAML mapping: said as a --config file's, naming it
        from tinylm.cli.config_files import check_config_files

        try:
            check_config_files(["--config", str(config)])
        except (ValueError, FileNotFoundError) as e:
            raise type(e)(f"{e} ({config} holds the run's own settings, read as no --config is given: fix it, or "
                          "pass --config FILE with the run's settings)") from None
    text = None  # validate of a run trained with a callback or logger of the user's own: the run's settings without
    if args[0] == "validate" and (dropped := _validate_leaves(settings, flags)) is not settings:  # them, as text
        settings, text = dropped, reloadable_yaml(dropped)
    check_kept_classes(settings, str(config), folder=config.parent)
    if text is None:  # (read by jsonargparse, in the locale's encoding)
        from tinylm.cli.config_files import check_read_here

        check_read_here(config, config.read_text(encoding="utf-8", errors="replace"))
    named = Path((settings.get("trainer") or {}).get("default_root_dir") or RUNS_ROOT,
                 (settings.get("run") or {}).get("name") or RunOptions.name)
    # a run folder moved (or read from another folder) since: the checkpoint's folder, not the one the file names
    where = [] if named.resolve() == run_dir.resolve() else \
        ["--trainer.default_root_dir", str(run_dir.parent), "--run.name", run_dir.name]
    # the run's mixture weights go with its corpora, not with a --data.corpus OTHER the command names
    if "data.corpus" in flags and (settings.get("data") or {}).get("weights") is not None:
        where += ["--data.weights", "null"]
    if args[0] == "validate":  # the run's loggers, callbacks, profiler and validation limit are its training's: a
        # user's CSVLogger lost its training rows to validate's one, a WandbLogger failed without credentials
        where += [arg for key in VALIDATE_LEAVES if key in (settings.get("trainer") or {}) and
                  f"trainer.{key}" not in flags for arg in (f"--trainer.{key}", "null")]
    if not quiet:
        log.info("%s: the run's own settings, from %s (no --config given; flags override them)",
                 f"--ckpt_path {asked}" if asked in ("last", "best") else asked, config)
    return [args[0], "--config", text or str(config), *where, *args[1:]]


def _validate_leaves(settings: dict, flags: dict) -> dict:
    """A run's ``settings`` without the trainer options naming a class outside Lightning's, torch's and tinylm's that
    `tinylm validate` leaves out (VALIDATE_LEAVES, not set by a flag): a run trained with `--trainer.callbacks
    mymod.MyCallback` was refused the validate its summary advises, though validate builds none of them."""
    trainer = settings.get("trainer") if isinstance(settings.get("trainer"), dict) else {}
    untrusted = set()
    for key in VALIDATE_LEAVES:
        try:
            check_kept_classes(trainer.get(key), "", f"trainer.{key}")
        except TinyLMError:
            untrusted.add(key)
    untrusted = {key for key in untrusted if f"trainer.{key}" not in flags}
    return {**settings, "trainer": {k: v for k, v in trainer.items() if k not in untrusted}} if untrusted else settings
