"""Torch's CPU threads on a shared machine: chosen from the CPUs other processes leave free, said in the start line,
set by --run.threads or the environment."""

from pathlib import Path

import pytest
import torch
from helpers import _one_line_error

from tinylm.cli import main
from tinylm.device import choose_cpu_threads, usable_cpus


@pytest.fixture
def threads(monkeypatch):
    """Torch's thread count is process-wide: put it back for the tests that follow. Yields the counts the commands
    of the test ran with, one per `main([...])`, in order (main puts the caller's own back as it returns)."""
    import importlib

    main_module = importlib.import_module("tinylm.cli.main")  # (the module: `tinylm.cli.main` is its function)
    ran_with, put_back = [], main_module._put_back

    def record(*args, **kwargs):
        ran_with.append(torch.get_num_threads())
        put_back(*args, **kwargs)

    monkeypatch.setattr(main_module, "_put_back", record)
    before = torch.get_num_threads()
    yield ran_with
    torch.set_num_threads(before)


def test_busy_cpus_leave_one_thread_and_quiet_ones_torchs_default(monkeypatch):
    """Catches a run that keeps torch's 2 threads while other jobs hold both CPUs (a laptop-recipe step took 5.8 s
    instead of 0.64 s with 1 thread), or that takes fewer than today's on a quiet machine."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    cpus = usable_cpus()
    assert choose_cpu_threads(default=cpus, busy=float(cpus))[0] == 1
    assert choose_cpu_threads(default=cpus, busy=3.0 * cpus)[0] == 1
    n, why = choose_cpu_threads(default=cpus, busy=0.0)
    assert n == cpus and why.startswith(f"{cpus} of {cpus}")
    if cpus >= 2:
        n, why = choose_cpu_threads(default=cpus, busy=cpus - 1.0)
        assert n == 1 and f"kept {cpus - 1.0:.1f} of {cpus} CPUs busy" in why


def test_run_threads_and_the_environment_override_the_choice(monkeypatch):
    """Catches tinylm's choice overruling a user's: --run.threads first, then OMP_NUM_THREADS / MKL_NUM_THREADS."""
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert choose_cpu_threads(5, default=2, busy=2.0) == (5, "5 (--run.threads)")
    n, why = choose_cpu_threads(None, default=2, busy=2.0)
    assert n == torch.get_num_threads() and "OMP_NUM_THREADS=3" in why


@pytest.mark.parametrize("value", ["0", "abc", "-2"])
def test_an_environment_thread_count_that_is_none_is_not_said_to_decide(monkeypatch, value):
    """Catches `OMP_NUM_THREADS=0` (or "abc"), which OpenMP warns about and torch ignores, said to have decided the
    count ("2 (torch's, from OMP_NUM_THREADS=0)"): tinylm chooses, and says the value was ignored."""
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    n, why = choose_cpu_threads(None, default=2, busy=0.0)
    assert "from OMP_NUM_THREADS" not in why and f"OMP_NUM_THREADS={value!r} is no thread count, ignored" in why
    assert n == min(2, usable_cpus())


def test_fit_sets_and_says_its_threads(run_config, threads, caplog):
    """Catches `--run.threads` parsed but not applied, or the choice not said at the start of a run."""
    config = run_config(trainer={"max_steps": 1, "val_check_interval": 1})
    torch.set_num_threads(2)
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--config", str(config), "--run.threads", "1"])
    assert threads == [1]
    assert "CPU threads: 1 (--run.threads)" in [r.getMessage() for r in caplog.records]


def test_zero_threads_is_refused_in_one_line(run_config, capsys):
    """Catches --run.threads 0 reaching torch (which refuses it mid-start with a traceback)."""
    _one_line_error(capsys, ["fit", "--config", str(run_config()), "--run.threads", "0"], "run.threads", "got 0")


def test_a_resume_takes_the_runs_own_thread_count(run_config, threads, caplog, monkeypatch):
    """Catches a resume whose thread count tinylm chose afresh from the machine's load (2 threads for the run, 1 for
    its resume): float sums in another order, the resumed losses off the uninterrupted run's by 1e-4 (exact resume
    promised); a count the user sets on the resume still wins."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    config = run_config(trainer={"max_steps": 2, "val_check_interval": 2})
    main(["fit", "--config", str(config), "--run.threads", "2"])
    torch.set_num_threads(1)
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--config", str(config), "--trainer.max_steps", "3", "--ckpt_path", "last"])
    assert threads[-1] == 2
    assert any(r.getMessage().startswith("CPU threads: 2, the run's own (from its checkpoint") for r in caplog.records)
    main(["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", "last", "--run.threads", "1"])
    assert threads[-1] == 1


