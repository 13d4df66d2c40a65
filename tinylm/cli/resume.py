"""Resume: what `--ckpt_path` means, what a run takes from its checkpoint, and the checks that refuse a resume
that would not continue the run (or name the settings that change it).

Exact resume is spread over the things that hold state; this module is the map:
- here: ``--ckpt_path last|best|PATH`` (`resolve_ckpt_path`, `latest_checkpoint`), the model's hyperparameters
  from the checkpoint (`model_from`; validate also takes the data: `data_from`), refusals (`check_resume`: nothing
  left to train, another tokenizer, a weights-only file);
- tinylm.cli.resume_changes: the settings a resume changes: refusals (max_time spent, accumulation that splits a
  step) and warnings (changed trainer options, validation, a changed schedule length, a seed with no effect);
- tinylm.cli.run_folder.check_run_folder: continue a run in its own folder, or branch into a new one; never over
  another run's results; run_folder.with_run_config: a resume that names no --config reads its run's newest config
  record first (there, without torch: the early "in use" check before the imports finds the same folder with it);
- tinylm.cli.run_config.RunConfig: the resume's record, config.resume-step<N>.yaml;
- tinylm.checkpoint: reading checkpoints safely (weights_only, mmap), atomic writes, the tokenizer inside;
- tinylm.train.module.TinyLM.on_save_checkpoint/on_load_checkpoint: tinylm's own section (tokenizer, init_from, W&B
  id and project);
- tinylm.train.callbacks.RNGState (every random stream), tinylm.train.samples.SampleText (samples.txt cut back);
- tinylm.data.datamodule / tinylm.data.loader: the loader's position in its stream of windows;
- tinylm.train.health (the monitor's windows), tinylm.train.loggers (metrics.csv cut back, the W&B run continued);
- tinylm.train.interrupt: SIGTERM / Ctrl+C stop at a whole step and save last.ckpt.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinylm.checkpoint import checkpoint_in_folder, is_checkpoint
from tinylm.checkpoint_steps import checkpoints_by_step
from tinylm.cli.resume_changes import check_accumulation, check_time_left, warn_schedule_change, warn_training_changes
from tinylm.cli.run_folder import copied_from, holds_run, slurm_job_of
from tinylm.cli.run_lock import running_holder
from tinylm.errors import TinyLMError
from tinylm.net import hub_name
from tinylm.paths import refuse_model_folder

log = logging.getLogger("tinylm")


RUNTIME_OPTIONS = ("compile_model", "activation_checkpointing", "fsdp_reshard_after_forward")
"""TinyLM options that a resume or validation takes from its own config, not the checkpoint: they change speed and
memory, never the numbers."""

def latest_checkpoint(run_dir: Path) -> str | None:
    """What ``--ckpt_path last`` means: the newest readable checkpoint of the run folder by step, ``last.ckpt`` when
    it is that; else (a damaged or missing last.ckpt, or one older than a step-N.ckpt because the run died between
    the two saves, or a run killed before its first periodic save with only a ``best.ckpt``) the newest other one,
    with a warning. None when the folder holds none."""
    found, broken = checkpoints_by_step(run_dir / "checkpoints")
    if not found:
        return None
    step, is_last, path = max(found)  # at one step, last.ckpt first
    if not is_last:
        last = next((s for s, is_l, _ in found if is_l), None)
        # a run still running there saves step-N.ckpt (or best.ckpt) first, then last.ckpt: not a stopped run
        running = running_holder(run_dir)
        saving = f" (the run is running there, {running}: it saves last.ckpt after the others)" if running else ""
        why = ("is damaged" if "last.ckpt" in broken else "is missing" + saving if last is None
               else f"is at step {last}, behind it (a validation saved it since)" if path.name == "best.ckpt"
               else f"is at step {last}, behind it" + (saving or " (the run stopped between two saves)"))
        log.warning("--ckpt_path last: %s %s; continuing from the newest readable checkpoint, %s (step %d)",
                    run_dir / "checkpoints" / "last.ckpt", why, path.name, step)
    return str(path)


def complete_cut_save(ckpt_path: str, run_dir: Path, run: Any, max_steps: int | None) -> str:
    """What ``--ckpt_path last`` resumes from once the save that a kill cut short is completed. A periodic save
    writes best.ckpt (a new best at a validation), step-N.ckpt, then last.ckpt, one after the other: a run killed in
    between left ``ckpt_path``, the newest checkpoint, without the others of its step, and the resume went on from
    it with step-N.ckpt never written (run.keep_checkpoints -1: every step's checkpoint but that one), or, at the
    final step, refused with nothing to train and last.ckpt steps behind. Where ``ckpt_path`` is at a step the run
    saved at (every run.checkpoint_every of the run that wrote it, or the end), step-N.ckpt and last.ckpt are
    written now as copies of it (the files of one step hold one state; `tinylm.checkpoint_share`), the step-N.ckpt
    files trimmed to run.keep_checkpoints, and last.ckpt returned; else ``ckpt_path``."""
    from tinylm.checkpoint import load_checkpoint, remove_checkpoint
    from tinylm.checkpoint_steps import STEP_NAME

    path, folder = Path(ckpt_path), run_dir / "checkpoints"
    found, broken = checkpoints_by_step(folder)
    newest = max(found, default=None)
    if path.name == "last.ckpt" or "last.ckpt" in broken or newest is None or newest[2] != path or newest[0] <= 0 \
            or path.is_dir():  # (a sharded checkpoint, FSDP2's folder, is not copied)
        return ckpt_path  # (a damaged last.ckpt is left as it is, to look at: the warning named it)
    step = newest[0]
    keys = " ".join(load_checkpoint(path, mmap=True).get("callbacks") or {})
    saved = re.search(r"PeriodicCheckpoint\{[^}]*'every_n_train_steps': (\d+)", keys)
    every = int(saved[1]) if saved else run.checkpoint_every
    # (the end: max_steps at that step; one below it is refused, "nothing to train", with the folder left as it is)
    if not (every > 0 and step % every == 0 or max_steps == step):
        return ckpt_path  # a validation's best.ckpt between two saves: nothing was cut
    step_file = folder / f"step-{step}.ckpt"
    written = [f for f in [step_file] if run.keep_checkpoints != 0 and not f.exists()] + [folder / "last.ckpt"]
    if written[0] == step_file:
        _copy_checkpoint(path, step_file)
    steps = dict(sorted((s, p.name) for s, _, p in [*found, (step, False, step_file)] if STEP_NAME.fullmatch(p.name)))
    removed = list(steps.values())[: -run.keep_checkpoints] if run.keep_checkpoints > 0 else []
    for name in removed:
        remove_checkpoint(folder / name)
    _copy_checkpoint(path, folder / "last.ckpt")  # last: a kill before it leaves this to do again
    log.info("--ckpt_path last: the save at step %d was cut short after %s; wrote %s from it%s, as the "
             "save would have", step, path.name, " and ".join(f.name for f in written),
             f" and removed {', '.join(removed)} (run.keep_checkpoints {run.keep_checkpoints})" if removed else "")
    return str(folder / "last.ckpt")


def _copy_checkpoint(src: Path, dst: Path) -> None:
    """Make ``dst`` a copy of the checkpoint ``src`` (one state under another name), atomically: sharing its bytes
    where that is safe, else a full copy streamed into ``<dst>.tmp`` and renamed."""
    import shutil

    from tinylm.checkpoint import atomic_write
    from tinylm.checkpoint_share import share_copy

    if not share_copy(src, dst):
        with open(src, "rb") as f:
            atomic_write(dst, lambda out: shutil.copyfileobj(f, out, 1 << 20))


def requeued(asked: str | None, run_dir: Path, sub: str) -> str | None:
    """``--ckpt_path`` of a SLURM job requeued (SLURM_RESTART_COUNT >= 1: Lightning's auto-requeue on SIGUSR1, or
    ``sbatch --requeue`` after a node failed), which reruns the same script: without one, and with its run folder
    holding the run it started, `last` (as Lightning resumes a requeued job from its hpc checkpoint). It was refused
    as a fresh run over an existing one, and the requeue was wasted. A run whose newest save is Lightning's own on
    SIGUSR1 (``hpc_ckpt_N.ckpt`` in the run folder; none of the run's since: checkpointing off, or killed before its
    step ended) goes on from that one: left to Lightning, which takes it when --ckpt_path is unset, it was resumed
    unsaid after this said "starts again from step 0" and set the logged rows aside. One that saved none starts
    again."""
    import os

    count = os.environ.get("SLURM_RESTART_COUNT", "").strip()
    hpc = [(step, path) for step, _, path in checkpoints_by_step(run_dir)[0] if path.name.startswith("hpc_ckpt_")]
    if sub != "fit" or asked is not None or not count.isdigit() or int(count) < 1 or not (holds_run(run_dir) or hpc):
        return asked
    # only the run this job trained (check_run_folder records it): an earlier job's run of the same --run.name (the
    # job preempted before its fit began, or a script's earlier fit) is refused as before, not silently taken over
    if not (job := os.environ.get("SLURM_JOB_ID", "").strip()) or slurm_job_of(run_dir) != job:
        return asked
    if hpc and (saved := max(hpc))[0] > max((s for s, _, _ in checkpoints_by_step(run_dir / "checkpoints")[0]),
                                            default=-1):
        log.info("SLURM requeued this job (SLURM_RESTART_COUNT=%s): going on from %s (step %d), Lightning's save on "
                 "SIGUSR1, the run's newest (saved mid-step: not an exact resume)", count, saved[1], saved[0])
        return str(saved[1])
    if not any((run_dir / "checkpoints").glob("*.ckpt")):  # stopped before its first save: trained again from step
        # 0, its logged rows kept aside (it was refused, and the requeue lost: nobody is there to start it again)
        metrics = run_dir / "csv" / "metrics.csv"
        aside = metrics.with_name(f"metrics.before-requeue-{count}.csv")
        if metrics.exists():
            metrics.rename(aside)
        log.info("SLURM requeued this job (SLURM_RESTART_COUNT=%s): its run saved no checkpoint, so it starts again "
                 "from step 0%s", count, f" (its logged rows kept in {aside})" if aside.exists() else "")
        return asked
    if not checkpoints_by_step(run_dir / "checkpoints")[0]:  # (it said "going on from the newest checkpoint", then
        return asked  # was refused for having none: the refusal alone says it, and how to go on)
    log.info("SLURM requeued this job (SLURM_RESTART_COUNT=%s): going on from %s's newest checkpoint "
             "(--ckpt_path last)", count, run_dir)
    return "last"


def resolve_ckpt_path(asked: str | None, run_dir: Path, sub: str) -> str | None:
    """What ``--ckpt_path`` names: ``last`` (the run folder's newest readable checkpoint, None when it has none
    yet), ``best``, or a path, checked to be a file; validate needs one."""
    ckpt_path = asked
    if ckpt_path is not None and not str(ckpt_path).strip():  # `--ckpt_path "$CKPT"` with CKPT unset
        raise ValueError(f"--ckpt_path is empty ({ckpt_path!r}: an unset shell variable?); pass `last`, `best` or the "
                         "path of a .ckpt written by `tinylm fit`" + (", or leave it out to start a new run"
                                                                       if sub == "fit" else ""))
    if ckpt_path == "last":
        ckpt_path = latest_checkpoint(run_dir)
    elif ckpt_path == "best":
        best = run_dir / "checkpoints" / "best.ckpt"
        if not is_checkpoint(best):
            raise FileNotFoundError(f"--ckpt_path best: {best} not found (a run's best.ckpt is saved at its "
                                    "first validation); pass `last` or the path of a .ckpt")
        ckpt_path = str(best)
    elif ckpt_path in ("hpc", "registry") or str(ckpt_path).startswith("registry:"):
        raise ValueError(f"--ckpt_path {ckpt_path} is not used by tinylm; pass `last`, `best` or the path of a "
                         ".ckpt written by `tinylm fit`")
    if sub == "validate" and asked == "last" and not ckpt_path:
        raise FileNotFoundError(f"--ckpt_path last: {run_dir} holds no checkpoint (`last` and `best` are "
                                "those of the run that --config, or --run.name, names); pass the run's --config "
                                "or the path of a .ckpt")
    if sub == "validate" and not ckpt_path:
        raise ValueError("tinylm validate needs --ckpt_path PATH (a checkpoint written by `tinylm fit`, e.g. "
                         f"{run_dir / 'checkpoints' / 'best.ckpt'}); without one it would evaluate random "
                         "weights")
    if ckpt_path and not is_checkpoint(ckpt_path) and (found := checkpoint_in_folder(
            ckpt_path, ("last.ckpt", "best.ckpt") if sub == "fit" else ("best.ckpt", "last.ckpt"))):
        raise FileNotFoundError(f"checkpoint {ckpt_path!r} is a folder, a run's: pass one of its checkpoints, "
                                f"--ckpt_path {found}")
    if ckpt_path and not is_checkpoint(ckpt_path):
        refuse_model_folder(Path(ckpt_path))  # an export's: a fit starts from it with --model.init_from
        what = "is a folder" if Path(ckpt_path).is_dir() else "not found"
        hub = not Path(ckpt_path).exists() and hub_name(ckpt_path)  # (`generate --ckpt_path gpt2` reads one)
        raise FileNotFoundError(f"checkpoint {ckpt_path!r} {what}; pass --ckpt_path PATH to a .ckpt written by "
                                "`tinylm fit` (e.g. runs/NAME/checkpoints/last.ckpt), or `last` for this run's "
                                "latest" + (f"; to start a new run from the Hugging Face Hub model of that name: "
                                            f"--model.init_from {ckpt_path} (generate, eval and sample-report take "
                                            "it as --ckpt_path)" if hub else ""))
    return ckpt_path


@dataclass
class Start:
    """What a command takes from the checkpoint it starts from."""

    step: int  # the checkpoint's global step
    resume_step: int | None  # fit: the step the CSV and W&B logs continue from; validate: None
    wandb_id: str | None  # the W&B run to continue (a resume in the checkpoint's own run folder)
    wandb_project: str | None  # the W&B project the run logged to (a branch's W&B run goes there too)
    update: dict  # the config sections it sets: model (and for validate, data)
    cpu_threads: int | None = None  # fit: the torch threads of the run's one CPU process (exact resume on a CPU)
    data_state: dict | None = None  # fit: the data module's state in the checkpoint (what the run read)
    finish_at: int | None = None  # fit: the step of a run at its end whose final validation never ran (it runs it)


def apply_checkpoint(ckpt_path: str, cfg, sub: str, *, defaults, named: set[str], continues: bool,
                     flags: set[str] = frozenset(), check: bool = True) -> Start:
    """Take the model's hyperparameters and the data the run read (corpus, tokenizer: `run_data`; for validate
    the rest of its data options too) from ``ckpt_path``; for fit, refuse a resume with nothing to train or with
    settings that would not continue the run. ``named``: the options the command sets (flags and --config files);
    ``flags``: those set by flags, which alone override the run's data."""
    from tinylm.checkpoint import checkpoint_tokenizer, load_checkpoint, tinylm_section
    from tinylm.train.final_validation import final_validation_pending

    ckpt = load_checkpoint(ckpt_path, mmap=True)  # mmap: only the metadata is read here
    meta = tinylm_section(ckpt, ckpt_path)
    checkpoint_tokenizer(ckpt, ckpt_path)  # one that does not fit its model: refused before the data is prepared
    step = int(ckpt.get("global_step", 0))
    resume_step = wandb_id = wandb_project = finish_at = None
    if sub == "fit":
        if check:  # (not for --print_config: what a refused resume would run, to change it, is printed)
            finish_at = step if continues and final_validation_pending(ckpt_path, step, cfg) else None
            check_resume(ckpt, cfg, ckpt_path, finishing=finish_at is not None)
            check_same_tokenizer(ckpt, cfg, flags, ckpt_path)
        resume_step = step  # the CSV and W&B logs continue from the checkpoint
        # the W&B run too, where this is the checkpoint's own run folder: a branch into another folder logging
        # into its parent's W&B run would log its steps a second time there, under the branch's name
        # (of a copy beside its original, `cp -r`, a W&B run of its own: two trainings logged one run's steps twice)
        wandb_id = meta.get("wandb_id") if continues and not copied_from(ckpt, ckpt_path) else None
        # its project, which a resume without the WANDB_PROJECT that named it would not find (tinylm.train.loggers.
        # wandb_project_for: a --run.wandb_project flag overrides it); a branch's own W&B run goes beside it
        wandb_project = meta.get("wandb_project")
        if "wandb_project" not in meta and wandb_id:  # an older tinylm's: the W&B run, not its project
            wandb_project = _older_wandb_project(ckpt_path)
    update = {"model": model_from(ckpt, meta, cfg, sub, ckpt_path, defaults, named)}
    data = run_data(ckpt, cfg, flags, ckpt_path)
    if sub == "validate":
        # (what run_data took is the run's, not the command's: the checkpoint's own tokenizer goes with it)
        data.update(data_from(ckpt, meta, cfg, defaults, named - {f"data.{k}" for k in data}, {**cfg.data, **data}))
    if data:
        update["data"] = data
    threads = meta.get("cpu_threads") if sub == "fit" else None
    return Start(step, resume_step, wandb_id, wandb_project, update, threads if isinstance(threads, int) else None,
                 ckpt.get("TinyLMDataModule") if sub == "fit" else None, finish_at)


