"""The `tinylm` command. `fit` and `validate` are LightningCLI; every other command is a typed function parsed by the
same library (jsonargparse), so `--help`, `--config FILE` and `--print_config` work the same everywhere.

Every error a user can cause ends as one line on stderr and exit status 1 (128 + N for a run stopped by signal N);
a bug keeps its traceback (and ``--verbose`` shows the traceback of any error): tinylm.cli.errors.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import gc
import logging
import multiprocessing
import numbers
import os
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

from tinylm.cli import console, early, errors, ranks, signals
from tinylm.cli.argv import check_fit_configs, expand_home, numbers_attached, texts_as_typed
from tinylm.cli.config_files import check_config_files
from tinylm.cli.table import COMMANDS, usage
from tinylm.errors import TinyLMError
from tinylm.train import stop_state

log = logging.getLogger("tinylm")


_BOOLEANS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def _take_verbose(argv: list[str]) -> tuple[bool, list[str]]:
    """tinylm's --verbose out of the arguments: also `--verbose true|false` (the form validate's --help shows) and
    `--verbose=VALUE` (true/false, yes/no, on/off, 1/0)."""
    verbose, rest, i = False, [], 0
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        if flag != "--verbose":
            rest.append(argv[i])
        elif eq:
            if value.lower() not in _BOOLEANS:
                sys.exit(f"tinylm: error: --verbose takes true or false, got {value!r}")
            verbose = _BOOLEANS[value.lower()]
        elif i + 1 < len(argv) and argv[i + 1].lower() in ("true", "false"):  # (not "1": a run folder of plot's)
            i, verbose = i + 1, _BOOLEANS[argv[i + 1].lower()]
        else:
            verbose = True
        i += 1
    return verbose, rest


def _print_or_141(text: str) -> None:
    """Print ``text`` (the usage, the version) before the console's setup; a reader gone (`tinylm --help | head -3`,
    `tinylm --version | true`) ends the command quietly, as for any command's output."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        console.quiet_stdout()
        sys.exit(141)
    except OSError as e:  # `tinylm --version > /dev/full`, a full disk: one line, as every command's output says it
        console.quiet_stdout()
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # (named as console._Output names it; another error as it is)
            e = OSError(e.errno, e.strerror, errors.STDOUT)
        sys.exit(f"tinylm: error: {errors.one_line(e)}")


def main(argv: list[str] | None = None) -> None:
    program = argv is None  # this process is the command (not a caller's main([...])): its exit is ours
    argv = _words(argv)
    if program:  # a library's log file on a full disk (W&B's debug.log in the run folder): no traceback per record
        logging.raiseExceptions = False
    # a caller's process (a notebook, a script) goes on after the command: what the command set for itself is put back
    # (WANDB_MODE: tinylm's "offline" for a run without credentials, Lightning's "dryrun" for an offline WandbLogger:
    # every later run of the process logged offline "WANDB_MODE=dryrun", also after `wandb login`, and so did the
    # caller's own wandb.init; PL_GLOBAL_SEED: Lightning's seed_everything reads it back, and every later
    # `--seed_everything true` of the process took the last run's seed, not a random one; warnings.formatwarning:
    # the caller's own warnings lost their file and line; --trainer.deterministic true: Lightning's
    # torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG, on for every later run of the process;
    # torch's CPU thread count, which fit and generate choose (--run.threads, or the CPUs free at the start): the
    # caller's own torch code after it ran on that count, 1 thread after a run started at a busy moment);
    # and the command runs in a copy of the caller's context: jsonargparse's parser of the last command, kept in a
    # ContextVar it never resets, held that run's Trainer, model, optimizer state and data memmaps (GPU memory and
    # file descriptors) until the next command of the process, past gc.collect() and torch.cuda.empty_cache()
    env, formatwarning = {name: os.environ.get(name) for name in _CALLERS_ENV}, warnings.formatwarning
    torch = sys.modules.get("torch")  # (not imported here: torch's defaults, if not imported yet)
    deterministic = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
                     ) if torch is not None else (False, False)
    threads = torch.get_num_threads() if torch is not None else None
    claimed, refused = _claim(argv)
    callers = set() if program else {child.pid for child in multiprocessing.active_children()}
    try:
        contextvars.copy_context().run(_main, argv, program, refused)
    finally:
        if program:
            signals.end_at_once_on_ctrl_c()
            _frozen_for_exit()
        elif refused is None:  # (a refused call changed nothing; the running command's state is its own)
            _join_training_processes(callers)
            _put_back(env, formatwarning, deterministic, threads)
        if claimed:
            _RUNNING.clear()


