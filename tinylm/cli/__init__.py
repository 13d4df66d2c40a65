"""The `tinylm` command. `fit` and `validate` are LightningCLI; every other command is a typed function parsed by the
same library (jsonargparse), so `--help`, `--config FILE` and `--print_config` work the same everywhere.

Every error a user can cause ends as one line on stderr and exit status 1 (128 + N for a run stopped by signal N);
a bug keeps its traceback (and
``--verbose`` shows the traceback of any error).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import errno
import logging
import multiprocessing
import os
import re
import shlex
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

from tinylm.errors import TinyLMError

log = logging.getLogger("tinylm")

LIGHTNING_COMMANDS = ("fit", "validate")
PACKAGE_DIR = Path(__file__).resolve().parents[1]

# command -> its usage line; `fit`/`validate` are LightningCLI's, the rest are functions in tinylm.cli.commands
USAGE_LINES = {
    "fit": "train: tinylm fit --config configs/NAME.yaml [--trainer.max_steps N] [--ckpt_path last]",
    "validate": "evaluate: tinylm validate --ckpt_path PATH [--config configs/NAME.yaml]",
    "prepare": "tokenize and pack the data only: tinylm prepare --config configs/NAME.yaml",
    "generate": "sample from a checkpoint: tinylm generate --ckpt_path PATH --prompt TEXT",
    "export": "write a Hugging Face transformers model: tinylm export --ckpt_path PATH --out DIR",
    "eval": "zero-shot HellaSwag, PIQA, ARC, WinoGrande, LAMBADA scores: tinylm eval --ckpt_path PATH [--tasks T,...]",
    "sample-report": "compare decoding strategies: tinylm sample-report --ckpt_path PATH --out DIR",
    "plan": "size, FLOPs, tokens, memory and time of a run, no training: tinylm plan --config FILE [--gpu H100] [--out PNG]",
    "plot": "loss, LR, grad norm, tokens/s and health alerts of runs, one PNG: tinylm plot RUN [RUN ...]",
    "lr-find": "LR range test with the size rule of thumb beside it: tinylm lr-find --config FILE",
    "scaling": "compute-matched ladder, scaling-law fit, checked prediction: tinylm scaling --config FILE",
}
OWN_COMMANDS = tuple(c for c in USAGE_LINES if c not in LIGHTNING_COMMANDS)


def usage() -> str:
    width = max(map(len, USAGE_LINES)) + 2
    lines = [f"  {name:<{width}} {text}" for name, text in USAGE_LINES.items()]
    return ("usage: tinylm COMMAND [options]   (tinylm COMMAND --help for each; --config FILE and --print_config "
            "work everywhere)\n\n" + "\n".join(lines) + f"\n\n  {'--verbose':<{width}} show full tracebacks on errors")


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


def main(argv: list[str] | None = None) -> None:
    program = argv is None  # this process is the command (not a caller's main([...])): its exit is ours
    try:
        _main(argv, program)
    finally:
        if program:
            _end_at_once_on_ctrl_c()


def _main(argv: list[str] | None, program: bool) -> None:
    verbose, argv = _take_verbose(list(sys.argv[1:] if argv is None else argv))
    if not argv or argv[0] in ("-h", "--help"):  # before the console's setup, which imports Lightning (seconds)
        print(usage())
        return
    _setup_console()
    command, rest = argv[0], argv[1:]
    try:
        check_config_files(rest)
        if command in LIGHTNING_COMMANDS:
            from tinylm.cli.fit import lightning_main

            # while fit trains, tinylm.train.interrupt's handler takes over: it stops at a whole step and saves
            with _terminate_cleanly(command, program, rest):
                cli = lightning_main([command, *rest])
            if command == "validate" and hasattr(cli, "validate_result"):
                print(format_validate(cli.validate_result, cli.validate_csv))
        elif command in OWN_COMMANDS:
            from tinylm.cli import commands

            with _terminate_cleanly(command):
                commands.run(command, rest)
        else:
            raise TinyLMError(f"unknown command {command!r}; choose one of "
                              f"{', '.join(LIGHTNING_COMMANDS + OWN_COMMANDS)} (tinylm --help)")
    except KeyboardInterrupt:
        if program:
            _end_at_once_on_ctrl_c()
        commands = sys.modules.get("tinylm.cli.commands")
        if commands is not None and commands.mid_line():  # generate streamed part of a line: end it first
            print(flush=True)
        fit = sys.modules.get("tinylm.cli.fit")
        if fit is None or not fit._rank():  # a terminal's Ctrl+C reaches every rank of a run: rank 0 says it
            print("tinylm: interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:  # stdout closed by the reader (`tinylm generate ... | head`): stop quietly, as cat does
        if program:
            _end_at_once_on_ctrl_c()
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's exit flush must not fail again
        sys.exit(141)  # 128 + SIGPIPE, as a shell reports a command whose reader went away
    except Exception as raised:
        if program:
            _end_at_once_on_ctrl_c()
        e = _from_training_process(raised)
        fit = sys.modules.get("tinylm.cli.fit")
        if not verbose and not is_user_error(e) and fit is not None and (lost := fit.lost_rank(raised=e)) is not None:
            e = lost  # a rank ended first: this process's collective with it failed, which says nothing
        if fit is not None:
            fit.end_ranks()  # the ranks it started end with it, not after it
        if verbose or not is_user_error(e):
            raise
        commands = sys.modules.get("tinylm.cli.commands")
        if commands is not None and commands.mid_line():  # generate streamed part of a line: end it first
            sys.stdout.write("\n")
            sys.stdout.flush()
        # raised by every rank of a run together (the ranks agree on a stop and on the health checks; rank 0 passes
        # a SIGTERM before training on to the ranks it started): rank 0 says it
        every_rank = type(e).__name__ in ("RunInterrupted", "TrainingHealthError", "Terminated")
        rank = fit._rank() if fit is not None else 0
        if not (every_rank and rank or getattr(e, "said", False)):  # said: by a rank that ended first
            # another rank's line says which (a config or data error comes from each); one write, so that the
            # ranks' lines do not interleave (print's text and newline were two, and two lines came out as one)
            sys.stderr.write(error_line(command, one_line(e), rest, rank))
            sys.stderr.flush()
        sys.exit(getattr(e, "exit_code", 1))  # an interrupted run: 128 + the signal, as a shell reports it


def _end_at_once_on_ctrl_c() -> None:
    """From here on, as the command ends (saying why, waiting for the ranks it started, its exit hooks: the loader's
    workers joined, W&B's upload, ddp_fork's training processes), a Ctrl+C ends it at once, quietly, with 130: it
    raised KeyboardInterrupt wherever it landed ("Exception ignored in atexit callback ... KeyboardInterrupt" and a
    traceback, or a traceback in place of the line saying why the run stopped)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _end_now)