RUN_DATA = ("corpus", "weights", "tokenizer", "vocab_size", "tokenizer_train_chars", "split", "val_split",
            "text_column", "data_files", "hf_config", "hf_revision", "streaming", "max_documents")
"""The data options that say which text a run read and how it was tokenized: a resume or validate takes them from
the checkpoint (a --config naming other data, or a corpus that cannot be had offline, does not matter), unless a
flag sets them (`--data.corpus OTHER`). The resume's data checks (tinylm.data.datamodule) compare fingerprints."""


def run_data(ckpt: dict, cfg, flags: set[str], ckpt_path: str) -> dict:
    """The checkpoint run's `RUN_DATA` options where they differ from the command's and no flag sets them (a
    flag that sets the corpus keeps the command's mixture weights and tokenizer options with it), said in a line."""
    trained = dict(ckpt.get("datamodule_hyper_parameters") or {})
    if "target_vocab_size" in trained:  # data.vocab_size: the target a BPE tokenizer was trained to
        trained["vocab_size"] = trained.pop("target_vocab_size")
    taken = data_of_run(trained, cfg, flags, f"{ckpt_path}: the data the run read, from its checkpoint")
    if "data.corpus" not in flags:  # (a flag's corpus is read as the user named it)
        taken.update(_files_read(ckpt, taken.get("corpus", cfg.data.get("corpus")), ckpt_path))
    if "data.tokenizer" not in flags:
        taken.update(_tokenizer_kept(ckpt, taken.get("tokenizer", cfg.data.get("tokenizer")),
                                     cfg.data.get("cache_dir"), ckpt_path))
    return taken


