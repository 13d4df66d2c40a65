"""W&B without credentials runs offline (never prompts, never blocks), and a resume continues the same W&B run."""

import logging
import re
import time

import pytest
import yaml

from tinylm.cli import main
from tinylm.cli.fit import lightning_main
from tinylm.train.loggers import _truncate_after, make_loggers, wandb_mode


@pytest.fixture
def no_wandb_account(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # conftest disables W&B; these tests want the real decision
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc with a stored key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / ".config" / "wandb"))
    monkeypatch.delenv("WANDB_DIR", raising=False)  # W&B's files in the run folder, unless a test sets it
    monkeypatch.delenv("WANDB_PROJECT", raising=False)


def test_no_credentials_means_offline(no_wandb_account, tmp_path, caplog):
    """Catches W&B prompting for a key (hanging a headless run) or failing when there is no account."""
    assert wandb_mode() == "offline"
    with caplog.at_level(logging.INFO, logger="tinylm"):
        loggers = make_loggers(tmp_path / "run", "r", "tinylm-test")
    kinds = [type(lg).__name__ for lg in loggers]
    assert kinds == ["WandbLogger", "RunCSVLogger"]
    offline_lines = [r.getMessage() for r in caplog.records if "offline" in r.getMessage()]
    assert len(offline_lines) == 1 and "wandb sync" in offline_lines[0]
    assert "no W&B credentials: set WANDB_API_KEY or run `wandb login`" in offline_lines[0]



def test_wandb_without_home_gets_the_users_cache_folder(no_wandb_account, monkeypatch):
    """Catches a W&B run with HOME unset (a cron job, a service) flooding stderr with ~20 lines of wandb-core's own
    log ("failed to get logger path", "Unable to find cache directory") and leaving a .wandb_cache folder where the
    command ran: wandb's Go service finds its folder from XDG_CACHE_HOME or HOME only, so the first is set to the
    user's ~/.cache (Python finds the home in the password database) before wandb starts."""
    import os

    monkeypatch.delenv("HOME")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert wandb_mode() == "offline"
    assert os.environ["XDG_CACHE_HOME"] == os.path.join(os.path.expanduser("~"), ".cache")
    monkeypatch.setenv("XDG_CACHE_HOME", "/elsewhere")  # one the user set is theirs
    wandb_mode()
    assert os.environ["XDG_CACHE_HOME"] == "/elsewhere"

def test_offline_says_why(no_wandb_account, tmp_path, monkeypatch, caplog):
    """Catches "no credentials or network" for a user's own WANDB_MODE=offline (a logged-in user left wondering
    why the key was not found)."""
    from tinylm.train import loggers

    monkeypatch.setattr(loggers, "_went_offline", None)
    monkeypatch.setenv("WANDB_MODE", "offline")
    with caplog.at_level(logging.INFO, logger="tinylm"):
        make_loggers(tmp_path / "run", "r", "tinylm-test")
    said = [r.getMessage() for r in caplog.records if "offline" in r.getMessage()]
    assert len(said) == 1 and "(WANDB_MODE=offline; upload later with `wandb sync`)" in said[0], said


def test_the_reachability_probe_asks_the_server_wandb_will_use(monkeypatch):
    """Catches the probe asking api.wandb.ai while wandb 0.31 talks to CoreWeave Forge's API by default: a network
    that reaches one and not the other gave an online run that retried for ~95 s and ended in a CommError."""
    pytest.importorskip("wandb")
    from wandb.sdk.wandb_settings import Settings

    from tinylm.train.loggers import _base_url

    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    assert _base_url() == str(Settings().base_url).rstrip("/")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:8080")
    assert _base_url() == "http://127.0.0.1:8080"


def test_a_key_wandb_login_stores_or_no_network_are_seen(no_wandb_account, tmp_path, monkeypatch):
    """Catches the ~/.netrc entry wandb 0.31's `wandb login` writes (for CoreWeave Forge's host) going unseen, so a
    logged-in user's runs went offline; and a key with no network going online: wandb.init retried for ~95 s, then
    ended the run with a CommError traceback."""
    import os
    import socket

    from tinylm.train import loggers
    from tinylm.train.loggers import _has_wandb_key

    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / ".netrc").write_text(f"machine api.forge.coreweave.com\n  login user\n  password {'ab' * 20}\n")
    os.chmod(home / ".netrc", 0o600)
    assert _has_wandb_key()
    with socket.socket() as s:  # a port nothing listens on: the server cannot be reached
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("WANDB_API_KEY", "ab" * 20)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    assert wandb_mode() == "offline" and os.environ["WANDB_MODE"] == "offline"
    assert loggers._offline_reason() == f"http://127.0.0.1:{port} cannot be reached"