def _words(argv) -> list[str] | None:
    """A caller's `main([...])` arguments as the command line's words: a path (pathlib, as subprocess.run takes one)
    and a number are the text they stand for (`main(["fit", "--config", folder / "x.yaml", "--trainer.max_steps",
    20])` ended in "AttributeError: 'PosixPath' object has no attribute 'partition'"). Anything else is refused, as a
    Python call's wrong argument: one text (`main("fit --config x.yaml")` was the unknown command 'f') or None."""
    if argv is None:
        return None
    if isinstance(argv, (str, bytes)):
        raise TypeError(f"tinylm.cli.main takes the command line as a list of words, got the text {argv!r}; pass "
                        f"main(shlex.split({argv!r})) or main([...])")
    words = []
    for i, word in enumerate(argv):
        word = os.fspath(word) if isinstance(word, os.PathLike) else word
        # (a bool too: "True", as --flag True reads; numpy's numbers, a sweep's np.arange or a DataFrame's row)
        word = str(word) if isinstance(word, numbers.Real) else word
        if not isinstance(word, str):
            raise TypeError(f"tinylm.cli.main takes the command line's words as texts (or paths and numbers): word "
                            f"{i} is {word!r} ({type(word).__name__}); pass the text the command line would have")
        words.append(word)
    return words


def _join_training_processes(callers: set[int]) -> None:
    """Wait for the training processes the command forked (ddp_fork, ddp_notebook) to end, as a process that is the
    command does at its exit: a notebook's Interrupt (SIGINT to the kernel alone) is passed on to them and ends the
    command at once, and `main([...])` returned while they still trained, last.ckpt not saved yet (the next cell's
    `--ckpt_path last` started the run over beside them). ``callers``: the caller's own processes, not waited for.
    A second Interrupt stops the waiting (they go on to save, and end on their own)."""
    try:
        for child in multiprocessing.active_children():
            if child.pid not in callers and not child.daemon:
                child.join()
    except KeyboardInterrupt:
        pass