def _tokenizer_kept(ckpt: dict, spec: Any, cache_dir: Any, ckpt_path: str) -> dict:
    """The run's tokenizer file moved or deleted since (``--data.tokenizer PATH``): the one its checkpoint holds,
    the same tokenizer (a resume refused "tokenizer path not found" and named only options that are other
    tokenizers; validate, generate and export read the checkpoint's)."""
    import os

    from tinylm.checkpoint import tinylm_section
    from tinylm.tokenize import TRAINED_SPECS

    if not isinstance(spec, str) or spec in TRAINED_SPECS:
        return {}
    path = spec.removeprefix("tiktoken:")
    if spec.startswith("tiktoken:") and not any(c in path for c in r"/\.") or os.path.exists(os.path.expanduser(path)):
        return {}  # (tiktoken:NAME: tiktoken's own encoding)
    state = tinylm_section(ckpt, ckpt_path).get("tokenizer")
    if not state:
        return {}
    from tinylm.data.prepare import checkpoint_tokenizer_dir, default_cache_dir

    kept = checkpoint_tokenizer_dir(state, cache_dir or default_cache_dir())
    log.info("%s: data.tokenizer %s is not found; using the tokenizer the checkpoint holds (%s)", ckpt_path, spec, kept)
    return {"tokenizer": str(kept)}


