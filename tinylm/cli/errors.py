"""Errors as the CLI reports them: which are the user's (one line, exit 1 or 128 + N) and which are bugs (a
traceback), and the one line that names the cause and the fix."""

from __future__ import annotations

import argparse
import ast
import difflib
import errno
import importlib
import logging
import os
import re
import shlex
import signal
import sys
from pathlib import Path

from tinylm.errors import DISK_ERRNOS, TinyLMError, is_out_of_memory, where_written

log = logging.getLogger("tinylm")


PACKAGE_DIR = Path(__file__).resolve().parents[1]
STDOUT = "the standard output"  # the file name of an OSError writing it (tinylm.cli.console)


def error_line(command: str, line: str, args: list[str], rank: int = 0) -> str:
    """The line that ends a command on a user's error, with its resume hint spelled out."""
    # a word over _LONGEST characters is shortened, but not in the resume command spelled out below: its values (a
    # corpus path 450 characters long) trained a run, and the command is there to be copied whole
    line = re.sub(r"\S{%d,}" % _LONGEST, _shortened, line)
    hint = "`tinylm fit --config ... --ckpt_path last`"
    if hint in line:
        # the resume command with the user's own config and overrides (--run.name among them); a command that
        # runs fits inside (scaling) resumes them when it is run again
        again = resume_command(args) if command == "fit" else shlex.join(["tinylm", command, *args])
        line = line.replace(hint, f"`{again}`")
    if dashed := _dashed_value(line, args):
        line += f"; a value that starts with '-' goes after '=': {dashed}"
    if globbed := _expanded_glob(line, args):
        line += (f"; {globbed} and the file before it: a glob the shell expanded into several files? Quote it "
                 "(--data.corpus 'data/*.txt') or list them (--data.corpus '[a.txt, b.txt]')")
    return f"tinylm {command}: error: {f'(rank {rank}) ' if rank else ''}{line}\n"


_LONGEST = 400
"""Characters of one word of an error line shown whole: a longer one (a value pasted by mistake, a path several
thousand characters long) is shown by its start and end, so that the line still reads as one line."""


def _shortened(word: re.Match) -> str:
    return f"{word[0][:200]}...({len(word[0]) - 300} more characters)...{word[0][-100:]}"


def _expanded_glob(line: str, args: list[str]) -> str | None:
    """The first word of ``unrecognized arguments: a/p_ab ...`` when it is a file that follows an option's value,
    itself a file of the same folder (``--data.corpus a/p_aa a/p_ab``): an unquoted glob, expanded by the shell."""
    said = re.search(r"unrecognized arguments: (\S+)", line)
    if not said or said[1] not in args or (i := args.index(said[1])) < 1:
        return None
    if args[i - 1].startswith("--"):  # --data.corpus=a/p_aa a/p_ab
        option, _, value = args[i - 1].partition("=")
    else:  # --data.corpus a/p_aa a/p_ab
        option, value = args[i - 2] if i >= 2 else "", args[i - 1]
    same_folder = os.path.dirname(value) == os.path.dirname(said[1])
    if option.startswith("--") and value and os.path.isfile(value) and os.path.isfile(said[1]) and same_folder:
        return said[1]
    return None


def _dashed_value(line: str, args: list[str]) -> str | None:
    """`--prompt=-x` for argparse's "argument --prompt: expected one argument" where ``args`` gave `--prompt -x`
    (argparse reads a value that starts with '-' as the next option; after '=' it is the value)."""
    missing = re.search(r"argument (\S+): expected one argument", line)
    flags = missing[1].split("/") if missing else []
    for flag, value in zip(args, args[1:]):
        if flag in flags and value.startswith("-"):
            return shlex.join([f"{flag}={value}"])
    return None