def test_disabled_or_no_project_means_csv_only(tmp_path, monkeypatch):
    """Catches W&B starting although the user turned it off."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert [type(lg).__name__ for lg in make_loggers(tmp_path, "r", "p")] == ["RunCSVLogger"]
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert [type(lg).__name__ for lg in make_loggers(tmp_path, "r", None)] == ["RunCSVLogger"]


def test_wandb_project_from_the_environment_unless_a_flag_names_it(tmp_path, monkeypatch):
    """Catches WANDB_PROJECT being ignored (tinylm passed its default project to wandb.init, whose arguments
    override W&B's environment variables), a flag losing to it, or it turning on W&B that the config turned off."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "from-env")

    def project(*args, **kwargs):
        wandb = make_loggers(tmp_path, "r", *args, **kwargs)[0]
        return wandb._wandb_init["project"] if type(wandb).__name__ == "WandbLogger" else None

    assert project("tinylm") == "from-env"
    assert project("mine", project_flag=True) == "mine"
    assert project(None) is None


def test_resumed_run_continues_the_same_wandb_run(no_wandb_account, tmp_path, run_config, capfd, monkeypatch):
    """Catches a resume opening a second W&B run, splitting one training curve in two; and wandb's deprecation
    warning about the `anonymous` setting Lightning passes (W&B offline was to say one line, not six). With
    WANDB_DIR set, W&B's files go to $WANDB_DIR/wandb (the run folder's path overrode it) and the resume still
    continues the same W&B run; a run started with WANDB_PROJECT=foo and resumed without it stays in foo (it went
    to the config's project)."""
    import torch

    run_config(
        name="c.yaml",
        run={"name": "wb", "wandb_project": "tinylm-test", "checkpoint_every": 2, "keep_checkpoints": -1},
        samples={"every_n_steps": 2, "prompts": ["A"], "max_new_tokens": 4},
        model={"n_layer": 1, "decay_steps": 4},
    )
    monkeypatch.setenv("WANDB_DIR", "elsewhere")  # relative, as users write it: the folder of the command
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    main(["fit", "--config", "c.yaml"])
    monkeypatch.delenv("WANDB_PROJECT")
    main(["fit", "--config", "c.yaml", "--trainer.max_steps", "4", "--ckpt_path", "last"])
    said = capfd.readouterr()
    err = said.err
    assert "wandb" in err and "anonymous" not in err  # guard: wandb did talk
    assert "W&B project from-env, the run's own" in err
    # the end of the resume uploads both parts (it named the newest alone: `wandb sync` of it lost steps 1-2)
    assert re.search(r"W&B: +offline; upload with `wandb sync elsewhere/wandb/offline-run-\*-\w+`", said.out), said

    def tinylm_section(name):
        return torch.load(tmp_path / "runs" / "wb" / "checkpoints" / name, weights_only=True)["tinylm"]

    first, last = tinylm_section("step-2.ckpt"), tinylm_section("last.ckpt")
    runs = sorted((tmp_path / "elsewhere" / "wandb").glob("offline-run-*"))
    assert first["wandb_id"] and last["wandb_id"] == first["wandb_id"]  # the resume logged into the run named
    assert len(runs) == 2 and _ids(runs) == {first["wandb_id"]}, [r.name for r in runs]  # one W&B run
    assert not (tmp_path / "runs" / "wb" / "wandb").exists()
    assert first["wandb_project"] == last["wandb_project"] == "from-env"
    assert b"from-env" in next(runs[1].glob("run-*.wandb")).read_bytes()  # what wandb itself was told
    # a resume under a config with no project (the laptop recipe's) still logs to the run's W&B run (it logged
    # nothing to W&B, without a word); `--run.wandb_project null` on the command line turns W&B off
    cfg = yaml.safe_load((tmp_path / "c.yaml").read_text())
    (tmp_path / "null.yaml").write_text(yaml.safe_dump({**cfg, "run": {**cfg["run"], "wandb_project": None}}))
    main(["fit", "--config", "null.yaml", "--trainer.max_steps", "6", "--ckpt_path", "last"])
    said = capfd.readouterr().err
    assert "W&B project from-env, the run's own, from its checkpoint (run.wandb_project is null" in said
    main(["fit", "--config", "null.yaml", "--trainer.max_steps", "8", "--ckpt_path", "last", "--run.wandb_project",
          "null"])
    runs = sorted((tmp_path / "elsewhere" / "wandb").glob("offline-run-*"))
    assert len(runs) == 3 and _ids(runs) == {first["wandb_id"]}, [r.name for r in runs]


def test_an_older_checkpoints_wandb_run_is_continued_under_a_config_without_a_project(no_wandb_account, tmp_path,
                                                                                       run_config, capfd):
    """Catches a run whose checkpoint an older tinylm wrote (the W&B run's id kept, its project not) resumed under a
    config without a project (the laptop recipe's) logging nothing more to W&B, without a word: the project comes
    from the run's own config record, and the resume continues the same W&B run."""
    import torch

    run_config(name="c.yaml", run={"name": "wb", "wandb_project": "tinylm-test"}, model={"n_layer": 1})
    main(["fit", "--config", "c.yaml", "--trainer.max_steps", "2"])
    last = tmp_path / "runs" / "wb" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    del ckpt["tinylm"]["wandb_project"]  # as a tinylm before the project was kept wrote it
    last.unlink()  # a new file: last.ckpt may be step-2.ckpt's, read-only (tinylm.checkpoint_share)
    torch.save(ckpt, last)
    settings = yaml.safe_load((tmp_path / "c.yaml").read_text())
    (tmp_path / "null.yaml").write_text(yaml.safe_dump({**settings, "run": {**settings["run"], "wandb_project": None}}))
    capfd.readouterr()
    main(["fit", "--config", "null.yaml", "--trainer.max_steps", "4", "--ckpt_path", "last"])
    err = capfd.readouterr().err
    assert "keeps the run's W&B run but not its project (an older tinylm's checkpoint): tinylm-test" in err, err
    runs = sorted((tmp_path / "runs" / "wb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and _ids(runs) == {ckpt["tinylm"]["wandb_id"]}, [r.name for r in runs]  # one W&B run
    assert torch.load(last, weights_only=True)["tinylm"]["wandb_project"] == "tinylm-test"


def test_samples_sit_at_the_wandb_step_of_their_steps_metrics(no_wandb_account, run_config, monkeypatch):
    """Catches the samples table logged at W&B's x axis value one past the metrics of the same optimizer step
    (its val/loss at Lightning's logging step, steps done - 1; the table at steps done): on W&B a sample and the
    val/loss it was written beside looked one step apart."""
    from lightning.pytorch.loggers import WandbLogger

    logged = []
    log_metrics = WandbLogger.log_metrics

    def seen(self, metrics, step=None):
        logged.append((step, set(metrics)))
        return log_metrics(self, metrics, step)

    monkeypatch.setattr(WandbLogger, "log_metrics", seen)
    cfg = run_config(run={"wandb_project": "tinylm-test"}, trainer={"max_steps": 4},
                     samples={"every_n_steps": 2, "prompts": ["A"], "max_new_tokens": 2})
    main(["fit", "--config", str(cfg)])
    samples = [step for step, keys in logged if "samples" in keys]
    validations = [step for step, keys in logged if "val/loss" in keys]
    assert samples == validations == [1, 3], logged


def test_a_resume_refused_as_it_starts_leaves_no_empty_wandb_run(no_wandb_account, tmp_path, run_config, capsys):
    """Catches a resume refused on restoring its checkpoint (here: a tensor edited out of it) leaving an empty
    offline W&B run behind, which `latest-run` pointed at and `wandb sync` uploaded as the run's last part."""
    import torch
    from helpers import _one_line_error

    config = run_config(run={"name": "wb", "wandb_project": "tinylm-test"})
    main(["fit", "--config", str(config)])
    wandb_dir = tmp_path / "runs" / "wb" / "wandb"
    first = sorted(wandb_dir.glob("offline-run-*"))
    last = tmp_path / "runs" / "wb" / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    del ckpt["state_dict"]["model.lm_head.weight"]
    last.unlink()  # (for a user who is not root: a read-only hard link, its step's files share it)
    torch.save(ckpt, last)
    _one_line_error(capsys, ["fit", "--config", str(config), "--trainer.max_steps", "4", "--ckpt_path", "last"],
                    "lm_head.weight")
    assert len(first) == 1 and sorted(wandb_dir.glob("offline-run-*")) == first  # the run's own alone
    assert (wandb_dir / "latest-run").resolve() == first[0] and (wandb_dir / "debug.log").resolve().is_file()


def test_a_runs_only_offline_part_is_kept_empty(no_wandb_account, tmp_path):
    """Catches the W&B folder of a fresh run that failed before its first step (a crash in setup) removed with the
    logs that say why: only an empty later part of a run (a refused resume) goes."""
    import wandb

    from tinylm.train.loggers import finish_wandb

    wandb.init(project="p", dir=str(tmp_path), mode="offline", id="onlypart", settings=wandb.Settings(silent=True))
    finish_wandb(exit_code=1)
    (only,) = (tmp_path / "wandb").glob("offline-run-*-onlypart")
    assert (only / "logs" / "debug.log").is_file()


def test_a_run_stopped_by_a_signal_is_recorded_in_w_and_b_with_its_exit_status(no_wandb_account, tmp_path):
    """Catches a run stopped by SIGTERM (or SIGHUP, Ctrl+C) after saving, the command's exit 143 (129, 130),
    recorded in its W&B run as exit code 1, as a crash."""
    import wandb

    from tinylm.train.interrupt import RunInterrupted

    class Stopped:  # a fit stopped as tinylm.train.interrupt stops it
        def __init__(self, *args, **kwargs):
            raise RunInterrupted("interrupted by SIGTERM at step 3; saved last.ckpt", signum=15, step=3,
                                 ckpt_path="last.ckpt")

    wandb.init(project="p", dir=str(tmp_path), mode="offline", id="stopped", settings=wandb.Settings(silent=True))
    with pytest.raises(RunInterrupted):
        lightning_main(["fit"], cli_class=Stopped)
    (part,) = (tmp_path / "wandb").glob("offline-run-*-stopped")
    debug = (part / "logs" / "debug.log").read_text()
    assert "exitcode: 143" in debug, debug[-2000:]


def _ids(folders) -> set[str]:
    """The W&B run ids of offline-run folders: offline-run-DATE_TIME-ID, with "-1", "-2" added by wandb to a folder
    of an id started in the same second as the one before (two quick resumes of a tiny run)."""
    return {re.fullmatch(r"offline-run-\d{8}_\d{6}-([a-z0-9]+)(?:-\d+)?", f.name)[1] for f in folders}


def test_wandb_dir_places_wandb_files_unless_a_logger_names_its_own(tmp_path, monkeypatch):
    """Catches WANDB_DIR going unused (Lightning's WandbLogger passes its save_dir, the run folder or its default
    `.`, to wandb.init, which overrides the variable), it overriding a user's WandbLogger's own save_dir, and one
    that cannot be made ending in a traceback (wandb itself went on in a temporary folder)."""
    from lightning.pytorch.loggers import WandbLogger

    from tinylm.errors import TinyLMError
    from tinylm.train.loggers import adopt_users_loggers

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    assert make_loggers(tmp_path / "run", "r", "p")[0]._wandb_init["dir"] == str(tmp_path / "run")  # unset
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wd"))
    wandb = make_loggers(tmp_path / "run", "r", "p")[0]
    assert wandb._wandb_init["dir"] == str(tmp_path / "wd")
    assert wandb.save_dir == str(tmp_path / "run")  # trainer.log_dir (profiler traces): still the run folder
    theirs, _ = adopt_users_loggers([WandbLogger(project="p"), WandbLogger(project="p", save_dir=str(tmp_path))],
                                    "p", wandb_id=None, resume_step=None)
    assert [lg._wandb_init["dir"] for lg in theirs] == [str(tmp_path / "wd"), str(tmp_path)]
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "a-file" / "wd"))  # a folder that cannot be made: one line
    with pytest.raises(TinyLMError, match=r"WANDB_DIR=.*a-file/wd: cannot make that folder .* set WANDB_DIR to a "):
        make_loggers(tmp_path / "run", "r", "p")


def test_a_wandb_dir_that_cannot_be_written_is_refused_in_one_line(tmp_path, monkeypatch):
    """Catches a WANDB_DIR that exists but cannot be written (no permission, a read-only disk) let through: wandb
    warned "wasn't read/writable" and logged the run into /tmp/wandb, while tinylm's line said the run's W&B files were
    in $WANDB_DIR/wandb and the run's end offered no `wandb sync` (docs/training.md: "no permission" stops the run
    in one line)."""
    import os

    from tinylm.errors import TinyLMError

    monkeypatch.setenv("WANDB_MODE", "offline")
    locked = tmp_path / "locked"
    locked.mkdir()
    access = os.access
    # (chmod 0o500 alone: root may write anyway, and os.access says so)
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if str(path) == str(locked) and mode & os.W_OK
                        else access(path, mode, **kw))
    monkeypatch.setenv("WANDB_DIR", str(locked))
    with pytest.raises(TinyLMError, match=r"^WANDB_DIR=.*locked: that folder cannot be written .*; set WANDB_DIR "):
        make_loggers(tmp_path / "run", "r", "p")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "open"))  # a writable one (made): taken
    assert make_loggers(tmp_path / "run", "r", "p")[0]._wandb_init["dir"] == str(tmp_path / "open")


