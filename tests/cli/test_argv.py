"""The command line read before jsonargparse parses it (tinylm.cli.argv): every spelling read as jsonargparse reads
it, checked against jsonargparse itself; and the early "in use" check finding a resume's own run folder."""

import fcntl
import warnings

import pytest
import yaml

from tinylm.cli.argv import (
    config_files,
    expand_home,
    is_value,
    numbers_attached,
    options,
    settings,
    spans,
    spelled,
    values,
)
from tinylm.cli.early import check_run_folder_free
from tinylm.errors import TinyLMError

WANTED = {"run.name": "default", "ckpt_path": None}

# (args, run.name as tinylm.cli.argv reads it: None where it does not follow the spelling)
SPELLINGS = [
    (["--run.name", "x"], "x"),
    (["--run.name=x"], "x"),
    (["--run.name", "a", "--run.name=b"], "b"),  # the last one counts
    (["--run.name", "-1"], "-1"),  # a negative number is a value
    (["--run.name", "-1e-3"], "-1e-3"),  # in scientific notation too (once numbers_attached: Python 3.11)
    (["--run.name", "-a b"], "-a b"),  # so is text with a space
    (["--run.name", "-"], "-"),
    (["--run.name=--x"], "--x"),
    (["--run.name", "--x"], None),  # jsonargparse: "expected one argument"
    (["--run.name", "-x"], None),
    (["--run.name"], None),
    (["-c", "a.yaml"], "fromA"),
    (["-c=a.yaml"], "fromA"),
    (["-ca.yaml"], "fromA"),
    (["-c=my a.yaml"], "fromA"),  # a space in the file's name: still the option
    (["-cmy a.yaml"], "fromA"),
    (["--config=my a.yaml"], "fromA"),
    (["--config=a.yaml"], "fromA"),
    (["-c", "a.yaml", "--config", "b.yaml"], "fromB"),  # several: in order
    (["--config=b.yaml", "-c", "a.yaml"], "fromA"),
    (["--run.name", "x", "-c", "a.yaml"], "fromA"),  # a file after a flag overrides it
    (["-c", "a.yaml", "--run.name", "x"], "x"),
    (["--ckpt_path", "last", "--run.name", "x"], "x"),
    (["--conf", "a.yaml"], None),  # abbreviations: expanded by jsonargparse, not followed here
    (["--run.na", "x"], None),
    (["--run", '{"name": "whole"}'], None),  # a whole section
]


def _jsonargparse(args):
    """run.name as a jsonargparse parser like fit's reads ``args``, or None where it refuses them."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    class Run:
        def __init__(self, name: str = "default"):
            pass

    class Model:
        def __init__(self, lr: float = 1e-3):
            pass

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("-c", "--config", action=ActionConfigFile)
    parser.add_class_arguments(Run, "run")
    parser.add_class_arguments(Model, "model")
    parser.add_argument("--ckpt_path", type=str | None, default=None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the deprecation warning of an abbreviated option
            return parser.parse_args(args).run.name
    except Exception:
        return None


@pytest.mark.parametrize(("args", "expected"), SPELLINGS, ids=[" ".join(a) for a, _ in SPELLINGS])
def test_the_reader_reads_every_spelling_as_jsonargparse_does(args, expected, tmp_path, monkeypatch):
    """Catches the early check (and a resume's run folder) reading another run folder than the run then uses: each
    spelling that tinylm.cli.argv follows gives jsonargparse's value, and the ones it does not follow say so (None:
    left to the check after the imports)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text("run:\n  name: fromA\n")
    (tmp_path / "b.yaml").write_text("run:\n  name: fromB\n")
    (tmp_path / "my a.yaml").write_text("run:\n  name: fromA\n")
    found = settings(args, WANTED)
    assert (found and found["run.name"]) == expected
    if expected is not None:
        assert _jsonargparse(numbers_attached(args)) == expected  # the line as tinylm's entry point passes it on


def test_values_config_files_and_negative_numbers():
    """Catches `--model.lr -1` read as a flag with no value, and `-c FILE` missed among several config files."""
    args = ["plot", "--model.lr", "-1", "-c", "a.yaml", "--config=b.yaml", "-cc.yaml", "--json", "--print_config",
            "--x", "--", "--after", "1"]
    assert options(args) == [("model.lr", "-1"), ("config", "a.yaml"), ("config", "b.yaml"), ("config", "c.yaml"),
                             ("json", None), ("print_config", None), ("x", None)]
    assert values(args)["model.lr"] == "-1" and "after" not in values(args)
    assert config_files(args) == ["a.yaml", "b.yaml", "c.yaml"]
    assert [arg for _, _, span in spans(args) for arg in span] == args  # each argument in one span, in order


