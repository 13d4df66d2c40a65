"""Artifacts from someone else: a shared checkpoint or run folder must not run code named in it."""

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tinylm.cli import main

POPEN = {"class_path": "subprocess.Popen", "init_args": {"args": "touch PWNED", "shell": True}}


def _trained(run_config):
    main(["fit", "--config", str(run_config())])
    return "runs/tiny/checkpoints/last.ckpt"


def test_a_shared_checkpoints_kept_config_runs_no_command(run_config, tmp_path, capsys):
    """Catches `tinylm fit --ckpt_path shared.ckpt --run.name mine` building the classes that the config text inside
    the checkpoint names: a {class_path: subprocess.Popen} under an Any-typed argument (RichProgressBar's
    console_kwargs) ran the file's shell command."""
    last = _trained(run_config)
    ckpt = torch.load(last, weights_only=True)
    cfg = yaml.safe_load(ckpt["tinylm"]["config"])
    cfg["trainer"]["callbacks"] = [{"class_path": "lightning.pytorch.callbacks.RichProgressBar",
                                    "init_args": {"console_kwargs": {"file": POPEN}}}]
    ckpt["tinylm"]["config"] = yaml.safe_dump(cfg)
    (tmp_path / "shared").mkdir()
    torch.save(ckpt, tmp_path / "shared" / "x.ckpt")
    with pytest.raises(SystemExit):
        main(["fit", "--ckpt_path", "shared/x.ckpt", "--run.name", "mine", "--trainer.max_steps", "4"])
    assert not (tmp_path / "PWNED").exists()
    assert "subprocess.Popen" in capsys.readouterr().err


@pytest.mark.parametrize("callbacks", [
    [{"class_path": "lightning.pytorch.callbacks.LambdaCallback", "init_args": {"on_fit_start": "builtins.print"}}],
    # a Lightning callback of a Callable argument: ThroughputMonitor called builtins.print with every batch
    [{"class_path": "lightning.pytorch.callbacks.ThroughputMonitor", "init_args": {"batch_size_fn": "builtins.print"}}],
    ["cb.yaml"],  # the same, from a file beside the record (jsonargparse reads a path as the option's settings)
])
def test_a_shared_run_folders_record_calls_no_function(run_config, tmp_path, capsys, callbacks):
    """Catches a shared run folder's config.yaml, read by `tinylm fit --ckpt_path RUN/checkpoints/last.ckpt` without
    --config, naming a function the run calls (LambdaCallback's on_fit_start: builtins.print was called with the
    Trainer and the model)."""
    _trained(run_config)
    shutil.copytree(tmp_path / "runs" / "tiny", tmp_path / "shared")
    record = yaml.safe_load((tmp_path / "shared" / "config.yaml").read_text())
    record["trainer"]["callbacks"] = callbacks
    (tmp_path / "shared" / "config.yaml").write_text(yaml.safe_dump(record))
    (tmp_path / "shared" / "cb.yaml").write_text(yaml.safe_dump(
        {"class_path": "lightning.pytorch.callbacks.LambdaCallback", "init_args": {"on_fit_start": "builtins.print"}}))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["fit", "--ckpt_path", "shared/checkpoints/last.ckpt", "--run.name", "mine", "--trainer.max_steps", "4"])
    out, err = capsys.readouterr()
    assert "Trainer object" not in out
    assert "--config FILE" in err


@pytest.mark.parametrize("edit", ["vocab_size", "block_size", "expanded"])  # (n_layer 10**6: the same check, slow)
def test_a_checkpoint_naming_a_huge_model_is_refused_before_it_is_built(run_config, tmp_path, edit):
    """Catches a checkpoint whose hyperparameters name a model far larger than its weights (vocab_size 10**12;
    block_size 10**12, a learned position table of that many rows; n_layer 10**6: minutes of building and tens of
    GB; or a 145 KB file whose embedding is an expanded view of 10**12 rows): load_model built that model first, and
    ended in an allocation traceback or took the memory."""
    from tinylm.checkpoint import CheckpointError, load_model

    ckpt = torch.load(_trained(run_config), weights_only=True)
    if edit == "expanded":
        rows = 10**12
        ckpt["hyper_parameters"]["vocab_size"] = rows
        ckpt["hyper_parameters"]["pad_vocab_multiple"] = 1
        ckpt["state_dict"]["model.transformer.wte.weight"] = torch.zeros(32).expand(rows, 32)
    else:
        ckpt["hyper_parameters"][edit] = 10**12
    torch.save(ckpt, tmp_path / "x.ckpt")
    with pytest.raises(CheckpointError, match="x.ckpt"):
        load_model(tmp_path / "x.ckpt")