class Stopped(BaseException):
    """A command stopped by a signal. As KeyboardInterrupt, not an Exception: an ``except Exception`` on its way (a
    best-effort lookup, "the data is not here" around a dataset's load, a download's retries) would take it for its
    own failure, and the command went on, or ended in that other line with exit 1. It carries a TinyLMError's
    attributes (tinylm.errors) and is reported as one."""

    exit_code: int = 1
    every_rank: bool = False
    said: bool = False


USER_ERRORS = (TinyLMError, Stopped)
"""What the CLI reports in one line, its message as it is (no exception's name before it)."""


class _BySignal:
    """An error that a signal raised: its exit status is 128 + the signal's number, as a shell reports it (the
    class's, SIGTERM's, is what the launching process reads of one raised in a training process)."""

    exit_code = 128 + signal.SIGTERM
    every_rank = True

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class Terminated(_BySignal, Stopped):
    """SIGTERM (or SIGHUP) reached a command outside fit's training loop (which saves and stops on its own,
    tinylm.train.interrupt): raised so that its cleanup runs (temp folders, partial exports) and it ends with a line,
    exit 143 (129). A SIGTERM before training reaches every rank (rank 0 passes it on to the ranks it started): rank 0
    says it."""


class TrainingProcessTerminated(_BySignal, TinyLMError):
    """`Terminated` in a training process that ddp_fork started (the launching process ends them all when one
    fails): an Exception, which torch's wrapper of the process passes on to the launching process (it prints the
    traceback of any other)."""


class Interrupted(Stopped):
    """Ctrl+C reached ddp_fork's launching process, which passed it on to the training processes: exit 130."""

    exit_code = 128 + signal.SIGINT


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


# ---- an option in the wrong section -----------------------------------------------------------------------------
def with_section_hint(message: str, options: set[str]) -> str:
    """jsonargparse's refusal of options it does not know (``unrecognized arguments: --trainer.lr 0.01`` on the
    command line, ``Subcommand 'fit' does not accept option 'trainer.lr'`` from a config file) with where each one
    lives: the one option of ``options`` (the parser's, dotted) with its last name (``lr is an option of model``),
    else the nearest name (``--model.n_layers``: did you mean --model.n_layer?); ``message`` as it is when none."""
    if said := re.fullmatch(r"Subcommand '[\w-]+' does not accept option '([^']+)'|Option '([^']+)' is not accepted",
                            message):  # (the second: a command's --config file)
        said = [None, said[1] or said[2]]
        # no home and no near name: a typo reads the same, but so does a config of a newer tinylm
        hints = [_section_hint(said[1], None, options, flag=False) or NEWER_HINT]
    elif said := re.fullmatch(r"unrecognized arguments: (.*)", message, re.S):
        words = said[1].split()
        given = [(w[2:].partition("=")[0], w.partition("=")[2] if "=" in w else
                  words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("-") else None)
                 for i, w in enumerate(words) if w.startswith("--")]
        hints = [_section_hint(key, value, options, flag=True) for key, value in given]
    else:
        return message
    return "; ".join([message, *filter(None, hints)])


NEWER_HINT = ("no tinylm option has that name: drop it from the config, or, if a newer tinylm wrote the config, "
              "upgrade tinylm (git pull, or pip install -U tinylm)")
"""For a config file's option that names nothing this tinylm has, nor anything near it."""

OPTIMIZER_HINT = ("tinylm's optimizer and LR schedule are set with --model.* (optimizer adamw or muon, lr, min_lr, "
                  "lr_schedule, weight_decay, beta1, beta2): see tinylm fit --help")
"""For LightningCLI's --optimizer / --lr_scheduler (a torch class), which tinylm does not take."""


