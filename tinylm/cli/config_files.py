"""The `--config FILE`s of a command line, checked before jsonargparse reads them: it names `<unicode string>`
where the file is meant, keeps the last of two keys without a word, and says "Unexpected config:" of an empty file."""

from __future__ import annotations

import json
from pathlib import Path

from tinylm.cli.table import FIT_GROUPS

RECIPES = Path(__file__).resolve().parents[1] / "configs"  # the recipes, installed with the package


def recipe_example(name: str = "shakespeare-char-cpu") -> str:
    """A recipe's path as a user can pass it here: configs/NAME.yaml in a clone of the repo, else the installed copy."""
    local = Path("configs") / f"{name}.yaml"
    return str(local) if local.is_file() or not (RECIPES / local.name).is_file() else str(RECIPES / local.name)


def _installed_recipe(given: str) -> Path | None:
    """The installed recipe a --config that is not there names (configs/NAME.yaml or NAME.yaml run from outside a
    clone), if there is one."""
    name = Path(given).name
    found = RECIPES / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    return found if found.is_file() else None


class _DuplicateKey(Exception):
    def __init__(self, key: str, lines: tuple[int, int]) -> None:
        super().__init__(key)
        self.key, self.lines = key, lines


def _unique_key_loader():
    """A YAML SafeLoader that refuses a key given twice in one mapping: PyYAML keeps the last silently, and a
    second ``model:`` section appended to a recipe dropped every option of the first (n_layer, n_embd, lr ...).
    Keys merged in with ``<<: *anchor`` may be overridden, as YAML means them to be."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                        continue
                    key, line = self.construct_object(key_node), key_node.start_mark.line + 1
                    if key in seen:
                        raise _DuplicateKey(str(key), (seen[key], line))
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return Loader


def check_read_here(path: str | Path, text: str) -> None:
    """ValueError where jsonargparse, which reads a config file in the locale's encoding, cannot read ``text`` (the
    file's, UTF-8) as it is: text that is not ASCII under LC_ALL=C without UTF-8 mode (PYTHONUTF8=0) ended every
    command in a UnicodeDecodeError traceback, the shipped *-modern.yaml recipes' too (another encoding, e.g.
    Latin-1, would misread it silently)."""
    import codecs
    import locale

    if text.isascii() or (name := codecs.lookup(encoding := locale.getpreferredencoding(False)).name) == "utf-8":
        return
    line = next(n for n, words in enumerate(text.splitlines(), 1) if not words.isascii())
    why = "the C or POSIX locale without UTF-8 mode" if name == "ascii" else "the locale's encoding"  # (Latin-1's)
    raise ValueError(f"config file {str(path)!r} holds text that is not ASCII (line {line}), and Python reads files "
                     f"here as {encoding}, not UTF-8 ({why}); run tinylm with PYTHONUTF8=1 (or LC_ALL=C.UTF-8)")


def check_config_files(args: list[str]) -> None:
    """Every ``--config FILE`` exists, is a regular file and is valid YAML with a mapping at the top; errors name
    the file and the line (jsonargparse would name ``<unicode string>`` instead of the file)."""
    import yaml

    from tinylm.cli.argv import config_files
    from tinylm.paths import missing_path

    loader = _unique_key_loader()
    for p in config_files(args):
        path = Path(p)
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "is not a regular file" if path.exists() else \
                missing_path(path)
            if not path.exists() and (recipe := _installed_recipe(p)) is not None:
                if (Path("configs") / recipe.name).is_file():  # a clone of the repo: its own copy, to edit
                    raise FileNotFoundError(f"config file {p!r} {what}; did you mean --config "
                                            f"configs/{recipe.name}?")
                raise FileNotFoundError(f"config file {p!r} {what}; the recipe {recipe.name} is installed with "
                                        f"tinylm: --config {recipe} (copy it here to change it)")
            raise FileNotFoundError(f"config file {p!r} {what}; pass --config PATH to a YAML file such as "
                                    f"{recipe_example()}")
        try:
            check_read_here(p, text := path.read_text(encoding="utf-8"))
            data = yaml.load(text, Loader=loader)  # noqa: S506 (a SafeLoader)
        except _DuplicateKey as e:
            raise ValueError(f"config file {p!r} sets {e.key!r} twice in one mapping (lines {e.lines[0]} and "
                             f"{e.lines[1]}); YAML would keep only the last and silently drop what the first sets: "
                             "give each key once (merge two sections of one name into one)") from None
        except UnicodeDecodeError:
            raise ValueError(f"config file {p!r} is not UTF-8 text; pass a YAML file") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            tab = " (YAML does not allow tabs for indentation: use spaces)" if "\t" in text else ""
            raise ValueError(f"config file {p!r} is not valid YAML{where}: {problem}{tab}") from None
        if data is None:  # jsonargparse said "Unexpected config:" and nothing more
            raise ValueError(f"config file {p!r} is empty (or only comments); pass a YAML file with sections "
                             f"(trainer:, model:, data:, ...) such as {recipe_example()}")
        if not isinstance(data, dict):
            raise ValueError(f"config file {p!r} must hold a mapping of KEY: VALUE lines (fit's sections trainer:, "
                             f"model:, data:, ...; a command's own options), got a {type(data).__name__}")
        for key, value in data.items():  # `trainer:` with every option commented out is null: a TypeError followed
            # (a section's own file, `model: model.yaml`, is jsonargparse's too: read from this file's folder)
            if key in FIT_GROUPS and not isinstance(value, dict) and \
                    not (isinstance(value, str) and (path.parent / value).is_file()):
                raise ValueError(f"config file {p!r}: section {key}: must hold {key} options indented below it "
                                 f"(e.g. `{key}:` then `  OPTION: VALUE`) or name a YAML file of them beside it, got "
                                 f"{json.dumps(value, default=str)}; delete the line for no options")