_RUNNING: list[tuple[int, str, str]] = []
"""The command running in this process: (its thread's ident, the thread's name, the command); empty when none."""
_CLAIMING = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child (multiprocessing's or a ProcessPoolExecutor's workers, fork on Linux) runs only the thread that
    forked: another thread's command is not running there, and was refused in every worker a sweep forked while a
    command ran in a thread (the process-based executor the refusal advises); the lock starts free."""
    global _CLAIMING
    _CLAIMING = threading.Lock()
    _RUNNING[:] = [entry for entry in _RUNNING if entry[0] == threading.get_ident()]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _claim(argv: list[str] | None) -> tuple[bool, str | None]:
    """Take this process for the command of ``argv``: (whether this call took it, None) when it may run (this thread
    may hold it already: a callback's command inside a run), else (False, why not): another thread's command runs
    (a sweep's trials in threads: Optuna's n_jobs, a thread pool). The working folder (jsonargparse parses a config
    from the config's folder), the random seed, torch's thread count and the environment are the process's: two
    commands at once read each other's (a relative --data.corpus "not found", in the other config's folder)."""
    command = (argv or sys.argv[1:] or ["tinylm"])[0]
    with _CLAIMING:
        if _RUNNING and _RUNNING[0][0] != threading.get_ident():
            _, thread, running = _RUNNING[0]
            return False, (f"another tinylm command ({running}, in thread {thread!r}) is running in this process: "
                           "tinylm runs one command at a time in a process (the working folder, random seed and torch "
                           "threads are the process's); wait for it, or run each in its own process "
                           "(subprocess.run([sys.executable, '-m', 'tinylm', ...]), or a sweep tool's process-based "
                           "executor)")
        if _RUNNING:
            return False, None
        _RUNNING.append((threading.get_ident(), threading.current_thread().name, command))
    return True, None


_CALLERS_ENV = ("WANDB_MODE", "PL_GLOBAL_SEED", "PL_SEED_WORKERS", "CUBLAS_WORKSPACE_CONFIG", "MASTER_PORT")
"""The environment variables a command sets for itself (or Lightning does for it): a caller's `main([...])` gets its
own back (see main). MASTER_PORT: Lightning's ddp_fork launcher sets the port its run chose, which every later DDP
run of the process then took as given (a port another program may hold by then) instead of finding a free one."""


def _put_back(env: dict[str, str | None], formatwarning, deterministic: tuple[bool, bool],
              threads: int | None) -> None:
    """Put back the caller's environment variables (_CALLERS_ENV), warnings.formatwarning, torch's deterministic
    algorithms setting and its CPU thread count (``threads``; None: torch was not imported, its own default) after
    `main([...])`."""
    if os.environ.get("WANDB_MODE") != env["WANDB_MODE"]:  # (set by a run: its loggers module is imported)
        from tinylm.train import loggers

        loggers._went_offline = None  # (the reason it had for a WANDB_MODE no longer set)
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    warnings.formatwarning = formatwarning
    if (torch := sys.modules.get("torch")) is not None and (torch.are_deterministic_algorithms_enabled(),
                                                            torch.is_deterministic_algorithms_warn_only_enabled()) \
            != deterministic:
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    if torch is not None:
        from tinylm.device import torch_default_threads

        threads = threads or torch_default_threads()
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _main(argv: list[str] | None, program: bool, refused: str | None = None) -> None:
    verbose, argv = _take_verbose(list(sys.argv[1:] if argv is None else argv))
    if argv and argv[0] in ("-V", "--version"):
        from tinylm import __version__

        _print_or_141(f"tinylm {__version__}")
        return
    if not argv or argv[0] in ("-h", "--help"):  # before the console's setup, which imports Lightning (seconds)
        _print_or_141(usage())
        return
    console.setup()  # (imports nothing heavy: the checks below come before any such import)
    signals.SAID[0] = False
    stop_state.line = None  # (an earlier command's, in a caller's process)
    # `--trainer.default_root_dir=~/runs`: the home folder; `--model.lr -1e-3`: that value (Python 3.11's argparse
    # read an option with no value); once, here, before anything reads the line (tinylm.cli.argv)
    # `--samples.prompts+ "[END]"`: that text, not the YAML list ["END"] jsonargparse made of it
    command, rest = argv[0], argv[1:]
    try:
        if refused is not None:
            raise TinyLMError(refused)
        rest = texts_as_typed(expand_home(numbers_attached(rest)), {"samples.prompts"})
        if sys.platform == "win32":  # SIGHUP, SIGALRM and flock (fcntl) throughout: every command ended in a traceback
            raise TinyLMError("tinylm runs on Linux and macOS, not on Windows itself (it relies on POSIX signals and "
                              "file locks); run it under WSL (wsl --install, then the same commands there)")
        if early.help_only(rest) and command in COMMANDS:
            _help(command, rest, program)
            return
        check_config_files(rest)
        if command in ("fit", "validate", "prepare"):  # (plan, lr-find, scaling: after their own options' check)
            check_fit_configs(command, rest)
        early.check_run_folder_free(command, rest)
        _run(command, rest, program)
    except KeyboardInterrupt:
        if program:
            signals.end_at_once_on_ctrl_c()
        console.end_line()  # generate streamed part of a line: end it first
        if not ranks.rank():  # a terminal's Ctrl+C reaches every rank of a run: rank 0 says it
            # a second Ctrl+C during a run: where it stopped and where it goes on from (tinylm.train.interrupt)
            said = stop_state.line if command in ("fit", "scaling") and stop_state.line is not None else None
            _say(errors.error_line(command, said, rest) if said else "tinylm: interrupted\n")
        signals.SAID[0] = True
        sys.exit(130)
    except (BrokenPipeError, SystemExit) as e:  # stdout closed by the reader (`tinylm generate ... | head`): stop
        # quietly, as cat does; also where rich (Lightning's table of `validate`) answered it with SystemExit(1)
        if isinstance(e, SystemExit) and not isinstance(e.__context__, BrokenPipeError):
            raise
        if program:
            signals.end_at_once_on_ctrl_c()
        console.quiet_stdout()
        sys.exit(141)  # 128 + SIGPIPE, as a shell reports a command whose reader went away
    except (Exception, errors.Stopped) as raised:  # (a signal's stop is no Exception)
        if program:
            signals.end_at_once_on_ctrl_c()
        _end_on_error(raised, command, rest, verbose)


def _help(command: str, rest: list[str], program: bool) -> None:
    """``tinylm COMMAND --help``: the text kept from the last time (tinylm.cli.early), else made (for fit and
    validate by LightningCLI, after Lightning's imports) and kept."""
    import contextlib
    import io

    text = early.cached_help(command, rest)
    if text is None:
        made = io.StringIO()
        try:
            with contextlib.redirect_stdout(made):
                _run(command, rest, program)
        except SystemExit as e:
            if e.code not in (0, None):
                raise
        text = made.getvalue()
        early.remember_help(command, rest, text)
    sys.stdout.write(text)
    sys.stdout.flush()
    sys.exit(0)  # as argparse ends after its help


NO_LIGHTNING = ("prepare", "plot", "generate", "sample-report", "eval", "export")
"""The commands that never import Lightning: those that read a checkpoint need torch and the model alone, and
Lightning's import (torchmetrics, torch._dynamo: ~200 MB, 2x generate's peak memory, and 3x its CPU time) came only
from tinylm.checkpoint's import of Lightning's checkpoint writer (now in tinylm.train.checkpoint_io)."""


def _run(command: str, rest: list[str], program: bool) -> None:
    if command not in COMMANDS:
        raise TinyLMError(f"unknown command {command!r}; choose one of {', '.join(COMMANDS)} (tinylm --help)")
    # (Lightning's import, seconds, inside the handlers: a SIGTERM there ended the command without a word)
    if COMMANDS[command].lightning:
        # while fit trains, tinylm.train.interrupt's handler takes over: it stops at a whole step and saves
        with signals.terminate_cleanly(command, program), signals.usr_signals_kept(program, command):
            with signals.held(command, program), _collector_paused(program):
                console.setup_lightning()
            started = time.perf_counter()
            with console.kept_to_the_end(command == "validate"):  # (its result recorded, whoever reads stdout)
                cli = COMMANDS[command].function()([command, *rest])
        if command == "validate" and hasattr(cli, "validate_result"):
            from tinylm.cli.summary import example_prompt, exportable, validate_next

            print(console.format_validate(cli.validate_result, cli.validate_csv))
            print(validate_next(Path(cli.validate_result["checkpoint"]), example_prompt(cli.datamodule.tokenizer),
                                exportable(cli.model)))
        if command == "fit" and not ranks.rank():
            print(_fit_summary(cli, time.perf_counter() - started))
    else:
        from tinylm.cli import commands

        with signals.terminate_cleanly(command), signals.usr_signals_kept(program):
            if command not in NO_LIGHTNING:
                with signals.held(command, program), _collector_paused(program):
                    console.setup_lightning()
            commands.run(command, rest)


@contextlib.contextmanager
def _collector_paused(program: bool):
    """Lightning's import (thousands of modules, ~450,000 objects) without Python's cyclic garbage collector, in a
    process that is the command (``program``): its full passes over the growing heap during the import (7, ~0.5 s
    of CPU) found ~12,000 objects of garbage. One pass after it collects them, and the imported objects are frozen
    (gc.freeze): no later pass walks them again, nor do the passes of the interpreter's exit (~1 s of CPU per
    command). What the command itself creates is collected as before. A caller's process (``main([...])``) keeps
    its collector as it was: its own objects are not frozen."""
    if not program or not gc.isenabled() or "lightning.pytorch" in sys.modules:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def _frozen_for_exit() -> None:
    """The command is over and the process exits: its garbage collected now (what the interpreter's exit would
    collect of it, finalizers run), then every object left frozen (gc.freeze), which the exit's own full passes
    then skip: they walked torch's and Lightning's imported objects again, ~0.6 s of CPU after `tinylm generate`
    (of ~3.5 s), ~1 s after `tinylm fit`."""
    gc.collect()
    gc.freeze()


def _fit_summary(cli, seconds: float) -> str:
    from tinylm.cli.summary import example_prompt, exportable, fit_summary
    from tinylm.train.callbacks import REACHED_STEP
    from tinylm.train.loggers import wandb_dir, wandb_loggers

    trainer, data = cli.trainer, cli.datamodule
    # (under ddp_fork this process's trainer did not train: the step the training processes reached)
    steps = max(trainer.global_step, int(trainer.callback_metrics.get(REACHED_STEP, 0)))
    tokens = data.batch_size * trainer.accumulate_grad_batches * trainer.world_size * data.block_size
    wandb = wandb_loggers(trainer.loggers)
    from tinylm.train.callbacks import BestCheckpoint

    # (with no metrics.csv, --trainer.logger false: the final numbers the trainer holds, and the best val/loss)
    final = {k: float(v) for k, v in trainer.callback_metrics.items() if k in ("val/loss", "val/bpb")}
    best = next((float(cb.best_model_score) for cb in trainer.checkpoint_callbacks
                 if isinstance(cb, BestCheckpoint) and cb.best_model_score is not None), None)
    return fit_summary(cli.run_dir, steps=steps, first_step=cli.resume_step or 0,
                       tokens_per_step=tokens, seconds=seconds, prompt=example_prompt(data.tokenizer),
                       exportable=exportable(cli.model),
                       wandb=(wandb_dir(wandb[0]), wandb[0].version) if wandb else None,
                       final=final, best_loss=best,
                       # (fast_dev_run saves nothing; with checkpointing off there is no checkpoint callback)
                       checkpointing=bool(trainer.checkpoint_callbacks) and not trainer.fast_dev_run)


def _say(line: str) -> None:
    """Write the command's ending line on stderr. A stderr whose reader went away (`tinylm fit ... 2>&1 | tee log`,
    tee ended by the same Ctrl+C or SIGTERM; `2>&1 | head`) drops it: its BrokenPipeError replaced the command's exit
    status (130, 143, 141, ...) with 1, a traceback nobody could read. A stderr on a full disk, the same."""
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except OSError:  # its reader gone (EPIPE), or its disk full (`fit > log 2>&1` on a full disk: ENOSPC, EDQUOT)
        null = os.open(os.devnull, os.O_WRONLY)  # (Python's own flush of stderr at exit must not fail again)
        os.dup2(null, sys.stderr.fileno())
        os.close(null)


def _end_on_error(raised: BaseException, command: str, rest: list[str], verbose: bool) -> None:
    """Say a user's error in one line and exit with its status; re-raise a bug (or any error, with --verbose: a
    user's error that ends with another status than 1 is said by its traceback, and ends with that status)."""
    if ranks.RANKS:  # the watch of the ranks it started says why it ends, or this does: one line (never released)
        ranks.REPORTING.acquire()  # the watch, saying a rank lost, ends this process before this goes on
    e = errors.out_of_memory(errors.from_training_process(raised), command)
    if not verbose and not errors.is_user_error(e) and (lost := ranks.lost_rank(raised=e)) is not None:
        e = lost  # a rank ended first: this process's collective with it failed, which says nothing
    ranks.end_ranks()  # the ranks it started end with it, not after it
    if not errors.is_user_error(e) or verbose and getattr(e, "exit_code", 1) == 1:
        raise  # the exception being handled: this runs inside main's `except`
    if verbose:  # (a run stopped by SIGTERM exited 1 with --verbose, as a crash does, not 143; a requeued one, not 0)
        _say("".join(traceback.format_exception(raised)))
        signals.SAID[0] = True
        sys.exit(e.exit_code)
    console.end_line()  # generate streamed part of a line: end it first
    # raised by every rank of a run together (the ranks agree on a stop and on the health checks; rank 0 passes a
    # SIGTERM before training on to the ranks it started): rank 0 says it
    rank = ranks.rank()
    if not (getattr(e, "every_rank", False) and rank or getattr(e, "said", False)):  # said: by a rank that ended first
        # another rank's line says which (a config or data error comes from each); one write, so that the ranks'
        # lines do not interleave (print's text and newline were two, and two lines came out as one)
        _say(errors.error_line(command, errors.one_line(e), rest, rank))
    signals.SAID[0] = True
    sys.exit(getattr(e, "exit_code", 1))  # an interrupted run: 128 + the signal, as a shell reports it