def _section_hint(key: str, value: str | None, options: set[str], *, flag: bool) -> str | None:
    if key in ("optimizer", "lr_scheduler"):  # not "an option of model": --model.optimizer takes no torch class
        return OPTIMIZER_HINT
    name = key.rpartition(".")[2]
    homes = sorted(o for o in options if o.rpartition(".")[2] == name and o != key)

    def spelled(option: str) -> str:
        return f"--{option}{f' {value}' if value is not None else ''}" if flag else option

    if len(homes) == 1:
        section = homes[0].rpartition(".")[0]
        lives = f"{name} is {f'an option of {section}' if section else 'a top-level option'}"
        if flag:
            return f"{lives}: {spelled(homes[0])}"
        where = f"under `{section}:`" if section else "at the top of the config, outside any section"
        return f"{lives}: set it {where} (--{homes[0]} on the command line)"
    if not homes and (close := difflib.get_close_matches(key, sorted(options), n=1, cutoff=0.8)):
        return f"the nearest option is {spelled(close[0])}"
    return None


# ---- errors -----------------------------------------------------------------------------------------------------
_ENVIRONMENT = (*DISK_ERRNOS, errno.EMFILE, errno.ENAMETOOLONG)


def is_user_error(e: BaseException) -> bool:
    """Whether ``e`` is something the user can fix (printed as one line) rather than a bug (traceback).

    User errors: `TinyLMError`, command-line/config parsing errors, Lightning's MisconfigurationException, a missing
    optional package (ModuleNotFoundError: install it), a full disk or a denied permission, ValueError/OSError/TypeError
    raised by a `raise` statement in tinylm's own code (which names the bad value and the fix), and the Trainer's checks
    of its flags (Lightning's accelerator_connector). The same exception types raised inside torch, numpy or another
    library mean tinylm failed to validate something: a bug, shown with its traceback.
    """
    if isinstance(e, (*USER_ERRORS, argparse.ArgumentError, ModuleNotFoundError)):
        return True
    lightning = sys.modules.get("lightning.fabric.utilities.exceptions")  # (not imported: not Lightning's error)
    if lightning is not None and isinstance(e, lightning.MisconfigurationException):
        return True
    if isinstance(e, OSError) and e.errno in _ENVIRONMENT:
        return True
    if isinstance(e, (ValueError, OSError, TypeError)):
        # tinylm's checks, config parsing, and the Trainer's own checks of its flags (an unknown --trainer.strategy;
        # the fit loop's of val_check_interval against the batches of an epoch, known once the data is there: a
        # --trainer.check_val_every_n_epoch run's interval longer than tinylm's notional epoch was a traceback)
        return any(_raised_in(e, d) for d in (PACKAGE_DIR, _jsonargparse_dir(), _trainer_flags_file(),
                                              _module_file("lightning.pytorch.loops.fit_loop")) if d)
    backends = _module_file("transformers.utils.import_utils")
    if isinstance(e, ImportError) and backends is not None and _raised_in(e, backends):
        # transformers' check of its backends: "GPT2LMHeadModel requires PyTorch >= 2.6" (transformers 5 beside an
        # older torch, which the export extra cannot rule out): install a transformers this torch has, or a newer torch
        return True
    if _port_in_use(e) or _store_gone(e) or _store_timed_out(e) or _peer_timed_out(e):
        return True
    if isinstance(e, RuntimeError) and (stopping := _module_file("lightning.pytorch.callbacks.early_stopping")):
        # "Early stopping conditioned on metric `x` which is not available. Pass in or modify your `EarlyStopping`
        # callback to use any of the following: ...": a user's --trainer.callbacks.monitor, with the metrics there are
        return _raised_in(e, stopping)
    return False


class TrainingProcessError(TinyLMError):
    """A user's error (a stop on a signal, a health check, a data check) raised in one of ddp_fork's training
    processes: it reaches this process only as the text of its traceback (torch's ProcessRaisedException)."""


_OOM_FIX = {"prepare": "a smaller --data.tokenizer_train_chars (the text the tokenizer trains on)",
            "generate": "fewer --num_samples or --max_new_tokens", "sample-report": "fewer --num_samples",
            "eval": "a smaller --batch_size", "export": "a machine with more memory (export holds the whole model)",
            "plot": "fewer runs at once"}