def test_a_shared_run_folder_resumed_removes_no_file_outside_its_checkpoints(run_config, tmp_path):
    """Catches a resume of a shared run folder deleting the files and folders its checkpoint's state names: the kept
    step-N list (run.keep_checkpoints trimmed it with no check), best.ckpt's and last.ckpt's (Lightning's check, on
    the path as written, took ``<checkpoints>/../../x`` for a file of the folder)."""
    main(["fit", "--config", str(run_config(run={"checkpoint_every": 2, "keep_checkpoints": 2},
                                            trainer={"max_steps": 4}))])
    shutil.copytree(tmp_path / "runs" / "tiny", tmp_path / "shared")
    ckpts, mine = (tmp_path / "shared" / "checkpoints").resolve(), tmp_path / "mine"
    (mine / "folder").mkdir(parents=True)
    for name in ("thesis.txt", "folder/a.txt", "lexical.txt", "best.txt", "last.txt"):
        (mine / name).write_text(name)
    ckpt = torch.load(ckpts / "last.ckpt", weights_only=True)
    up = str(tmp_path / "runs" / "tiny" / "checkpoints") + "/../../mine/"  # (in the folder as written; moved)
    for key, state in ckpt["callbacks"].items():
        if key.startswith("PeriodicCheckpoint"):
            state["best_k_models"].update({str(mine / "thesis.txt"): torch.tensor(-3), str(mine / "folder"):
                                           torch.tensor(-2), up + "lexical.txt": torch.tensor(-1)})
            state["last_model_path"] = up + "last.txt"
        elif key.startswith("BestCheckpoint"):
            state["best_k_models"] = {up + "best.txt": torch.tensor(99.0)}
            state["kth_best_model_path"], state["best_model_score"] = up + "best.txt", torch.tensor(99.0)
    torch.save(ckpt, ckpts / "last.ckpt")
    (ckpts / "best.ckpt").unlink()  # (else the resume takes that file's score, and its path, instead of the state's)
    main(["fit", "--ckpt_path", "shared/checkpoints/last.ckpt", "--trainer.max_steps", "6"])
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*.txt")) == [
        "best.txt", "folder/a.txt", "last.txt", "lexical.txt", "thesis.txt"]
    assert sorted(p.name for p in ckpts.glob("step-*.ckpt")) == ["step-4.ckpt", "step-6.ckpt"]  # its own, trimmed
    assert (ckpts / "best.ckpt").is_file() and (ckpts / "last.ckpt").is_file()


@pytest.mark.parametrize("name", [".lock", "samples.txt"])
def test_a_shared_run_folders_links_are_not_written_through(run_config, tmp_path, name):
    """Catches a resume in a shared run folder writing through its links: `.lock` (the pid written over the file it
    points to) and `samples.txt` (cut back to the checkpoint's size, then appended to) changed a file outside the
    run folder, e.g. `samples.txt -> ../../README.md`, the user's project file."""
    main(["fit", "--config", str(run_config(samples={"every_n_steps": 1, "max_new_tokens": 3}))])
    shutil.copytree(tmp_path / "runs" / "tiny", tmp_path / "shared")
    (tmp_path / "shared" / ".lock").unlink(missing_ok=True)
    (tmp_path / "shared" / name).unlink(missing_ok=True)
    (tmp_path / "README.md").write_text("the user's own file\n")
    (tmp_path / "shared" / name).symlink_to("../README.md")
    main(["fit", "--ckpt_path", "shared/checkpoints/last.ckpt", "--trainer.max_steps", "4"])
    assert (tmp_path / "README.md").read_text() == "the user's own file\n"


def test_validate_does_not_append_through_a_shared_folders_link(run_config, tmp_path):
    """Catches `tinylm validate` of a shared run folder whose `validate` is a link to a folder elsewhere: its row was
    appended to the metrics.csv there, outside the run folder."""
    _trained(run_config)
    shutil.copytree(tmp_path / "runs" / "tiny", tmp_path / "shared")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "metrics.csv").write_text("the user's own file\n")
    (tmp_path / "shared" / "validate").symlink_to("../elsewhere")
    main(["validate", "--ckpt_path", "shared/checkpoints/last.ckpt"])
    assert (tmp_path / "elsewhere" / "metrics.csv").read_text() == "the user's own file\n"


