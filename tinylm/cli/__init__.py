"""The `tinylm` command line.

    main.py        dispatch: `tinylm COMMAND ...`, --verbose, a user's error as one line (the entry point)
    table.py       the command table: each command's usage line and function
    errors.py      which errors are the user's, and the one line that names the cause and the fix
    console.py     log lines, warnings and stdout
    signals.py     SIGTERM / Ctrl+C outside fit's training loop
    commands.py    the own commands' parsing (jsonargparse) and prepare, generate, export, sample-report
    prompts.py     the text they read: escapes, --prompt_file, sample-report's --prompts_file
    plan.py, plot.py, lr_find.py, scaling.py: those commands (their studies live in tinylm.studies)
    fit.py         `fit` / `validate`: the LightningCLI subclass, with
      run_folder.py    where a run lives, one writer at a time, nothing overwritten
      trainer_checks.py  Trainer options checked before Lightning trips over them
      resume.py      --ckpt_path, what a run takes from its checkpoint, and the map of where resume lives
      run_config.py  the run's config.yaml (and resume records) and its start line
      ranks.py       the ranks of a DDP run as processes: watched, and why one was lost
    fit_config.py  a fit config read by other commands (plan, lr-find, scaling) without training
"""

from tinylm.cli.main import main

__all__ = ["main"]