@pytest.mark.parametrize("arg", ["x", "-1", "-.5", "-2.", "-1e-3", "-1E5", "-1.5e+3", "-", "-a b", "-x", "--x",
                                 "--x=1", "-e3", "-1e", "-1e-3x", "-.e3", "-1.2.3", "-inf"])
def test_is_value_is_jsonargparses_rule(arg):
    """Catches a value read here as the next option (or the other way round) where jsonargparse, given the line as
    tinylm's entry point passes it on (numbers_attached), does otherwise."""
    assert is_value(arg) == (_jsonargparse(numbers_attached(["--run.name", arg])) == arg)


def test_negative_numbers_are_attached_to_their_option_once():
    """Catches `--model.lr -1e-3` (and -1E5, -1.5e+3) ending in argparse's "expected one argument" on Python 3.11
    instead of the range check's line, and the rewrite reaching what is not an option's value: a flag that takes
    none, a value that is not a number, a positional, the arguments after `--`."""
    args = ["plot", "-3", "--model.lr", "-1e-3", "--budget", "-1E5", "--x=-1.5e+3", "--help", "-2", "-c", "-1",
            "--run.name", "-x", "--y", "-1e-3x", "--", "--z", "-1"]
    attached = ["plot", "-3", "--model.lr=-1e-3", "--budget=-1E5", "--x=-1.5e+3", "--help", "-2", "-c", "-1",
                "--run.name", "-x", "--y", "-1e-3x", "--", "--z", "-1"]
    assert numbers_attached(args) == attached
    assert numbers_attached(attached) == attached  # once: a second pass (a rank's own main) changes nothing
    assert options(args)[:2] == options(attached)[:2] == [("model.lr", "-1e-3"), ("budget", "-1E5")]


@pytest.mark.parametrize("value", ["x", "-1", "--x", "-1e-3", "-a b"])
def test_spelled_reads_back_as_its_value(value):
    """Catches a suggested command (lr-find's next:) whose value jsonargparse would take for an option."""
    assert _jsonargparse(spelled("run.name", value)) == value


def test_a_commands_own_options_are_told_from_its_fit_configs_as_jsonargparse_reads_them():
    """Catches plan/lr-find/scaling splitting their arguments by rules of their own: an own option followed by a
    fit option took it as its value (`--gpu --model.lr`: the fit config lost --model.lr), and the options after
    `--` were taken for the command's own."""
    from tinylm.cli.fit_config import split_args

    def plan(fit_args, /, *, gpu: str | None = None, json: bool = False):
        pass

    args = ["-c", "a.yaml", "--gpu", "A100", "--model.lr", "-1", "--json=true", "--gpu", "--model.n_layer", "2",
            "--help", "--print_config", "--", "--gpu", "H100"]
    assert split_args(plan, args) == (["--gpu", "A100", "--json=true", "--gpu", "--help"],
                                      ["-c", "a.yaml", "--model.lr", "-1", "--model.n_layer", "2", "--print_config",
                                       "--", "--gpu", "H100"])