def test_a_run_trained_with_a_callback_of_the_users_own_validates_without_config(run_config, tmp_path):
    """Catches `tinylm validate --ckpt_path runs/NAME/checkpoints/best.ckpt` (the run's summary advises it) refused for
    a run trained with `--trainer.callbacks mymod.MyCallback`: "may name only Lightning's, torch's and tinylm's
    classes", though validate leaves the run's callbacks and loggers out and builds none of them."""
    _trained(run_config)
    record_path = tmp_path / "runs" / "tiny" / "config.yaml"
    record = yaml.safe_load(record_path.read_text())
    record["trainer"]["callbacks"] = [{"class_path": "mymod.MyCallback", "init_args": {"out": "mine.txt"}}]
    record["trainer"]["logger"] = [{"class_path": "mymod.MyLogger"}]
    record_path.write_text(yaml.safe_dump(record))
    main(["validate", "--ckpt_path", "runs/tiny/checkpoints/best.ckpt"])
    assert (tmp_path / "runs" / "tiny" / "validate" / "metrics.csv").is_file()


def test_a_run_whose_logger_notes_are_long_text_resumes_without_config(run_config, tmp_path):
    """Catches the kept-settings check taking every trainer.* text for a possible file name: a run's own config.yaml
    with a logger's free text over 255 bytes (W&B notes) ended `tinylm fit --ckpt_path last` in "file name too long;
    choose a shorter name"."""
    _trained(run_config)
    record = yaml.safe_load((tmp_path / "runs" / "tiny" / "config.yaml").read_text())
    record["trainer"]["logger"] = {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                   "init_args": {"save_dir": "logs", "name": "n " * 150}}  # 300 bytes, no slash
    from tinylm.cli.run_folder import check_kept_classes

    check_kept_classes(record, "runs/tiny/config.yaml", folder=tmp_path / "runs" / "tiny")


@pytest.mark.parametrize("name", ["test.run", "json.v2", "random.init"])
def test_a_loggers_name_that_looks_like_an_import_path_is_text(name):
    """Catches the kept-settings check taking a logger's name for a function by import path: a run's own
    config.yaml with `--trainer.logger CSVLogger --trainer.logger.name test.run` (`test` is a module of the standard
    library) ended `tinylm fit --ckpt_path runs/x/checkpoints/last.ckpt` and `tinylm validate` in "a function by
    import path", though CSVLogger's name is a str that jsonargparse never imports (only Callable-typed arguments
    such as ThroughputMonitor's batch_size_fn are, and those stay refused)."""
    from tinylm.cli.run_folder import check_kept_classes
    from tinylm.errors import TinyLMError

    logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": "logs", "name": name}}
    check_kept_classes({"trainer": {"logger": [logger]}}, "runs/x/config.yaml")
    monitor = {"class_path": "lightning.pytorch.callbacks.ThroughputMonitor", "init_args": {"batch_size_fn": name}}
    with pytest.raises(TinyLMError, match="function by import path"):
        check_kept_classes({"trainer": {"callbacks": [monitor]}}, "runs/x/config.yaml")
    typed_a_class = {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"experiment": name}}
    with pytest.raises(TinyLMError, match="function by import path"):  # (a class type: jsonargparse may import it)
        check_kept_classes({"trainer": {"logger": [typed_a_class]}}, "runs/x/config.yaml")


def test_a_checkpoint_naming_a_users_own_callback_says_how_to_pass_its_settings(run_config, tmp_path, capsys,
                                                                               monkeypatch):
    """Catches the refusal of a checkpoint alone (copied out of its run folder) whose kept config names the user's
    own callback (`--trainer.callbacks+=mypkg.LossEMA`) saying "pass its settings yourself with --config FILE" with no
    such file anywhere: the settings are inside the checkpoint, and `--print_config` is refused the same way."""
    import subprocess
    import sys

    (tmp_path / "userpkg.py").write_text("import lightning.pytorch as pl\n\nclass Mine(pl.Callback):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ckpt = torch.load(_trained(run_config), weights_only=True)
    cfg = yaml.safe_load(ckpt["tinylm"]["config"])
    cfg["trainer"]["callbacks"] = [{"class_path": "userpkg.Mine"}]
    ckpt["tinylm"]["config"] = yaml.safe_dump(cfg)
    torch.save(ckpt, tmp_path / "x.ckpt")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["fit", "--ckpt_path", "x.ckpt", "--run.name", "mine", "--trainer.max_steps", "4"])
    err = capsys.readouterr().err
    assert "userpkg.Mine" in err and "python -c" in err, err
    command = err[err.index("python -c"):err.index(" > run.yaml")]
    subprocess.run(command.replace("python", sys.executable, 1), shell=True, check=True,
                   stdout=(tmp_path / "run.yaml").open("w"))
    main(["fit", "--config", "run.yaml", "--ckpt_path", "x.ckpt", "--run.name", "mine", "--trainer.max_steps", "4"])
    assert (tmp_path / "runs" / "mine" / "checkpoints" / "last.ckpt").exists()