def test_a_full_wandb_dir_leaves_the_run_going_and_its_end_says_w_and_b_is_cut_short(no_wandb_account, run_config,
                                                                                     capfd, monkeypatch):
    """Catches a full disk under W&B's files alone (WANDB_DIR on another disk, the run folder with room) ending the
    run at its next samples, its steps since the last checkpoint lost: wandb moves the samples table into its media
    folder in this process, and the OSError (naming the table's temporary copy in /tmp) was the run's error; then
    the run's end offering `wandb sync` of W&B's cut files as whole."""
    import errno
    import shutil

    from tinylm.train import loggers

    move = shutil.move

    def full(src, dst, *args, **kwargs):  # as wandb's copy of a table into a full WANDB_DIR (another disk)
        if "media" in str(dst):
            raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))
        return move(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "move", full)
    config = run_config(run={"name": "wb", "wandb_project": "tinylm-test"}, trainer={"max_steps": 4},
                        samples={"every_n_steps": 2, "prompts": ["A"], "max_new_tokens": 2})
    main(["fit", "--config", str(config)])
    said = capfd.readouterr()
    assert said.err.count("W&B: No space left on device writing ") == 1, said.err  # said once, not at each samples
    assert "media" in said.err and "the run goes on" in said.err, said.err
    assert "run wb done: step 4" in said.out and "upload with `wandb sync" not in said.out, said.out
    assert re.search(r"W&B: +offline, a write failed \(OSError: No space left on device\): runs/wb/wandb/offline-run-"
                     r"\S+ may be cut short", said.out), said.out
    assert (config.parent / "runs" / "wb" / "checkpoints" / "last.ckpt").is_file()
    monkeypatch.setattr(shutil, "move", move)  # the next run of the process, with room: offered whole
    main(["fit", "--config", str(config), "--run.name", "wb2"])
    assert "W&B:         offline; upload with `wandb sync runs/wb2/" in capfd.readouterr().out
    assert loggers.WANDB_UNFINISHED == []