def out_of_memory(e: BaseException, command: str) -> BaseException:
    """``e``, or where it is the machine's memory running out (Python's MemoryError, torch's allocator failing on
    the CPU or CUDA) the one line saying so and what to lower: under `ulimit -v` or a full machine, `tinylm prepare`
    and fit ended in a 50-150 line traceback of wherever the allocation happened to fail."""
    if not is_out_of_memory(e):
        return e
    tb, ours = e.__traceback__, None  # the innermost of tinylm's own frames: what was being done
    while tb is not None:  # (by its qualified name: "in __init__" named no class, "in GPT.__init__" does)
        ours = tb.tb_frame.f_code if _inside(Path(tb.tb_frame.f_code.co_filename), PACKAGE_DIR) else ours
        tb = tb.tb_next
    where = f" in {getattr(ours, 'co_qualname', ours.co_name)}" if ours else ""
    fix = _OOM_FIX.get(command, "a smaller --data.batch_size or --data.block_size, or a smaller model "
                                "(`tinylm plan` itemizes a run's memory)")
    if ours and Path(ours.co_filename).resolve() == PACKAGE_DIR / "checkpoint.py":  # (reading one)
        fix = "a machine with more memory (the checkpoint is mapped whole)"
    limit = "its `ulimit -v` or " if _address_space_limited() else ""
    return TinyLMError(f"out of memory{where}: the process reached {limit}the memory the machine had free; free some "
                       f"(other processes) or use {fix} (--verbose shows the traceback)")


def _address_space_limited() -> bool:
    import resource

    return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY


def from_training_process(e: BaseException) -> BaseException:
    """``e``, or the user's error it carries from a training process (ddp_fork's): its last line, with the exit
    status it has in one process (128 + N for a run stopped by signal N). Without this, a SIGTERM that reached one
    training process ended in two tracebacks and exit 1."""
    spawn = sys.modules.get("torch.multiprocessing.spawn")  # (not imported: no training process raised it)
    if spawn is None or not isinstance(e, spawn.ProcessRaisedException):
        return e
    text = str(e).strip()
    said = re.fullmatch(r"(?:([\w.]+)\.)?(\w+): (.*)", text.splitlines()[-1])
    frames = re.findall(r'File "([^"]+)", line', text)
    if said is None or not frames:
        return e
    module, name, message = said.groups()
    cls = getattr(sys.modules.get(module or "builtins"), name, None)
    ours = _inside(Path(frames[-1]), PACKAGE_DIR)
    if not (isinstance(cls, type) and (issubclass(cls, USER_ERRORS) or (ours and issubclass(cls, (ValueError, OSError,
                                                                                                  TypeError))))):
        return e
    # Python's own errors keep their type, as in one process ("ValueError: ...")
    error = TrainingProcessError(message if issubclass(cls, USER_ERRORS) else f"{name}: {message}")
    stopped = re.match(r"(?:interrupted|terminated) by (SIG[A-Z0-9]+)\b", message)
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


def _port_in_use(e: BaseException) -> bool:
    """torch's refusal to start a run's rendezvous on a MASTER_PORT another process listens on."""
    dist = sys.modules.get("torch.distributed")
    network = getattr(dist, "DistNetworkError", None) if dist is not None else None
    return network is not None and isinstance(e, network) and ("EADDRINUSE" in str(e) or "in use" in str(e))


def _store_gone(e: BaseException) -> bool:
    """torch's rendezvous store (node 0's: torchrun's agent, or rank 0) gone while this rank talked to it: node 0
    ended (refused its run, killed) and this node's rank ended in torch's traceback and ~20 lines of C++ frames."""
    dist = sys.modules.get("torch.distributed")
    network = getattr(dist, "DistNetworkError", None) if dist is not None else None
    return network is not None and isinstance(e, network) and any(
        words in str(e) for words in ("Connection was likely closed", "Connection reset by peer"))


