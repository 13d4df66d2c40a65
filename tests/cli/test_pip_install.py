"""A pip user's install: no clone of the repo (the recipes ship inside the package, and a --config that is not there
names them), no extras (a command that needs one ends in one line naming it, before any work), and the install
hint names the package on PyPI."""

import sys
from pathlib import Path

import pytest

import tinylm
from tinylm.cli import main
from tinylm.cli.errors import one_line

REPO = Path(__file__).resolve().parents[2]
PACKAGE = Path(tinylm.__file__).resolve().parent


def test_every_recipe_is_package_data():
    """Catches configs/NAME.yaml missing from the wheel: `pip install tinylm` then `tinylm fit --config ...` had no
    recipe at all (the wheel held only .py files)."""
    tomllib = pytest.importorskip("tomllib")  # (Python 3.11+)
    recipes = sorted(p.name for p in (REPO / "configs").glob("*.yaml"))
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tinylm"]
    shipped = sorted({p.name for g in globs for p in PACKAGE.glob(g)})
    assert recipes and shipped == recipes


@pytest.mark.parametrize("given", ["configs/shakespeare-char-cpu.yaml", "shakespeare-char-cpu.yaml"])
def test_a_recipe_run_outside_a_clone_names_the_installed_copy(given, tmp_path, monkeypatch, capsys):
    """Catches `tinylm fit --config configs/NAME.yaml` (README's command) from a user's own folder answering "pass
    --config PATH to a YAML file such as configs/shakespeare-char-cpu.yaml": the very file it could not find."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["fit", "--config", given])
    err = capsys.readouterr().err.strip().splitlines()
    installed = PACKAGE / "configs" / "shakespeare-char-cpu.yaml"
    assert len(err) == 1 and f"--config {installed}" in err[0], err
    assert installed.is_file()


def test_max_steps_unset_outside_a_clone_names_the_installed_recipes(run_config, capsys):
    """Catches "pass --config configs/NAME.yaml (a recipe)" in a folder that has no configs/ (any pip user's)."""
    config = run_config()  # (tmp_path, the working directory: no configs/ there)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--trainer.max_steps", "-1"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error:" in ln]
    assert len(err) == 1 and f"installed with tinylm in {PACKAGE / 'configs'}" in err[0], err


@pytest.mark.parametrize("flag,value", [("--regex", "[a-z]+"), ("--json_schema", '{"type": "string"}'),
                                        ("--grammar", 'start: "a"')])
def test_constrained_decoding_without_llguidance_is_one_line(flag, value, tmp_path, monkeypatch, capsys):
    """Catches `tinylm generate --regex ...` without llguidance ending in an ImportError traceback (tinylm[grammar]
    is an extra: a pip user does not have it)."""
    monkeypatch.setitem(sys.modules, "llguidance", None)  # `import llguidance` raises ModuleNotFoundError
    with pytest.raises(SystemExit) as e:
        main(["generate", "--ckpt_path", str(tmp_path / "x.ckpt"), "--prompt", "a", flag, value])
    assert e.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'tinylm[grammar]'" in err[0] and "Traceback" not in err[0], err


def test_a_missing_yaml_names_pyyaml():
    """Catches "No module named 'yaml'; this command needs it: pip install yaml" (that installs no PyYAML)."""
    line = one_line(ModuleNotFoundError("No module named 'yaml'", name="yaml"))
    assert line.endswith("this command needs it: pip install pyyaml"), line
    line = one_line(ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"))
    assert line.endswith("pip install 'tinylm[plots]' (or pip install matplotlib)"), line


def test_scaling_without_matplotlib_is_refused_before_training(run_config, tmp_path, monkeypatch, capsys):
    """Catches `tinylm scaling` with its default --out training every rung of the ladder (minutes to hours), writing
    the JSON, and only then ending in "No module named 'matplotlib'" with no table printed: --out was checked before
    the ladder only when given."""
    config = run_config()
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + [
            "matplotlib", "matplotlib.backends.backend_agg", "matplotlib.figure", "matplotlib.ticker"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(SystemExit):
        main(["scaling", "--config", str(config), "--budget", "1e8", "--sizes", "[[1,8],[1,12],[1,16]]",
              "--predict", "[1,20]", "--head_size", "4"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("tinylm scaling: error:")]
    assert len(err) == 1 and "tinylm[plots]" in err[0], err
    assert not (tmp_path / "runs").exists()  # no rung trained


@pytest.mark.parametrize("given", ["shakespeare-char-cpu", "shakespeare-char-cpu.yaml"])
def test_a_recipe_named_without_its_folder_in_a_clone_names_the_clones_copy(given, tmp_path, monkeypatch, capsys):
    """Catches `tinylm fit --config shakespeare-char-cpu` in a clone answering with the package's path
    (tinylm/configs/..., a link into configs/) instead of the configs/NAME.yaml the README's commands use."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "shakespeare-char-cpu.yaml").write_text("seed_everything: 1\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["fit", "--config", given])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("did you mean --config configs/shakespeare-char-cpu.yaml?"), err