def test_a_resume_logs_to_the_runs_wandb_project_unless_a_flag_names_another(monkeypatch, caplog):
    """Catches a resume without the WANDB_PROJECT that started the run (or with another one, or a recipe's project)
    logging to another W&B project than the run's, and a --run.wandb_project flag on resume losing to the run's or
    changing the project without a warning (as a resume's other changed settings warn)."""
    from tinylm.train.loggers import wandb_project_for

    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    with caplog.at_level(logging.INFO, logger="tinylm"):
        assert wandb_project_for("tinylm", None, False) == "tinylm"  # a new run: the config's
        assert wandb_project_for("tinylm", "foo", False) == "foo"  # a resume: the run's, not the config's
        monkeypatch.setenv("WANDB_PROJECT", "bar")
        assert wandb_project_for("tinylm", None, False) == "bar"
        assert wandb_project_for("tinylm", "foo", False) == "foo"  # not the environment's either
        assert wandb_project_for("mine", "foo", True) == "mine"  # a flag: applies, with a warning
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said[0] == ("INFO", "W&B project foo, the run's own, from its checkpoint (not run.wandb_project tinylm; "
                               "--run.wandb_project NAME overrides it)")
    assert said[2][1].startswith("W&B project foo, the run's own, from its checkpoint (not WANDB_PROJECT bar;")
    assert said[3][0] == "WARNING" and "not the run's foo" in said[3][1] and len(said) == 4


def test_a_users_wandb_logger_logs_the_run_alone(no_wandb_account, tmp_path, run_config):
    """Catches a user's `--trainer.logger WandbLogger` beside tinylm's own: both logged into the one W&B run wandb
    allows a process (every row twice), in tinylm's project and folder, the user's ignored. Offline without
    credentials, as tinylm's own."""
    import os

    from tinylm.cli.fit import TinyLMCLI

    class Built(TinyLMCLI):  # the trainer as fit builds it, without training (nor starting wandb)
        def _run_subcommand(self, subcommand: str) -> None:
            pass

    run_config(name="c.yaml", run={"name": "wb", "wandb_project": "tinylm-test"})
    cli = lightning_main(["fit", "--config", "c.yaml", "--trainer.logger", "WandbLogger", "--trainer.logger.project",
                          "mine"], cli_class=Built)
    wandb = [lg for lg in cli.trainer.loggers if type(lg).__name__ == "WandbLogger"]
    assert len(wandb) == 1 and wandb[0]._project == "mine" and os.environ["WANDB_MODE"] == "offline"
    assert any(type(lg).__name__ == "RunCSVLogger" for lg in cli.trainer.loggers)  # tinylm's CSV still beside it