def _files_read(ckpt: dict, corpus: Any, ckpt_path: str) -> dict:
    """The run's own corpus named by a relative path that is not found from here (a resume or validate from
    another folder): the files the run read, by the absolute paths its checkpoint keeps (their fingerprint is
    checked as any resume's)."""
    import os

    from tinylm.data import TinyLMDataModule

    state = ckpt.get(TinyLMDataModule.__qualname__) or {}
    specs, paths = [corpus] if isinstance(corpus, str) else list(corpus or []), state.get("corpus_paths")
    if not paths or specs != state.get("corpus_specs") or len(paths) != len(specs):
        return {}
    found = [p if p and not os.path.lexists(os.path.expanduser(s)) and os.path.exists(p) else s
             for s, p in zip(specs, paths)]
    if found == specs:
        return {}
    log.info("%s: data.corpus %s is not found from this folder; reading the file%s the run read, %s", ckpt_path,
             ", ".join(s for s, f in zip(specs, found) if s != f), "s" if len(specs) > 1 else "",
             ", ".join(f for s, f in zip(specs, found) if s != f))
    return {"corpus": found[0] if isinstance(corpus, str) else found}


def data_of_run(trained: dict, cfg, flags: set[str], where: str) -> dict:
    """`run_data`'s choice from a run's data options ``trained`` (its checkpoint's, or its config.yaml's data
    section: tinylm.cli.fit_config), said in a line that starts with ``where``."""
    by_flag = {k for k in RUN_DATA if f"data.{k}" in flags}  # (a section typed whole names its keys)
    if "corpus" in by_flag:
        by_flag |= {"weights"}
    taken = {k: trained[k] for k in RUN_DATA if k in trained and k not in by_flag and k in cfg.data
             and cfg.data[k] != trained[k]}
    if taken:
        log.info("%s: %s (flags such as --data.corpus PATH override it)", where,
                 ", ".join(f"data.{k}={v!r} (not {cfg.data[k]!r})" for k, v in taken.items()))
    return taken


TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks")
"""What Lightning saves beside the weights and a resume continues from (a weights-only save has none but loops)."""


def check_training_state(ckpt: dict, ckpt_path: str) -> None:
    """Refuse a resume from a checkpoint without the training state (a weights-only save, or a file slimmed for
    sharing): Lightning ended in a KeyError traceback without the optimizer's, and went on silently without the
    callbacks' (every random stream reseeded: not the run it continues)."""
    from tinylm.checkpoint import is_sharded_checkpoint

    missing = [key for key in TRAINING_STATE if key not in ckpt]
    if missing and not is_sharded_checkpoint(Path(ckpt_path)):  # (a sharded one is read here without its optimizer)
        raise TinyLMError(f"{ckpt_path} holds the weights but not the training state a resume continues "
                          f"({', '.join(missing)} missing: a weights-only save, or an edited file); start a new run "
                          f"from its weights with --model.init_from {ckpt_path} (no --ckpt_path), or resume from a "
                          "full checkpoint of the run (last.ckpt, step-N.ckpt)")


def check_resume(ckpt: dict, cfg, ckpt_path: str, finishing: bool = False) -> None:
    """Refuse a resume that has nothing to train (unless ``finishing``: the run's final validation is left to run,
    `tinylm.train.final_validation`), or whose settings would not continue the run."""
    check_training_state(ckpt, ckpt_path)
    step = int(ckpt.get("global_step", 0))
    max_steps = cfg.trainer.get("max_steps")
    if max_steps is not None and step >= max_steps and not finishing:
        error = TinyLMError(f"{ckpt_path} is already at step {step} >= --trainer.max_steps "
                            f"{max_steps}: nothing to train; pass a larger --trainer.max_steps to go on")
        if os.environ.get("SLURM_RESTART_COUNT", "").strip() not in ("", "0"):  # a requeued job of a finished run
            error.exit_code = 0  # (a node failed after it ended, `sbatch --requeue`): done, not FAILED in sacct
        raise error
    check_time_left(ckpt, cfg.trainer.get("max_time"), ckpt_path)
    check_weight_averaging(ckpt, cfg.trainer.get("callbacks"), ckpt_path)
    from tinylm.cli.trainer_checks import device_count
    from tinylm.data import TinyLMDataModule
    from tinylm.data.datamodule import check_global_batch

    saved = ckpt.get(TinyLMDataModule.__qualname__) or {}
    accumulate = cfg.trainer.get("accumulate_grad_batches") or 1
    # before the accumulation's check: a batch size typed wrong was told to change its accumulation
    check_global_batch(saved, cfg.data.get("batch_size"), device_count(cfg.trainer), accumulate)
    check_accumulation(ckpt, accumulate, ckpt_path, cfg.trainer.get("val_check_interval"),
                       saved.get("accumulate_grad_batches"))
    TinyLMDataModule.check_split_before_preparing(saved, cfg.data.get("val_fraction"))