def test_a_function_passed_through_a_trusted_classs_kwargs_stays_refused():
    """Catches a run's config.yaml naming `builtins.print` (any function) as WeightAveraging's multi_avg_fn accepted
    as text because WeightAveraging takes it by `**kwargs: Any`: jsonargparse types it as AveragedModel's Callable,
    imports it, and the run called it at every step."""
    from tinylm.cli.run_folder import check_kept_classes
    from tinylm.errors import TinyLMError

    for key in ("multi_avg_fn", "avg_fn"):
        averaging = {"class_path": "lightning.pytorch.callbacks.WeightAveraging", "init_args": {key: "builtins.print"}}
        with pytest.raises(TinyLMError, match="function by import path"):
            check_kept_classes({"trainer": {"callbacks": [averaging]}}, "runs/x/config.yaml")
    # text that the kwargs take as text stays text (W&B's group and notes reach wandb.init's str parameters)
    logger = {"class_path": "lightning.pytorch.loggers.WandbLogger", "init_args": {"group": "test.run"}}
    check_kept_classes({"trainer": {"logger": [logger]}}, "runs/x/config.yaml")


def test_the_command_that_writes_a_checkpoints_settings_runs_whatever_its_path(run_config, tmp_path, capsys):
    """Catches the `python -c "..."` of that refusal with the path as Python's repr inside double quotes: a folder
    named `bob's` made it `torch.load("bob's/x.ckpt")` and the shell stopped at the quote ("unexpected EOF"); `$` or
    a backquote in it were expanded by the shell."""
    import subprocess
    import sys

    ckpt = torch.load(_trained(run_config), weights_only=True)
    cfg = yaml.safe_load(ckpt["tinylm"]["config"])
    cfg["trainer"]["callbacks"] = [{"class_path": "userpkg.Mine"}]
    ckpt["tinylm"]["config"] = yaml.safe_dump(cfg)
    (tmp_path / "bob's $HOME `x`").mkdir()
    torch.save(ckpt, tmp_path / "bob's $HOME `x`" / "x.ckpt")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["fit", "--ckpt_path", "bob's $HOME `x`/x.ckpt", "--run.name", "mine", "--trainer.max_steps", "4"])
    err = capsys.readouterr().err
    command = err[err.index("python -c"):err.index(" > run.yaml")]
    done = subprocess.run(command.replace("python", sys.executable, 1), shell=True, capture_output=True, text=True,
                          cwd=tmp_path, executable="/bin/bash")
    assert done.returncode == 0 and yaml.safe_load(done.stdout)["trainer"]["callbacks"], done.stderr


def test_eval_does_not_append_through_a_shared_folders_link(run_config, tmp_path, caplog):
    """Catches `tinylm eval` of a shared run folder whose `eval` is a link to a folder elsewhere: the metrics.csv
    there was rewritten with the scores (its text became the header's first column), as `tinylm validate` no longer
    did."""
    _trained(run_config)
    shutil.copytree(tmp_path / "runs" / "tiny", tmp_path / "shared")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "metrics.csv").write_text("the user's own file\n")
    (tmp_path / "shared" / "eval").symlink_to("../elsewhere")
    evals = Path(__file__).resolve().parents[1] / "fixtures" / "evals"
    main(["eval", "--ckpt_path", "shared/checkpoints/last.ckpt", "--tasks", "winogrande", "--limit", "2",
          "--data_dir", str(evals)])
    assert (tmp_path / "elsewhere" / "metrics.csv").read_text() == "the user's own file\n"
    assert "is a link out of the run folder" in caplog.text