@pytest.mark.slow
def test_ranks_that_ddp_fork_starts_log_to_wandb(no_wandb_account, tmp_path, run_config):
    """Catches W&B keeping nothing of a ddp_fork run (its file held 7 bytes, no metric): a forked rank leaves by
    os._exit, past the hook with which wandb ends and writes its run."""
    import os

    import forked  # `python -m tinylm` forked from a process that imported tinylm, torch and Lightning once

    config = run_config(run={"name": "wb", "wandb_project": "tinylm-test"}, trainer={"max_steps": 4})
    # not the address of the wandb service an earlier test of this process started (wandb exports it)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    done = forked.run(["fit", "--config", str(config), "--trainer.accelerator", "cpu", "--trainer.devices", "2",
                       "--trainer.strategy", "ddp_fork"], cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # Python 3.13+ runs a forked rank's atexit hooks: wandb's closed its service before tinylm ended the run
    assert "could not end the run cleanly" not in done.stderr, done.stderr[-3000:]
    debug = (tmp_path / "runs" / "wb" / "wandb" / "latest-run" / "logs" / "debug.log").read_text()
    assert "exitcode: 0" in debug, debug[-3000:]  # the run was ended (and marked finished), not abandoned
    files = list((tmp_path / "runs" / "wb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1 and files[0].read_bytes().count(b"train/loss") >= 4, [f.stat().st_size for f in files]


def test_a_branch_gets_its_own_wandb_run_and_a_resume_without_wandb_keeps_the_id(no_wandb_account, tmp_path,
                                                                                   run_config):
    """Catches a branch into a new folder (--ckpt_path X --run.name NEW) logging into its parent's W&B run (its steps
    logged there a second time, the run renamed), and a resume with --run.wandb_project null saving checkpoints
    without the run's W&B id, so the next resume with W&B started another W&B run."""
    import torch

    def wandb_id(path):
        return torch.load(path, weights_only=True)["tinylm"]["wandb_id"]

    run_config(name="c.yaml", run={"name": "wb", "wandb_project": "tinylm-test", "checkpoint_every": 2,
                                   "keep_checkpoints": -1}, model={"n_layer": 1, "decay_steps": 8})
    cli = lightning_main(["fit", "--config", "c.yaml"])
    config = dict(cli.trainer.loggers[0].experiment.config)  # the run's settings beside the model's and data's
    assert (config["trainer"]["max_steps"], config["seed_everything"], config["run"]["name"]) == (2, 7, "wb")
    assert config["n_layer"] == 1 and config["block_size"] == 16
    ckpts = tmp_path / "runs" / "wb" / "checkpoints"
    first = wandb_id(ckpts / "last.ckpt")
    main(["fit", "--config", "c.yaml", "--trainer.max_steps", "4", "--ckpt_path", "last",
          "--run.wandb_project", "null"])
    assert first and wandb_id(ckpts / "last.ckpt") == first
    main(["fit", "--config", "c.yaml", "--trainer.max_steps", "6", "--ckpt_path", "last"])
    assert wandb_id(ckpts / "last.ckpt") == first
    main(["fit", "--config", "c.yaml", "--trainer.max_steps", "4", "--ckpt_path", str(ckpts / "step-2.ckpt"),
          "--run.name", "br"])
    branch = wandb_id(tmp_path / "runs" / "br" / "checkpoints" / "last.ckpt")
    assert branch and branch != first


def test_resumed_csv_keeps_whole_rows_before_the_checkpoint(tmp_path):
    """Catches the resume's cut of metrics.csv keeping a row a crash cut short (without its newline, even one that still
    has every field: "3.41" cut to "3.4", a wrong loss), a row with fewer or more fields than the header, or the rows of
    the checkpoint's own step and after (redone after the resume: logged twice); or dropping a row without a step.
    Resuming at step 3: the rows of steps 0 to 2 stay (a row stores its step - 1)."""
    from tinylm.train.loggers import RunCSVLogger

    folder = tmp_path / "csv"
    folder.mkdir()
    (folder / "metrics.csv").write_text(
        "epoch,step,train/loss,val/loss\n"
        "0,0,4.1,\n"
        "0,,,3.9\n"  # no step: kept
        "0,1,4.0\n"  # a field short
        "0,1,4.0,,7\n"  # a field too many
        "0,2,3.7,\n"
        "0,3,3.6,\n"  # the checkpoint's step: redone
        "0,2,3.4,"  # the last append cut short ("3.41"), of a step before the checkpoint: every field, no newline
    )
    logger = RunCSVLogger(tmp_path, resume_step=3)
    logger.log_metrics({"train/loss": 3.55}, step=3)  # the resumed run's first row
    logger.save()
    assert (folder / "metrics.csv").read_text() == (
        "epoch,step,train/loss,val/loss\n0,0,4.1,\n0,,,3.9\n0,2,3.7,\n,3,3.55,\n")


@pytest.mark.parametrize("text", ["epoch,st", ""], ids=["header-cut", "empty"])
def test_resumed_csv_without_a_whole_header_starts_anew(tmp_path, text):
    """Catches a metrics.csv whose header line a crash cut short failing the resume (or writing rows under a
    broken header): the file is started anew, with the resumed run's header."""
    from tinylm.train.loggers import RunCSVLogger

    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "metrics.csv").write_text(text)
    logger = RunCSVLogger(tmp_path, resume_step=3)
    logger.log_metrics({"train/loss": 3.55}, step=3)
    logger.save()
    assert (tmp_path / "csv" / "metrics.csv").read_text() == "step,train/loss\n3,3.55\n"


def test_a_new_column_never_leaves_metrics_csv_cut(tmp_path, monkeypatch):
    """Catches Lightning's CSV writer rewriting metrics.csv in place when a column first appears (the first
    val/loss, a health alert mid-run): a full disk or a `kill -9` during that rewrite left the header alone, and
    every row logged so far was lost."""
    import csv
    import errno

    from tinylm.train.loggers import RunCSVLogger

    logger = RunCSVLogger(tmp_path)
    logger.log_metrics({"train/loss": 4.1}, step=0)
    logger.save()
    path = tmp_path / "csv" / "metrics.csv"
    before = path.read_text()
    assert before == "step,train/loss\n0,4.1\n"

    def disk_full(self, rows):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(csv.DictWriter, "writerows", disk_full)
    logger.log_metrics({"val/loss": 3.9}, step=1)  # a new column: the file is written again with a wider header
    with pytest.raises(OSError):
        logger.save()
    assert path.read_text() == before


def test_an_offline_run_says_it_in_tinylms_lines_alone(no_wandb_account, run_config, capfd, tmp_path,
                                                       monkeypatch):
    """Catches ~30 lines of wandb's own around an offline run, one of them "set WANDB_MODE=online to enable cloud
    syncing" where credentials were what lacked: tinylm's line says it goes offline and why, and the run's end the
    command that uploads it: its own W&B run's (a shared WANDB_DIR holds other runs' too)."""
    config = run_config(run={"wandb_project": "tinylm-test"})
    main(["fit", "--config", str(config)])
    said = capfd.readouterr()
    assert "wandb:" not in said.err + said.out
    assert re.search(r"W&B: +offline; upload with `wandb sync runs/tiny/wandb/offline-run-\d{8}_\d{6}-\w+`",
                     said.err + said.out), said.err[-3000:]
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "shared"))
    main(["fit", "--config", str(config), "--run.name", "first"])
    capfd.readouterr()
    main(["fit", "--config", str(config), "--run.name", "second", "--run.wandb_project", "null"])  # no W&B run
    said = capfd.readouterr()
    assert "W&B:" not in said.err + said.out  # (it named the first run's folder)


