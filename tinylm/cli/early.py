"""What a command answers or refuses before its heavy imports: torch and Lightning take 5-9 s to import on a quiet
machine (minutes on a loaded one), and `tinylm fit --help`, a config file that is not there or a run folder that
another process is writing owe the user no such wait.

    cached_help / remember_help   a command's --help, kept from the last time it was made (LightningCLI's for fit
                                  and validate needs Lightning), keyed by everything that shapes it
    check_run_folder_free         `fit` into a run folder another tinylm process holds: refused at once
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

HELP_FLAGS = ("-h", "--help")
_HELP_PACKAGES = ("lightning", "jsonargparse", "torch", "docstring-parser", "typeshed-client")
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK", "NODE_RANK")


def help_only(args: list[str]) -> bool:
    """Whether ``args`` (after the command) ask for its help and nothing else: the help that can be kept."""
    return len(args) == 1 and args[0] in HELP_FLAGS


def _help_file(command: str, args: list[str]) -> Path:
    """Where ``tinylm COMMAND --help``'s text is kept: a name hashed from what shapes the text (tinylm's source files,
    the versions of the packages that write help, the terminal's width and colours), so any change makes a new one."""
    from importlib import metadata

    package = Path(__file__).resolve().parents[1]
    key = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        stat = path.stat()
        key.update(f"{path.relative_to(package)} {stat.st_mtime_ns} {stat.st_size}\n".encode())
    for name in _HELP_PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            key.update(f"{name} {metadata.version(name)}\n".encode())
    looks = {k: v for k, v in os.environ.items() if k.startswith(("JSONARGPARSE", "TINYLM")) or k in (
        "NO_COLOR", "FORCE_COLOR", "PYTHON_COLORS", "TERM")}
    key.update(json.dumps([command, args, sys.version, shutil.get_terminal_size().columns, sys.stdout.isatty(),
                           sorted(looks.items())]).encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinylm" / "help"
    return cache / f"{command}-{key.hexdigest()[:24]}.txt"


def cached_help(command: str, args: list[str]) -> str | None:
    """The text ``tinylm COMMAND --help`` printed the last time, if nothing that shapes it changed since."""
    try:
        return _help_file(command, args).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def remember_help(command: str, args: list[str], text: str) -> None:
    """Keep ``text`` for the next ``tinylm COMMAND --help`` (written whole, then renamed into place; a cache that
    cannot be written costs the next call its imports, nothing else)."""
    path = _help_file(command, args)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        part.write_text(text, encoding="utf-8")
        os.replace(part, path)


def check_run_folder_free(command: str, args: list[str]) -> None:
    """Refuse `fit` into a run folder that another tinylm process holds, before the imports (the full check,
    tinylm.cli.run_folder.check_run_folder, runs again after them). The folder is found as the run finds it: the
    --config files and ``--run.name``/``--trainer.default_root_dir`` in order (tinylm.cli.argv), after a resume that
    names no --config has put its run's config record first (run_folder.with_run_config: `tinylm fit --ckpt_path
    runs/x/checkpoints/last.ckpt` is runs/x). A spelling tinylm.cli.argv does not follow, a process that is a rank
    of a run (its rank 0 holds the folder) and --print_config (which runs nothing) are left to that check."""
    if command != "fit" or any(os.environ.get(k, "0") not in ("", "0") for k in _RANK_VARIABLES) or any(
            a.startswith("--print_config") for a in args):
        return
    from tinylm.cli.argv import settings
    from tinylm.cli.run_folder import RUNS_ROOT, RunOptions, run_dir_of, with_run_config
    from tinylm.cli.run_lock import check_not_in_use

    found = settings(with_run_config([command, *args], quiet=True)[1:],
                     {"run.name": RunOptions.name, "trainer.default_root_dir": RUNS_ROOT})
    if found is not None:
        check_not_in_use(run_dir_of(found["trainer.default_root_dir"], found["run.name"]))