def check_weight_averaging(ckpt: dict, callbacks, ckpt_path: str) -> None:
    """A checkpoint of a run with a WeightAveraging callback (EMAWeightAveraging) holds the averaged weights as its
    state_dict and the trained ones as ``current_model_state``, which only that callback puts back: resumed without
    it, the run went on from the average (train/loss back up from 3.83 to 4.10), the trained weights dropped."""
    if "current_model_state" not in ckpt:
        return
    names = [str(cb.get("class_path") if hasattr(cb, "get") else type(cb).__name__)
             for cb in (callbacks if isinstance(callbacks, (list, tuple)) else [callbacks] if callbacks else [])]
    if any(name.endswith("WeightAveraging") for name in names):
        return
    raise TinyLMError(f"{ckpt_path} was saved by a WeightAveraging callback (EMAWeightAveraging): it holds the "
                      "averaged weights as the model, and the trained ones apart, which only that callback puts "
                      "back; resume with the run's callback again (--trainer.callbacks+=EMAWeightAveraging, or "
                      "without --config: the run's own settings), or start a new run from the averaged weights with "
                      "--model.init_from")


def check_same_tokenizer(ckpt: dict, cfg, flags: set[str], ckpt_path: str) -> None:
    """Refuse a resume whose flags make another tokenizer than the run's (another kind to train, or another
    vocab_size of a BPE trained on the run's text) before the data is prepared: it trained the tokenizer and
    packed the whole corpus first (half an hour at a recipe's size), then was refused as "a different model
    shape", naming neither option."""
    from tinylm.tokenize import TRAINED_SPECS

    trained = ckpt.get("datamodule_hyper_parameters") or {}
    was_spec, was_size = trained.get("tokenizer"), trained.get("target_vocab_size")
    # (the options typed: `--data '{corpus: x}'` names data.corpus alone, not the section's every option)
    spec = cfg.data.get("tokenizer") if "data.tokenizer" in flags else was_spec
    changed = []
    if spec != was_spec and spec in TRAINED_SPECS and was_spec is not None:
        changed.append(f"data.tokenizer {spec!r} (the run's: {was_spec!r})")
    elif spec != was_spec and isinstance(spec, str) and spec not in TRAINED_SPECS and (ids := _other_file(ckpt, spec)):
        changed.append(f"data.tokenizer {spec!r} ({ids[0]:,} ids; the run's: {was_spec!r}, {ids[1]:,} ids)")
    elif spec == was_spec and isinstance(spec, str) and spec not in TRAINED_SPECS and (ids := _other_file(ckpt, spec)):
        from tinylm.tokenize.tokenizer import changed_file_message

        raise TinyLMError(f"resuming from {ckpt_path}: " + changed_file_message(spec, *ids[2:]))  # (edited in place)
    size = cfg.data.get("vocab_size")
    if "data.vocab_size" in flags and spec in ("bpe", "scratch-bpe") and spec == was_spec \
            and isinstance(was_size, int) and size != was_size:
        changed.append(f"data.vocab_size {size} (the run's BPE: {was_size})")
    if changed:
        raise TinyLMError(f"resuming from {ckpt_path} with {' and '.join(changed)}: that is another tokenizer than "
                          "the one the model was trained with, so the run cannot go on with it; drop the flag to "
                          "resume, or start a new run (without --ckpt_path) for the new tokenizer")