@pytest.mark.parametrize("how", ["path", "last"])
def test_early_check_refuses_the_folder_a_resume_with_no_config_continues(how, tmp_path, monkeypatch):
    """Catches a second `tinylm fit --ckpt_path runs/x/checkpoints/last.ckpt` while the first runs being checked
    against the default folder runs/tinylm before the imports (the refusal came only after them, seconds to minutes
    later): the checkpoint's run folder is checked, as the run itself finds it (`--ckpt_path last --run.name x`
    names it already, and still does)."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "x"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"run": {"name": "x"}}))
    args = ["--ckpt_path", "runs/x/checkpoints/last.ckpt"] if how == "path" else ["--ckpt_path", "last",
                                                                                   "--run.name", "x"]
    check_run_folder_free("fit", args)  # a guard: nothing holds it yet
    with open(run / ".lock", "a+") as held:  # another open file: flock refuses it as it would another process
        held.write("pid 4242")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(TinyLMError, match=r"runs/x is in use by another tinylm process \(pid 4242\)"):
            check_run_folder_free("fit", args)
        check_run_folder_free("fit", [*args, "--run.name", "branch"])  # a branch into a new folder is free


def test_a_tilde_is_expanded_only_in_options_that_take_a_path(monkeypatch):
    """Catches `--ckpt_path=~/runs/x/checkpoints/last.ckpt` (a `~` no shell expands) reported as "not found", and a
    prompt or a run name that starts with `~` taken for a path; and `ENV TINYLM_CACHE_DIR=~/cache` (a Dockerfile's)
    making a folder named `~`."""
    monkeypatch.setenv("HOME", "/h")
    args = ["--ckpt_path=~/r/last.ckpt", "--trainer.default_root_dir", "~/runs", "-c", "~/c.yaml", "--out=~",
            "--prompt", "~/not a path", "--run.name", "~x", "--data.corpus", "[~/a.txt]", "--print_config", "--",
            "--out", "~/after"]
    assert expand_home(args) == ["--ckpt_path=/h/r/last.ckpt", "--trainer.default_root_dir", "/h/runs", "-c",
                                 "/h/c.yaml", "--out=/h", "--prompt", "~/not a path", "--run.name", "~x",
                                 "--data.corpus", "[~/a.txt]", "--print_config", "--", "--out", "~/after"]
    from tinylm.data.prepare import default_cache_dir

    monkeypatch.setenv("TINYLM_CACHE_DIR", "~/cache")  # a Dockerfile's ENV, or quotes, leave the ~ to us
    assert str(default_cache_dir()) == "/h/cache"


def test_a_tilde_is_expanded_in_every_spelling_of_an_option(monkeypatch):
    """Catches `-c~/c.yaml` (argparse's attached short option) and `--config="~/my c.yaml"` (a path with a space)
    left unexpanded: "config file '~/c.yaml' not found", while `-c ~/c.yaml` and `-c=~/c.yaml` were found."""
    monkeypatch.setenv("HOME", "/h")
    args = ["-c~/c.yaml", "--config=~/my c.yaml", "--trainer.default_root_dir=~/my runs", "-c=~/d.yaml", "-cx.yaml"]
    assert expand_home(args) == ["-c/h/c.yaml", "--config=/h/my c.yaml", "--trainer.default_root_dir=/h/my runs",
                                 "-c=/h/d.yaml", "-cx.yaml"]


def test_a_bare_flag_before_an_option_with_an_attached_text_with_a_space_is_true():
    """Catches `tinylm generate --no_cache "--prompt=hello there"` refused with "argument --no_cache: expected one
    argument": the text's space made `--prompt=hello there` look like a value (tinylm.cli.argv.is_value), so no
    `true` was added after the bare flag, while argparse reads an option of the command there."""
    from tinylm.cli.commands import _bare_booleans, generate

    assert _bare_booleans(generate, ["--no_cache", "--prompt=hello there"]) == ["--no_cache", "true",
                                                                                "--prompt=hello there"]
    assert _bare_booleans(generate, ["--no_cache", "a b"]) == ["--no_cache", "a b"]  # a value as before


def test_samples_prompts_on_the_command_line_are_the_texts_typed(run_config, capsys):
    """Catches fit's --samples.prompts read as YAML (jsonargparse's way): `--samples.prompts+ "[END]"` sampled from
    "END", `"- a"` from "a", "Q: x" replaced the config's list with a mapping; `--samples.prompts ROMEO` was refused
    ("expected a list"). A JSON list is still a list."""
    from tinylm.cli import main

    cfg = run_config(samples={"every_n_steps": 0, "prompts": ["ROMEO:"]})

    def prompts(*args: str) -> list[str]:
        with pytest.raises(SystemExit):
            main(["fit", "--config", str(cfg), *args, "--print_config"])
        return yaml.safe_load(capsys.readouterr().out)["samples"]["prompts"]

    assert prompts("--samples.prompts+", "[END]", "--samples.prompts+=- a", "--samples.prompts+", "Q: x") == \
        ["ROMEO:", "[END]", "- a", "Q: x"]
    assert prompts("--samples.prompts", "ROMEO") == ["ROMEO"]
    assert prompts("--samples.prompts", '["a", "b: c"]') == ["a", "b: c"]
    assert prompts("--samples.prompts", "null") is None  # (the default: a fresh document)