def _store_timed_out(e: BaseException) -> bool:
    """torch's rendezvous given up: a rank did not connect within the process group's timeout (a rank stopped
    meanwhile, by Ctrl+Z, kill -STOP or a scheduler's suspend; one slow to start, or never started). It ended in
    torch's traceback, ~25 lines."""
    dist = sys.modules.get("torch.distributed")
    store = getattr(dist, "DistStoreError", None) if dist is not None else None
    return store is not None and isinstance(e, store) and "Timed out" in str(e)


def _peer_timed_out(e: BaseException) -> re.Match | None:
    """gloo's collective given up after the process group's timeout (30 min unless set): another rank did not take
    part for that long (stopped alone: Ctrl+Z, kill -STOP, a scheduler's suspend of one task; or stuck). Rank 0
    ended in ~60 lines of traceback; the match's group 1: the milliseconds waited."""
    if not isinstance(e, RuntimeError):
        return None
    return re.search(r"gloo.*Timed out waiting (\d+)ms for (?:recv|send) operation", str(e))


def _module_file(name: str) -> Path | None:
    """The file of module ``name`` when it was imported (else an error cannot come from it)."""
    module = sys.modules.get(name)
    return None if module is None or not getattr(module, "__file__", None) else Path(module.__file__).resolve()


def _trainer_flags_file() -> Path | None:
    """Where Lightning checks the Trainer's arguments (accelerator, strategy, devices, precision, ...); None when
    Lightning was not imported (the error cannot come from there)."""
    connector = sys.modules.get("lightning.pytorch.trainer.connectors.accelerator_connector")
    return None if connector is None else Path(connector.__file__).resolve()


def one_line(e: BaseException) -> str:
    """The error as one line that keeps its cause: jsonargparse's nested messages ("Does not validate against any
    of the Union subtypes ...") are reduced to the option and the innermost reason."""
    text = str(e).strip()
    if linked := re.search(r'Linked "([\w.]+)" must be given via "([\w.]+)"', text):  # --model.vocab_size 3
        return f"--{linked[1]} is set from --{linked[2]} (the data decides it); do not pass it"
    if isinstance(e, argparse.ArgumentError) or text.startswith(("Does not validate", "Problem with given")):
        return _parse_error_line(text, _chain(e))
    if _port_in_use(e):  # (torch's own text: ~60 lines of C++ frames)
        port = os.environ.get("MASTER_PORT", "?")
        return (f"MASTER_PORT {port} is in use by another process (address already in use): the ranks cannot meet "
                "there; pass another MASTER_PORT, or leave it unset on one machine (Lightning then picks a free one)")
    if _store_gone(e):
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        return (f"lost the connection to the ranks' meeting point at {where} (node 0's launcher): node 0 ended, and "
                "this rank cannot go on without it; its own output says why: fix that, then run the same command "
                "again on every node")
    if _store_timed_out(e):
        where = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '?')}"
        return (f"the ranks did not all meet at {where} in time ({text.rstrip('.')}): a rank was stopped (Ctrl+Z, "
                "kill -STOP, a scheduler's suspend), slow to start, or never started; run the same command again, "
                "on every node")
    if waited := _peer_timed_out(e):  # (error_line spells the command out: a fit's resume, or the same command)
        return (f"another rank did not take part in a collective for {int(waited[1]) / 1000:.0f} s (the process "
                "group's timeout): it was stopped (Ctrl+Z, kill -STOP, a scheduler's suspend of one task) or stuck "
                "that long, so the run stopped; go on with `tinylm fit --config ... --ckpt_path last`")
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) and e.filename == STDOUT:
        return (f"{type(e).__name__}: no space left on the disk writing {STDOUT} (where the command's output was "
                "sent); free some space, or send it to a file on another disk")
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"{type(e).__name__}: no space left on the disk{where_written(e)}; free some space, or write on "
                "another disk (runs: --trainer.default_root_dir DIR; datasets: --data.cache_dir DIR or "
                "$TINYLM_CACHE_DIR; export and sample-report: --out DIR)")
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
    if isinstance(e, OSError) and e.errno == errno.ENAMETOOLONG:  # (a name over 255 bytes: --out, --run.name)
        return (f"{type(e).__name__}: file name too long: {e.filename or text}; choose a shorter name (at most 255 "
                "bytes a folder or file)")
    if isinstance(e, ModuleNotFoundError) and e.name and "; " not in text:
        package = e.name.split(".")[0]
        extra = _EXTRAS.get(package)
        package = _DISTRIBUTIONS.get(package, package)  # `pip install yaml` installs no PyYAML
        how = f"pip install 'tinylm[{extra}]' (or pip install {package})" if extra else f"pip install {package}"
        return f"{type(e).__name__}: {text}; this command needs it: {how}"
    if (strategy := _not_interactive(text)) is not None:
        return strategy
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()] or [type(e).__name__]
    name = "" if isinstance(e, USER_ERRORS) else f"{type(e).__name__}: "
    return name + " ".join(lines) if len(lines) <= 3 else name + lines[0] + " (more with --verbose)"