def test_the_end_names_the_offline_run_of_a_users_wandb_logger(no_wandb_account, run_config, capfd, tmp_path):
    """Catches the summary of a run logged by a user's own WandbLogger: wandb wrote its files under the logger's
    save_dir (Lightning's default: ./wandb), and the summary looked for them in the run folder alone and named no
    `wandb sync` command."""
    config = run_config()
    main(["fit", "--config", str(config), "--trainer.logger", "WandbLogger", "--trainer.logger.project", "mine"])
    said = capfd.readouterr()
    assert re.search(r"W&B: +offline; upload with `wandb sync wandb/offline-run-\d{8}_\d{6}-\w+`",
                     said.err + said.out), said.err[-3000:]
    assert not (tmp_path / "runs" / "tiny" / "wandb").exists()


def test_files_moved_aside_in_one_second_keep_names_of_their_own(tmp_path):
    """Catches two metrics.csv moved aside within one second (quick runs one after another in a user's CSVLogger
    folder) renamed to the same metrics.<time>.csv: the second rename replaced the first file."""
    from tinylm.train.loggers import KeptCSVLogger

    for i in range(3):
        logger = KeptCSVLogger(tmp_path, name="l", version="v")
        logger.log_metrics({"x": float(i)}, step=i)
        logger.save()
    assert len(list((tmp_path / "l" / "v").glob("metrics.*.csv"))) == 2


def test_the_offline_parts_to_upload_are_named_whatever_part_came_last(tmp_path):
    """Catches a run whose newest part was logged online (a resume with credentials) hiding its earlier offline
    part, never uploaded, and a part `wandb sync` uploaded already (its .wandb.synced marker) named again."""
    from tinylm.train.loggers import offline_wandb_run

    root = tmp_path / "wandb"
    (root / "offline-run-20260101_000000-abc").mkdir(parents=True)
    (root / "run-20260102_000000-abc").mkdir()
    assert offline_wandb_run(tmp_path, "abc") == root / "offline-run-20260101_000000-abc"
    (root / "offline-run-20260103_000000-abc").mkdir()
    assert offline_wandb_run(tmp_path, "abc") == root / "offline-run-*-abc"
    (root / "offline-run-20260101_000000-abc" / "run-abc.wandb.synced").touch()
    assert offline_wandb_run(tmp_path, "abc") == root / "offline-run-20260103_000000-abc"
    (root / "offline-run-20260103_000000-abc" / "run-abc.wandb.synced").touch()
    assert offline_wandb_run(tmp_path, "abc") is None and offline_wandb_run(tmp_path, "other") is None