def _end_now(signum: int, frame: object) -> None:
    """End this process at once, and every process it started (nothing left running), with 128 + the signal."""
    fit = sys.modules.get("tinylm.cli.fit")
    ranks = [p.pid for p in (fit._RANKS if fit is not None else []) if p.poll() is None]
    for pid in ranks + [child.pid for child in multiprocessing.active_children()]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for stream in (sys.stdout, sys.stderr):  # what was said stays said (a pipe's buffer)
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + signum)


def error_line(command: str, line: str, args: list[str], rank: int = 0) -> str:
    """The line that ends a command on a user's error, with its resume hint spelled out."""
    hint = "`tinylm fit --config ... --ckpt_path last`"
    if hint in line:
        # the resume command with the user's own config and overrides (--run.name among them); a command that
        # runs fits inside (scaling) resumes them when it is run again
        again = resume_command(args) if command == "fit" else shlex.join(["tinylm", command, *args])
        line = line.replace(hint, f"`{again}`")
    return f"tinylm {command}: error: {f'(rank {rank}) ' if rank else ''}{line}\n"


class Terminated(TinyLMError):
    """SIGTERM reached a command outside fit's training loop (which saves and stops on its own, tinylm.train.interrupt):
    raised so that its cleanup runs (temp folders, partial exports) and it ends with a line, exit 143."""

    exit_code = 128 + signal.SIGTERM