def _not_interactive(text: str) -> str | None:
    """The line for Lightning's refusal of a strategy that starts its ranks as scripts (ddp, fsdp) in an interactive
    Python (a notebook's `main(["fit", ..., "--trainer.strategy", "ddp"])`), whose advice is for Python code: "choose
    `Trainer(strategy='ddp_notebook')` ... include the Trainer creation inside the worker function"; None for another
    error."""
    if not (interactive := re.match(r"`Trainer\(strategy=(.+?)\)` is not compatible with an interactive", text)):
        return None
    given, instance = interactive[1], re.search(r"(\w+) object at", interactive[1])  # ('ddp'; a class_path's repr)
    given = given[1:-1] if given[:1] in "'\"" else instance[1] if instance else "this strategy"
    # (--trainer.strategy fsdp is tinylm's FSDP2Strategy by then: the line named a value nobody typed, and offered
    # ddp_notebook, which shards nothing, as the same run)
    sharded = given == "FSDP2Strategy"
    given = "fsdp (FSDP2)" if sharded else given
    ddp = "where the model and AdamW fit one device (DDP: nothing sharded), " if sharded else ""
    return (f"--trainer.strategy {given} starts its ranks by running this process's command line again, and an "
            f"interactive Python (a notebook's kernel) has none to run: {ddp}pass --trainer.strategy ddp_notebook here "
            "(or ddp_fork, the same), or run the command in a terminal (`!tinylm ...` in a notebook's cell)")


# optional packages and the extra of pyproject.toml that installs each (`make train` installs only `plots`)
_EXTRAS = {"matplotlib": "plots", "transformers": "export", "safetensors": "export", "datasketch": "clean",
           "xxhash": "clean", "llguidance": "grammar"}