def _other_file(ckpt: dict, spec: str) -> tuple[int, int, str, str] | None:
    """When ``spec``, a tokenizer file or folder here (a tokenizer.json, a .tiktoken rank file; read in a moment),
    holds another tokenizer than the checkpoint's own: the two vocabulary sizes and fingerprints (the checkpoint's
    second in each pair); else None."""
    import os

    from tinylm.tokenize import Tokenizer, build_tokenizer

    state = (ckpt.get("tinylm") or {}).get("tokenizer")
    if not state or not os.path.exists(os.path.expanduser(spec.removeprefix("tiktoken:"))):
        return None  # (a tiktoken encoding's name, a hub name: the data's own check compares them)
    try:
        now, was = build_tokenizer(os.path.expanduser(spec)), Tokenizer.from_state_dict(state)
    except Exception:  # noqa: BLE001 (not a tokenizer: preparing the data says so in its own words)
        return None
    return (now.vocab_size, was.vocab_size, was.fingerprint, now.fingerprint) if now.fingerprint != was.fingerprint \
        else None


def _older_wandb_project(ckpt_path: str) -> str | None:
    """The W&B project of the run that ``ckpt_path`` (in its own run folder) continues, where the checkpoint is of a
    tinylm that kept the W&B run's id but not its project: the run's newest config record's. Resumed under a config
    without a project (the laptop recipe's), such a run stopped logging to W&B without a word."""
    from tinylm.cli.run_folder import run_record

    record, settings = run_record(Path(ckpt_path).parent.parent)
    project = (settings.get("run") or {}).get("wandb_project") if isinstance(settings.get("run"), dict) else None
    if isinstance(project, str) and project:
        log.info("%s keeps the run's W&B run but not its project (an older tinylm's checkpoint): %s, from %s",
                 ckpt_path, project, record)
        return project
    return None


def model_from(ckpt: dict, meta: dict, cfg, sub: str, ckpt_path: str, defaults, named: set[str]) -> dict:
    """The checkpoint's model hyperparameters that this command takes (warning about the user's it ignores)."""
    from tinylm.model.config import config_fields
    from tinylm.train.init_from import architecture_fields
    from tinylm.train.module import TinyLM
    from tinylm.train.options import check_known_options

    saved = dict(ckpt.get("hyper_parameters") or {})
    saved.pop("_instantiator", None)
    known = set(inspect.signature(TinyLM.__init__).parameters) - {"self"}
    check_known_options(saved, ckpt_path, meta.get("options"))  # a newer tinylm's option (ignored: another model)
    _check_saved(saved, known, ckpt_path)
    _check_saved_size(ckpt, saved, ckpt_path)
    # how the model runs, not what it computes: this run's own settings (turn recomputation on after an OOM)
    saved = {k: v for k, v in saved.items() if k in known and k not in RUNTIME_OPTIONS}
    linked = config_fields("data")  # come from the data; checked against it on load
    # a run from init_from took its architecture from the weights, never from the config: nothing to ignore there
    source = saved.get("init_from") or meta.get("init_from")  # the run's start, or a resume's record of it
    from_weights = architecture_fields() if source is not None else ()
    saved["init_from"] = source
    # a value at its default that the command does not name was not set by the user (validate without
    # --config): nothing to ignore; `--model.dropout 0.0` (the default) is named, and ignored
    ignored = [f"model.{k}={cfg.model[k]!r} (checkpoint: {v!r})" for k, v in saved.items()
               if k not in linked and k not in from_weights and k in cfg.model and not _same_value(k, cfg.model[k], v)
               and (cfg.model[k] != defaults.model.get(k) or f"model.{k}" in named)]
    if ignored:
        log.warning("%s %s: model hyperparameters come from the checkpoint; ignoring %s%s",
                    "resuming from" if sub == "fit" else "evaluating", ckpt_path, ", ".join(ignored),
                    " (to change them, start a new run)" if sub == "fit" else "")
    if sub == "fit":
        warn_schedule_change(ckpt, saved, cfg.trainer.get("max_steps"), ckpt_path)
        from tinylm.data import TinyLMDataModule

        warn_training_changes(cfg, ckpt_path, n_embd=saved.get("n_embd"),
                              data_state=ckpt.get(TinyLMDataModule.__qualname__), ckpt=ckpt)
    for key in linked:
        saved.pop(key, None)
    if source is not None:  # the checkpoint holds the weights, and the shape they gave
        step = meta.get("init_from_step")  # (where the run started, as the checkpoint records it)
        log.info("resuming from %s: its weights came from model.init_from %s%s; that source is not read again",
                 ckpt_path, meta.get("init_from") or source, "" if step is None else f" at step {step}")
        saved["init_from"] = None  # or a moved or rewritten source would break or silently change the run
    return saved


def _same_value(key: str, given: Any, saved: Any) -> bool:
    """Whether the command's model.``key`` is the checkpoint's: init_from as the same file (the checkpoints record
    its absolute path, a config the path as typed: a resume with the run's own config was told it was ignored)."""
    if key == "init_from" and isinstance(given, str) and isinstance(saved, str):
        return os.path.abspath(os.path.expanduser(given)) == os.path.abspath(os.path.expanduser(saved))
    return given == saved