class Interrupted(TinyLMError):
    """Ctrl+C reached ddp_fork's launching process, which passed it on to the training processes: exit 130."""

    exit_code = 128 + signal.SIGINT


@contextlib.contextmanager
def _terminate_cleanly(command: str, program: bool = False, args: list[str] = ()) -> Iterator[None]:
    def on_sigterm(signum: int, frame: object) -> None:
        children = multiprocessing.active_children()  # ddp_fork's training processes (or loader workers)
        ranks = sys.modules["tinylm.cli.fit"]._RANKS if "tinylm.cli.fit" in sys.modules else []  # ddp's, started
        for child in children + ranks:  # (they stop on it as this one does: before training, it ends them too)
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)
        if children and command == "fit":  # this process only waits for the ones that train; it exits after them
            raise Terminated("terminated by SIGTERM, passed on to the training processes: they finish their step "
                             "and save last.ckpt; resume with `tinylm fit --config ... --ckpt_path last`")
        raise Terminated(f"terminated by SIGTERM before it finished; run the same `tinylm {command}` again")

    def on_sigint(signum: int, frame: object) -> None:
        # ddp_fork's training processes (not daemonic, as loader workers are): a Ctrl+C to this process alone (a
        # notebook's Interrupt, `kill -INT`) left them training to the end. They get a SIGTERM: beside a terminal's
        # own Ctrl+C to them it is one request, where a second SIGINT would stop them at once, unsaved.
        ranks = [child for child in multiprocessing.active_children() if not child.daemon]
        if not ranks:
            interrupt = sys.modules.get("tinylm.train.interrupt")  # (imported once a run is set up)
            if program and command == "fit" and interrupt is not None and interrupt.training_over():
                # the run stopped (or ended) and is being torn down: it is exiting, and says why first (a stop's
                # line: the checkpoint is saved by now)
                if (line := interrupt.stop_line()) is not None and not sys.modules["tinylm.cli.fit"]._rank():
                    sys.stderr.write(error_line(command, line, list(args)))
                _end_now(signum, frame)
            raise KeyboardInterrupt
        for child in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
        again = "resume with `tinylm fit --config ... --ckpt_path last`" if command == "fit" else \
            f"run the same `tinylm {command}` again"
        raise Interrupted(f"interrupted by Ctrl+C, passed on to the training processes: they finish their step and "
                          f"save last.ckpt; {again}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    # only where Python's own Ctrl+C handler is in place (a caller's is left alone)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)


def resume_command(args: list[str]) -> str:
    """`tinylm fit ARGS --ckpt_path last`, ARGS being this command's own minus any --ckpt_path."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            kept.append(arg)
    return shlex.join(["tinylm", "fit", *kept, "--ckpt_path", "last"])


# ---- errors -----------------------------------------------------------------------------------------------------
_ENVIRONMENT = (errno.ENOSPC, errno.EACCES, errno.EPERM, errno.EROFS, errno.EDQUOT, errno.EMFILE,
                errno.ENOTDIR, errno.EEXIST)  # the last two: a file (or a broken link) where a folder must be made


def is_user_error(e: BaseException) -> bool:
    """Whether ``e`` is something the user can fix (printed as one line) rather than a bug (traceback).

    User errors: `TinyLMError`, command-line/config parsing errors, Lightning's MisconfigurationException, a missing
    optional package (ModuleNotFoundError: install it), a full disk or a denied permission, ValueError/OSError/TypeError
    raised by a `raise` statement in tinylm's own code (which names the bad value and the fix), and the Trainer's checks of
    its flags (Lightning's accelerator_connector). The same exception types raised inside torch, numpy or another library mean
    tinylm failed to validate something: a bug, shown with its traceback.
    """
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    if isinstance(e, (TinyLMError, argparse.ArgumentError, MisconfigurationException, ModuleNotFoundError)):
        return True
    if isinstance(e, OSError) and e.errno in _ENVIRONMENT:
        return True
    if isinstance(e, (ValueError, OSError, TypeError)):
        # tinylm's checks, config parsing, and the Trainer's own checks of its flags (an unknown --trainer.strategy)
        return any(_raised_in(e, d) for d in (PACKAGE_DIR, _jsonargparse_dir(), _trainer_flags_file()))
    return False


class TrainingProcessError(TinyLMError):
    """A user's error (a stop on a signal, a health check, a data check) raised in one of ddp_fork's training
    processes: it reaches this process only as the text of its traceback (torch's ProcessRaisedException)."""


def _from_training_process(e: BaseException) -> BaseException:
    """``e``, or the user's error it carries from a training process (ddp_fork's): its last line, with the exit
    status it has in one process (128 + N for a run stopped by signal N). Without this, a SIGTERM that reached one
    training process ended in two tracebacks and exit 1."""
    if type(e).__name__ != "ProcessRaisedException":
        return e
    text = str(e).strip()
    said = re.fullmatch(r"(?:([\w.]+)\.)?(\w+): (.*)", text.splitlines()[-1])
    frames = re.findall(r'File "([^"]+)", line', text)
    if said is None or not frames:
        return e
    module, name, message = said.groups()
    cls = getattr(sys.modules.get(module or "builtins"), name, None)
    ours = _inside(Path(frames[-1]), PACKAGE_DIR)
    if not (isinstance(cls, type) and (issubclass(cls, TinyLMError) or (ours and issubclass(cls, (ValueError, OSError,
                                                                                                  TypeError))))):
        return e
    # Python's own errors keep their type, as in one process ("ValueError: ...")
    error = TrainingProcessError(message if issubclass(cls, TinyLMError) else f"{name}: {message}")
    stopped = re.match(r"interrupted by (SIG[A-Z0-9]+)\b", message)
    error.exit_code = 128 + signal.Signals[stopped[1]] if stopped and stopped[1] in signal.Signals.__members__ \
        else getattr(cls, "exit_code", 1)
    return error


def _raised_in(e: BaseException, package: Path) -> bool:
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return _inside(Path(tb.tb_frame.f_code.co_filename), package)


def _inside(path: Path, package: Path) -> bool:
    """Whether ``path`` is ``package`` (a file) or lies in it (a folder)."""
    where = path.resolve()
    return where == package or package in where.parents


def _jsonargparse_dir() -> Path:
    import jsonargparse

    return Path(jsonargparse.__file__).resolve().parent


def _trainer_flags_file() -> Path:
    """Where Lightning checks the Trainer's arguments (accelerator, strategy, devices, precision, ...)."""
    from lightning.pytorch.trainer.connectors import accelerator_connector

    return Path(accelerator_connector.__file__).resolve()


def one_line(e: BaseException) -> str:
    """The error as one line that keeps its cause: jsonargparse's nested messages ("Does not validate against any
    of the Union subtypes ...") are reduced to the option and the innermost reason."""
    text = str(e).strip()
    if linked := re.search(r'Linked "([\w.]+)" must be given via "([\w.]+)"', text):  # --model.vocab_size 3
        return f"--{linked[1]} is set from --{linked[2]} (the data decides it); do not pass it"
    if isinstance(e, argparse.ArgumentError) or text.startswith(("Does not validate", "Problem with given")):
        return _parse_error_line(text, _chain(e))
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing {e.filename}" if e.filename else ""
        return (f"{type(e).__name__}: no space left on the disk{where}; free some space, or write on another "
                "disk (runs: --trainer.default_root_dir DIR; datasets: --data.cache_dir DIR or $TINYLM_CACHE_DIR; "
                "export and sample-report: --out DIR)")
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and "; " not in text:
        if e.errno == errno.EROFS:
            return f"{type(e).__name__}: read-only file system: {e.filename or text}; choose a path on a writable disk"
        return (f"{type(e).__name__}: permission denied: {e.filename or text}; give yourself access (chmod/chown), "
                "or choose another path")
    if isinstance(e, OSError) and e.errno in (errno.ENOTDIR, errno.EEXIST) and "; " not in text:
        where = Path(e.filename or text)
        blocker = next((p for p in (where, *where.parents) if p.is_symlink() or p.is_file()), None)
        if blocker is not None:  # else some other clash: the plain line below
            what = "a link to nothing" if blocker.is_symlink() and not blocker.exists() else "a file"
            return (f"{type(e).__name__}: {blocker} is {what}, where a folder is needed ({where}); move it away, "
                    "or choose another path")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()] or [type(e).__name__]
    name = "" if isinstance(e, TinyLMError) else f"{type(e).__name__}: "
    return name + " ".join(lines) if len(lines) <= 3 else name + lines[0] + " (more with --verbose)"


_NOISE = ("Does not validate against any of the Union subtypes", "Subtypes:", "Errors:", "Given value type:",
          "Expected a <class 'NoneType'>", "Expected a <class 'bool'>", "- Expected a", "Given value:")


def _chain(e: BaseException) -> list[str]:
    """The messages of ``e`` and its causes, outermost first (jsonargparse wraps the real reason several times)."""
    messages, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        messages.append(str(e).strip() or type(e).__name__)
        e = e.__cause__ or e.__context__
    return messages


def _parse_error_line(text: str, chain: list[str]) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    key = next((ln.split('"')[1] for ln in lines if ln.startswith('Parser key "')), None)
    # the innermost message of the chain that is not a Union summary is the real reason ("save_dir is required",
    # "No module named 'tensorboard'"); a class_path problem is named with it
    causes = [m for m in chain if m and not m.startswith(("Parser key", "Does not validate"))]
    reason = causes[-1].splitlines()[0] if causes else None
    problem = next((m.splitlines()[0] for m in causes if m.startswith("Problem with given class_path")), None)
    if problem and reason and reason != problem:
        reason = f"{problem.rstrip(':')}: {reason}"
    if reason is None:
        reasons = [ln.lstrip("- ").strip() for ln in lines if not ln.startswith('Parser key "')
                   and not any(n in ln for n in _NOISE)]
        reason = (reasons or ["invalid value"])[0]
    value = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Given value:")), None)
    if choices := _choices(text, reason):  # --strategy topk, --trainer.precision bf17: name the values it takes
        got = value if value is not None else reason.rpartition("Got value: ")[2]
        reason = f"expected one of {', '.join(choices)}, got {got}"
    elif typed := re.fullmatch(r"Expected a <class '(\w+)'>\. Got value: (.*)", reason):  # jsonargparse's wording
        kind, got = typed.groups()
        what = {"float": "a number", "int": "a whole number", "bool": "true or false"}.get(kind, f"a {kind}")
        if got.lower().lstrip("+-") in ("nan", "inf", "infinity"):
            what = "a finite number"
        reason = f"expected {what}, got {got}"
    hint = ""
    linked = next((ln for ln in lines if " --> model." in ln), None)
    if linked:  # `--model.vocab_size 3`: a linked key given by hand
        target = linked.split(" --> ")[1].split(":")[0].strip()
        source = linked.split(" --> ")[0].split()[-1]
        return f"--{target} is set from --{source} (the data decides it); do not pass it"
    if "--optimizer" in text or "--lr_scheduler" in text:
        hint = "; tinylm's optimizer and LR schedule are set with --model.* (lr, min_lr, lr_schedule, weight_decay, " \
               "beta1, beta2): see tinylm fit --help"
    if key:
        given = f" (given {value})" if value and value not in reason and "Namespace(" not in value else ""
        return f"--{key}: {reason}{given}{hint}"
    return f"{reason}{hint}"


def _choices(text: str, reason: str) -> list[str] | None:
    """The values an option of a fixed set takes (a typing.Literal, or a union of Literals and None, as
    --trainer.precision's ints and names), from jsonargparse's message; None for any other type."""
    subtypes = re.search(r"Subtypes: \[(.*)\]", text)
    literal = re.match(r"Expected a (typing\.Literal\[[^\]]*\])", reason)
    where = subtypes[1] if subtypes else literal[1] if literal else ""
    groups = re.findall(r"typing\.Literal\[([^\]]*)\]", where)
    if not groups or re.sub(r"typing\.Literal\[[^\]]*\]|<class 'NoneType'>|[\s,]", "", where):
        return None  # another type among them (a number, a path): jsonargparse's own reason says more
    return list(dict.fromkeys(str(v) for group in groups for v in ast.literal_eval(f"[{group}]")))


def check_config_files(args: list[str]) -> None:
    """Every ``--config FILE`` exists, is a regular file and is valid YAML with a mapping at the top; errors name
    the file and the line (jsonargparse would name ``<unicode string>`` instead of the file)."""
    import yaml

    paths = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--config", "-c")]
    paths += [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    for p in paths:
        path = Path(p)
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "is not a regular file" if path.exists() else "not found"
            raise FileNotFoundError(f"config file {p!r} {what}; pass --config PATH to a YAML file such as "
                                    "configs/shakespeare-char-cpu.yaml")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ValueError(f"config file {p!r} is not UTF-8 text; pass a YAML file") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            tab = " (YAML does not allow tabs for indentation: use spaces)" if "\t" in path.read_text() else ""
            raise ValueError(f"config file {p!r} is not valid YAML{where}: {problem}{tab}") from None
        if data is not None and not isinstance(data, dict):
            raise ValueError(f"config file {p!r} must hold a mapping of sections (trainer:, model:, data:, ...), "
                             f"got a {type(data).__name__}")


# ---- console ----------------------------------------------------------------------------------------------------
def _setup_console() -> None:
    """tinylm's log lines on stderr, once: a handler on the "tinylm" logger, none on the root. (A root-logger
    basicConfig made every Lightning INFO line print twice: once by Lightning's own handler, once by the root's.)"""
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    import lightning.pytorch  # noqa: F401  (installs Lightning's console handler, which the filter goes on)

    for handler in logging.getLogger("lightning.pytorch").handlers:
        if not any(isinstance(f, _NoTips) for f in handler.filters):
            handler.addFilter(_NoTips())
    warnings.formatwarning = lambda message, category, *args, **kwargs: f"{category.__name__}: {message}\n"
    from lightning.pytorch.utilities import rank_zero_only

    # another rank of a run (from its environment; NODE_RANK: a node started by hand): rank 0 says the same
    if getattr(rank_zero_only, "rank", 0) != 0 or os.environ.get("NODE_RANK", "0") not in ("", "0"):
        log.setLevel(logging.ERROR)
        warnings.simplefilter("ignore")
    # a rank that ddp_fork starts from this process learns its rank later: its handler asks at each line
    for handler in log.handlers:
        if isinstance(handler, _Stderr) and not any(isinstance(f, _RankZero) for f in handler.filters):
            handler.addFilter(_RankZero())
    # torch's line as ddp_fork ends the other training processes after one failed: the failure's line says it all
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    # Lightning's own deprecation noise about torch internals: nothing a tinylm user can act on
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")


class _Stderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is now (not the one it was created with)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _RankZero(logging.Filter):
    """Drops the info and warning lines of a rank other than 0: rank 0 says the same."""

    def filter(self, record: logging.LogRecord) -> bool:
        from lightning.pytorch.utilities import rank_zero_only

        return record.levelno >= logging.ERROR or getattr(rank_zero_only, "rank", 0) == 0


class _NoTips(logging.Filter):
    """Drops Lightning's advertising lines ("💡 Tip: ... try installing litlogger")."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip:" not in str(record.msg)


def format_validate(row: dict, path: Path | None) -> str:
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in row.items() if k.startswith("val/"))
    return f"step {row['step']}: {metrics}" + (f"\n(appended to {path})" if path is not None else "")