@pytest.mark.parametrize("command", ["generate", "eval", "sample-report"])
def test_commands_that_run_a_model_take_the_free_cpus(run_config, threads, caplog, monkeypatch, command):
    """Catches generate (and eval, sample-report) keeping torch's every thread beside another job: a sample of the
    laptop recipe's model beside a training run on 2 cores took 42-50 s with 2 threads and 21 s with 1."""
    from tinylm import device

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    main(["fit", "--config", str(run_config())])
    torch.set_num_threads(2)
    device._TORCH_DEFAULT[:] = [2]
    monkeypatch.setattr(device, "busy_cpus", lambda sample_s=0.3: float(usable_cpus()))  # every CPU taken
    evals = Path(__file__).parents[1] / "fixtures" / "evals"
    args = {"generate": ["--max_new_tokens", "2"],
            "eval": ["--tasks", "hellaswag", "--limit", "1", "--data_dir", str(evals)],
            "sample-report": ["--out", "report", "--num_samples", "1", "--max_new_tokens", "2"]}[command]
    caplog.clear()
    with caplog.at_level("INFO", logger="tinylm"):
        main([command, "--ckpt_path", "runs/tiny/checkpoints/last.ckpt", *args])
    assert threads[-1] == 1
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("CPU threads: ")]
    assert lines == [f"CPU threads: 1 of 2: other processes kept {usable_cpus():.1f} of {usable_cpus()} CPUs busy; "
                     "OMP_NUM_THREADS=N sets it"], lines


@pytest.mark.parametrize("command, args", [
    ("generate", ["--regex", "[0-9]+"]),
    ("generate", ["--json_schema", '{"type": "integer"}', "--strategy", "greedy"]),
    ("sample-report", ["--out", "report", "--regex", "[0-9]+"]),
    ("sample-report", ["--out", "report", "--prompts", "€"]),
])
def test_a_refused_decoding_option_prints_no_line_of_threads(run_config, threads, caplog, capsys, monkeypatch,
                                                            command, args):
    """Catches generate and sample-report saying their `CPU threads:` line before refusing what the checkpoint's
    tokenizer cannot do (a regex of digits for a char tokenizer that has none, a prompt of a character it lacks):
    the refused command printed two lines, the first as if decoding were starting."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    main(["fit", "--config", str(run_config())])
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level("INFO", logger="tinylm"), pytest.raises(SystemExit):
        main([command, "--ckpt_path", "runs/tiny/checkpoints/last.ckpt", "--max_new_tokens", "2", *args])
    assert not [r for r in caplog.records if r.getMessage().startswith("CPU threads: ")]
    assert "CPU threads" not in capsys.readouterr().err


def test_lr_find_sets_and_says_its_threads(run_config, threads, caplog, monkeypatch):
    """Catches lr-find's own Trainer keeping torch's every thread: `--run.threads 1` did nothing, and no `CPU
    threads:` line was said (fit and scaling choose and say theirs)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    torch.set_num_threads(2)
    with caplog.at_level("INFO", logger="tinylm"):
        main(["lr-find", "--config", str(run_config()), "--num_training", "4", "--run.threads", "1"])
    assert threads == [1]
    assert "CPU threads: 1 (--run.threads)" in [r.getMessage() for r in caplog.records]