def test_a_run_in_a_shared_csv_folder_keeps_the_earlier_runs_settings(tmp_path):
    """Catches a second run into a user's CSVLogger folder (a fixed version) replacing the first's hparams.yaml: its
    metrics.csv was moved aside, its settings lost. Both go aside together, under one time."""
    from tinylm.train.loggers import KeptCSVLogger

    for lr in (0.1, 0.01):
        logger = KeptCSVLogger(tmp_path, name="l", version="v")
        logger.log_hyperparams({"lr": lr})
        logger.log_metrics({"x": lr}, step=0)
        logger.save()
    folder = tmp_path / "l" / "v"
    (aside,) = folder.glob("metrics.*.csv")
    kept = folder / f"hparams.{aside.stem.removeprefix('metrics.')}.yaml"
    assert yaml.safe_load(kept.read_text()) == {"lr": 0.1} and yaml.safe_load((folder / "hparams.yaml").read_text()) \
        == {"lr": 0.01}


def test_a_users_csv_logger_under_home_logs_there(tmp_path, monkeypatch):
    """Catches `--trainer.logger.save_dir=~/lg` (or `save_dir: ~/lg` in a config) ending in a FileNotFoundError
    traceback: Lightning's writer expanded the ~, tinylm wrote the run's mark beside metrics.csv under ./~/lg."""
    from lightning.pytorch.loggers import CSVLogger

    from tinylm.train.loggers import KeptCSVLogger

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    logger = KeptCSVLogger.adopt(CSVLogger("~/lg", version="v"), None, run="runs/a")
    logger.log_metrics({"x": 1.0}, step=0)
    logger.save()
    assert (tmp_path / "home" / "lg" / "lightning_logs" / "v" / "metrics.csv").is_file()
    assert not (tmp_path / "~").exists()


_CSV_HEADER = "epoch,step,train/loss\n"


@pytest.mark.parametrize("body,message", [(b"0,4,4.1\n0,\x80\x81,4.0\n", r"metrics\.csv is not UTF-8 text"),
                                          (b"0,4.0,4.1\n0,9,4.0\n", r"metrics\.csv has a row whose step is '4\.0'")])
def test_a_damaged_metrics_csv_is_refused_naming_the_file_and_kept(tmp_path, body, message):
    """Catches a resume over a csv/metrics.csv another program saved: a non-UTF-8 byte was a UnicodeDecodeError
    traceback, a step written 4.0 the bare `invalid literal for int() with base 10: '4.0'`."""
    path = tmp_path / "metrics.csv"
    path.write_bytes(_CSV_HEADER.encode() + body)
    with pytest.raises(ValueError, match=message):
        _truncate_after(path, 5)
    assert path.read_bytes() == _CSV_HEADER.encode() + body  # left as it was


def test_rows_of_later_steps_are_still_cut(tmp_path):
    """The resume's cut keeps rows up to its step, rows without a step among them."""
    path = tmp_path / "metrics.csv"
    path.write_text(_CSV_HEADER + "0,4,4.1\n0,,\n0,9,4.0\n")
    _truncate_after(path, 5)
    assert path.read_text() == _CSV_HEADER + "0,4,4.1\n0,,\n"


def test_validate_row_into_a_damaged_csv_is_refused_naming_the_file(tmp_path):
    """`tinylm validate` appending its row to a validate/metrics.csv that is not UTF-8 was a UnicodeDecodeError
    traceback (tinylm.evals.results._append)."""
    from tinylm.evals.results import append_row

    path = tmp_path / "metrics.csv"
    path.write_bytes(b"\xff\xfe\x00\x01" * 50)
    with pytest.raises(ValueError, match=r"metrics\.csv is not UTF-8 text"):
        append_row(path, {"step": 1, "val/loss": 2.0})
    assert path.read_bytes() == b"\xff\xfe\x00\x01" * 50


@pytest.mark.parametrize("given", ["ofline", "Online", "bogus"])
def test_a_wandb_mode_wandb_refuses_is_named_in_one_line(no_wandb_account, tmp_path, monkeypatch, given):
    """Catches WANDB_MODE=ofline going unsaid (the run logged offline "without credentials"), and, with a key and a
    server, wandb.init's pydantic traceback (its check is case-sensitive: Online too) after the data was prepared."""
    import os

    from tinylm.errors import TinyLMError

    monkeypatch.setenv("WANDB_MODE", given)
    if given == "Online":  # a key and a server that takes the connection: wandb_mode says online
        from tinylm.train import loggers

        monkeypatch.setenv("WANDB_API_KEY", "ab" * 20)
        monkeypatch.setattr(loggers, "reachable", lambda url: True)
        assert wandb_mode() == "online" and os.environ["WANDB_MODE"] == "online"
        return
    with pytest.raises(TinyLMError, match=f"WANDB_MODE={given}: W&B takes online, offline or disabled"):
        make_loggers(tmp_path / "run", "r", "p")


def test_a_users_offline_wandb_logger_says_it_in_tinylms_line_alone(no_wandb_account, tmp_path, caplog):
    """Catches a user's `--trainer.logger WandbLogger` without credentials going offline in wandb's own ~30 lines, one
    of them "set WANDB_MODE=online to enable cloud syncing" where a key was what lacked, and no tinylm line saying
    why (LightningCLI passes settings=None, as every other argument)."""
    pytest.importorskip("wandb")
    from lightning.pytorch.loggers import WandbLogger

    from tinylm.train.loggers import adopt_users_loggers

    theirs = WandbLogger(project="mine", save_dir=str(tmp_path / "mine"), settings=None)
    with caplog.at_level(logging.INFO, logger="tinylm"):
        adopt_users_loggers([theirs], None, wandb_id=None, resume_step=None, run_dir=tmp_path / "run")
    assert theirs._wandb_init["settings"].silent
    said = [r.getMessage() for r in caplog.records if "offline" in r.getMessage()]
    assert len(said) == 1 and "no W&B credentials" in said[0] and str(tmp_path / "mine" / "wandb") in said[0], said