# modules whose distribution on PyPI has another name
_DISTRIBUTIONS = {"yaml": "pyyaml"}

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
    reason = _class_reason(key, text, reason)
    named = re.search(r"^Problem with given class_path '(?:[\w.]+\.)?(\w+)'", reason or "")
    if named and key in ("trainer.callbacks", "trainer.callbacks+"):
        from tinylm.cli.trainer_checks import refused_callback

        if (refused := refused_callback(named[1])) is not None:  # not its missing arguments: it is refused anyway
            return refused
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
        if kind == "int" and "Expected a <class 'float'>" in text:  # int | float (gradient_clip_val, limit_*):
            kind = "float"  # the int branch's reason came last, but 0.5 is welcome
        what = {"float": "a number", "int": "a whole number", "bool": "true or false"}.get(kind, f"a {kind}")
        reason = f"expected {what}, got {got}"
        if got.lower().lstrip("+-") in ("nan", "inf", "infinity"):
            reason = f"expected a finite number, got {got}"
        elif kind in ("int", "float") and _is_number(got, int if kind == "int" else float):  # '"10"': YAML's text
            reason = f"expected {what}, got the quoted text {got!r}; write it without quotes"
        elif kind == "int" and _is_number(got, float) and float(got).is_integer() and abs(float(got)) < 2**63:
            # `--trainer.max_steps 1e3` (or `10.0`): YAML reads it as a float, which jsonargparse shows as 1000.0
            reason = (f"expected a whole number, got {got} (1e3 or 10.0 is read as a float); write it as "
                      f"{int(float(got))}")
        if key == "seed_everything":  # int or bool: jsonargparse's last try was the bool
            reason = f"expected a whole number in [0, 2**32) or true (a random seed), got {got}"
    hint = ""
    linked = next((ln for ln in lines if " --> model." in ln), None)
    if linked:  # `--model.vocab_size 3`: a linked key given by hand
        target = linked.split(" --> ")[1].split(":")[0].strip()
        source = linked.split(" --> ")[0].split()[-1]
        return f"--{target} is set from --{source} (the data decides it); do not pass it"
    if "--optimizer" in text or "--lr_scheduler" in text:
        hint = f"; {OPTIMIZER_HINT}"
    if key:
        given = f" (given {value})" if value and value not in reason and "Namespace(" not in value else ""
        return f"--{key}: {reason}{given}{hint}"
    return f"{reason}{hint}"


# the options that take a Lightning class by its name: the module whose names they take, and a few of them
_CLASS_OPTIONS = {"trainer.callbacks": ("lightning.pytorch.callbacks", "EarlyStopping, LearningRateMonitor"),
                  "trainer.logger": ("lightning.pytorch.loggers", "CSVLogger, WandbLogger, TensorBoardLogger"),
                  "trainer.plugins": ("lightning.pytorch.plugins", "AsyncCheckpointIO, TorchCheckpointIO")}
_CLASS_OPTIONS["trainer.callbacks+"] = _CLASS_OPTIONS["trainer.callbacks"]


def _class_reason(key: str | None, text: str, reason: str | None) -> str | None:
    """The reason an option that takes a class, or a list of them (callbacks, loggers, plugins), refused its value.
    jsonargparse's chain ends in the union's first branch it tried ("Expected a <class 'list'>" for `--trainer.callbacks
    EarlyStopping`, "Not a valid subclass of Logger" for a list of loggers one of which fails); the class's own
    reason (its missing arguments, a name that imports nothing) is only in the union's listing. A name that imports
    nothing gets the nearest of Lightning's names."""
    if reason is None or reason.startswith(("Not a valid subclass", "Does not implement", "Expected a <class 'list'>")):
        listed = re.search(r"^\s*- (Problem with given class_path '[^']+'):\n\s+(\S.*)$", text, re.M)
        dotted = re.search(r"^\s*- (Expected a dot import path string: \S+)$", text, re.M)
        reason = f"{listed[1]}: {listed[2]}" if listed else dotted[1] if dotted else reason
    unknown = re.fullmatch(r"Expected a dot import path string: (\S+)", reason or "")
    if unknown and key in _CLASS_OPTIONS:
        module, examples = _CLASS_OPTIONS[key]
        names = [n for n in getattr(importlib.import_module(module), "__all__", []) if n[:1].isupper()]
        near = difflib.get_close_matches(unknown[1], names, n=1, cutoff=0.6)
        meant = f"did you mean {near[0]}? " if near else ""
        reason = (f"{unknown[1]} is not a class of {module}: {meant}(give one of its names, {examples}, ..., or a "
                  "class's full import path, my_package.MyClass)")
    return reason


def _is_number(text: str, kind: type) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


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