def _check_saved(saved: dict, known: set[str], ckpt_path: str) -> None:
    """Refuse a checkpoint whose own model hyperparameters are bad (an edited file): TinyLM's check named the value
    as an option of the command (`model.lr must be in (0, inf), got -1.0`), which the user never passed."""
    from tinylm.checkpoint import CheckpointError
    from tinylm.train.module import TinyLM
    from tinylm.train.options import check_options

    defaults = {k: p.default for k, p in inspect.signature(TinyLM.__init__).parameters.items() if k != "self"}
    try:
        check_options({**defaults, **{k: v for k, v in saved.items() if k in known}})
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint {ckpt_path!r} holds a bad hyperparameter of its own ({e}): it is the "
                              "checkpoint's value, not an option of this command; the file was edited or written by "
                              "another tool: use another checkpoint of the run") from None


def _check_saved_size(ckpt: dict, saved: dict, ckpt_path: str) -> None:
    """The checkpoint's own n_layer, n_embd and vocab_size against its weights, before TinyLM builds the model they
    name (an edited n_layer 10**6 took the machine's memory first)."""
    from dataclasses import fields as dc_fields

    from tinylm.checkpoint import check_size
    from tinylm.model import GPTConfig

    if "vocab_size" not in saved or not isinstance(ckpt.get("state_dict"), dict):
        return
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    if state:  # (a sharded checkpoint's: read whole only later)
        check_size(GPTConfig(**{f.name: saved[f.name] for f in dc_fields(GPTConfig) if f.name in saved}), state,
                   ckpt_path)


def data_from(ckpt: dict, meta: dict, cfg, defaults, named: set[str], now: dict | None = None) -> dict:
    """For validate: the data options the run trained on, where the command does not set them otherwise
    (``now``: the data options with `run_data`'s taken)."""
    trained = dict(ckpt.get("datamodule_hyper_parameters") or {})
    # data.vocab_size: the target a BPE tokenizer was trained to, which finds it in the cache (checkpoints
    # before it was kept: the model's vocabulary, the same unless the corpus had too few merges)
    target = trained.pop("target_vocab_size", None) or (ckpt.get("hyper_parameters") or {}).get("vocab_size")
    if target is not None:
        trained["vocab_size"] = target
    state = ckpt.get("TinyLMDataModule") or {}
    specs, paths = state.get("corpus_specs"), state.get("corpus_paths")
    read_as = (paths[0] if len(paths) == 1 else paths) if paths and specs in (
        [trained.get("corpus")], trained.get("corpus")) else None  # the run's corpus by the paths it read

    def other_corpus(corpus: Any) -> bool:  # (the run's own, found by `_files_read` from another folder, is not)
        return corpus != trained.get("corpus") and (read_as is None or corpus != read_as)

    now = dict(now or cfg.data)
    data = {k: v for k, v in trained.items() if k in cfg.data and cfg.data[k] == defaults.data.get(k)
            and f"data.{k}" not in named and cfg.data[k] != v
            and not any(n.startswith(f"data.{k}.") for n in named)  # --data.clean.exact false
            and not (k == "corpus" and not other_corpus(now.get("corpus")))}
    now = {**now, **data}
    if other_corpus(now.get("corpus")):
        data.pop("weights", None)  # the run's mixture weights go with its corpora, not with --data.corpus OTHER
    from tinylm.tokenize import TRAINED_SPECS

    now = {**now, **data}
    if meta.get("tokenizer") and (now.get("tokenizer") in TRAINED_SPECS or "data.tokenizer" not in named):
        # the checkpoint's own: one trained now (on another corpus, or the run's edited since) would be
        # another tokenizer than the model's, and a tokenizer file may have moved or changed since
        from tinylm.data.prepare import checkpoint_tokenizer_dir, default_cache_dir

        data["tokenizer"] = str(checkpoint_tokenizer_dir(meta["tokenizer"],
                                                         now.get("cache_dir") or default_cache_dir()))
        if other_corpus(now.get("corpus")):
            share = now.get("val_fraction")
            log.info("evaluating on the validation split of data.corpus %s (%s; --data.val_fraction sets it) with the "
                     "checkpoint's own %s tokenizer (trained on %s)", now.get("corpus"),
                     f"its last {share * 100:.3g}%" if isinstance(share, float) else "its own",
                     trained.get("tokenizer"), trained.get("corpus"))
        elif "data.tokenizer" in named:  # asked for by name, and not what it gets: said, not done in silence
            log.info("--data.tokenizer %s would train a new tokenizer, not the model's: the checkpoint's own %s "
                     "tokenizer is used", now["tokenizer"], trained.get("tokenizer"))
    return data