def test_validate_with_a_users_wandb_logger_logs_offline_without_credentials(no_wandb_account, run_config, capfd,
                                                                              tmp_path):
    """Catches `tinylm validate --trainer.logger WandbLogger` without a key ending in wandb's "No API key configured"
    UsageError traceback (fit's logger went offline; validate's asked wandb to log in)."""
    config = run_config()
    main(["fit", "--config", str(config)])
    capfd.readouterr()
    main(["validate", "--ckpt_path", "runs/tiny/checkpoints/last.ckpt", "--trainer.logger", "WandbLogger",
          "--trainer.logger.project", "mine", "--trainer.logger.save_dir", str(tmp_path / "mine")])
    said = capfd.readouterr()
    assert "W&B logs offline to" in said.err + said.out and "Traceback" not in said.err
    assert list((tmp_path / "mine" / "wandb").glob("offline-run-*"))


def test_no_secret_from_the_environment_is_written_into_a_run_or_an_export(no_wandb_account, tmp_path, run_config,
                                                                             monkeypatch):
    """Guards docs/training.md's "No credential is written anywhere": a run folder, its checkpoints, its offline
    W&B run (the .wandb file, wandb's logs, requirements.txt) and an export are what users attach to issues and
    push to the hub. A key or token read from the environment must be in none of them."""
    secrets = {"WANDB_API_KEY": "dummy-key-123", "HF_TOKEN": "hf_dummy456", "MY_DB_PASSWORD": "pw-secret-789"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_config(name="c.yaml", run={"name": "wb", "wandb_project": "tinylm-test"},
               samples={"every_n_steps": 2, "prompts": ["A"], "max_new_tokens": 4})
    main(["fit", "--config", "c.yaml"])
    if __import__("importlib").util.find_spec("transformers"):
        main(["export", "--ckpt_path", "runs/wb/checkpoints/last.ckpt", "--out", "exported"])
    files = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.suffix == ".wandb" for p in files) and any(p.suffix == ".ckpt" for p in files)  # guard
    leaked = {str(p.relative_to(tmp_path)): name for p in files for name, value in secrets.items()
              if value.encode() in p.read_bytes()}
    assert leaked == {}


def test_two_runs_of_one_process_in_two_folders_keep_their_own_wandb_files(no_wandb_account, tmp_path, run_config,
                                                                           monkeypatch):
    """Catches the second of two `main(["fit", ...])` calls of one process (a notebook's, after os.chdir) having its
    .wandb file written into the first one's folder: wandb's service, started by the first, kept that working folder
    and resolved the run folder's relative path there."""
    config = run_config(run={"name": "wb", "wandb_project": "tinylm-test"})
    for where in ("one", "two"):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        main(["fit", "--config", str(config)])
    for where in ("one", "two"):
        # (wandb.finish returns before W&B's service has written all of the run's file: seen with only its 7-byte
        # header on a loaded machine, whole a moment later)
        deadline = time.monotonic() + 30
        while not ((files := list((tmp_path / where / "runs" / "wb" / "wandb").glob("offline-run-*/run-*.wandb")))
                   and b"train/loss" in files[0].read_bytes()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(files) == 1 and b"train/loss" in files[0].read_bytes(), where


def test_a_callers_process_gets_its_wandb_mode_and_warning_format_back(no_wandb_account, run_config, caplog,
                                                                       monkeypatch):
    """Catches WANDB_MODE left set in a notebook's or script's process by `main(["fit", ...])` with W&B offline
    (tinylm's "offline", Lightning's "dryrun"): every later run of the process logged offline "WANDB_MODE=dryrun",
    also after the user logged in, and so did the caller's own wandb.init; and tinylm's warning format left on the
    caller's own warnings (their file and line gone)."""
    import os
    import warnings

    import tinylm.train.loggers as loggers

    formatwarning = warnings.formatwarning
    config = run_config(run={"name": "w1", "wandb_project": "tinylm-test"})
    main(["fit", "--config", str(config)])
    assert os.environ.get("WANDB_MODE") is None and warnings.formatwarning is formatwarning
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)  # the user logs in
    monkeypatch.setattr(loggers, "reachable", lambda url: False)  # (no network in tests)
    with caplog.at_level(logging.INFO, logger="tinylm"):
        main(["fit", "--config", str(config), "--run.name", "w2"])
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("W&B logs offline to runs/w2")]
    assert len(said) == 1 and "cannot be reached" in said[0], said  # (not "WANDB_MODE=dryrun")


@pytest.mark.parametrize("rewrite", ["new column", "resume cut"])
def test_a_ctrl_c_as_metrics_csv_is_rewritten_keeps_it_and_leaves_no_temp_file(tmp_path, monkeypatch, rewrite):
    """Catches `csv/metrics.csv.tmp` left in the run folder by a Ctrl+C (or a full disk) as metrics.csv is rewritten
    through it (a first val/loss widens the header; a resume cuts the rows after its step): found by a second Ctrl+C
    at that rename in a `tinylm fit`, it stayed there for good when the run had no checkpoint to resume."""
    import os

    from tinylm.train.loggers import _AppendingWriter, _truncate_after

    path = tmp_path / "metrics.csv"
    before = "step,train/loss\n0,1.0\n1,0.9\n"
    path.write_text(before)

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        if rewrite == "new column":
            _AppendingWriter(str(tmp_path))._rewrite_with_new_header(["step", "train/loss", "val/loss"])
        else:
            _truncate_after(path, 1)
    assert path.read_text() == before
    assert not (tmp_path / "metrics.csv.tmp").exists()
