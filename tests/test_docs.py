"""The README and docs/ as a user reads them: every link leads somewhere, and every `tinylm` command they show
still exists with every option it passes (a renamed option or command would leave the docs teaching a line that
fails)."""

import re
import shlex
from pathlib import Path

import pytest

from tinylm.cli import main
from tinylm.cli.table import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(path: Path) -> tuple[str, list[tuple[str, str]]]:
    """The text outside fenced code blocks, and each block as (language, body)."""
    prose, blocks, fence = [], [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        if fence is None and line.startswith("```"):
            fence = (line[3:].strip(), [])
        elif fence is not None and line.startswith("```"):
            blocks.append((fence[0], "\n".join(fence[1])))
            fence = None
        elif fence is not None:
            fence[1].append(line)
        else:
            prose.append(line)
    return "\n".join(prose), blocks


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _blocks(path)[0]
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.MULTILINE)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", _blocks(path)[0])
    return [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+://", m)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_leads_somewhere(doc):
    """Catches a link to a moved file or a renamed section (the README's split into docs/ moved most of them)."""
    broken = []
    for link in _links(doc):
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            broken.append(link)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(link)
    assert not broken, f"{doc.name}: {broken}"


def _commands() -> list[tuple[str, list[str]]]:
    """(doc, argv) of every `tinylm ...` line in the docs' shell blocks (a `$ ` prompt, `\\` continuations and
    trailing comments as a shell reads them)."""
    found = []
    for doc in DOCS:
        for language, block in _blocks(doc)[1]:
            if language not in ("bash", "sh", "console", ""):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith("tinylm ") and not line.split()[1].endswith(":"):  # not an error line shown
                    argv = shlex.split(line, comments=True)[1:]
                    found.append((doc.name, argv))
    return found


_HELP: dict[str, str] = {}


def _help(command: str, capsys) -> str:
    if command not in _HELP:
        with pytest.raises(SystemExit) as e:
            main([command, "--help"])
        assert e.value.code in (0, None)
        _HELP[command] = capsys.readouterr().out
    return _HELP[command]


def test_docs_show_commands():
    """The check below has something to check: the README's tour and the reference pages show commands."""
    names = {argv[0] for _, argv in _commands()}
    assert {"fit", "generate", "plan", "export", "sample-report"} <= names


@pytest.mark.parametrize("doc,argv", _commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_every_documented_command_and_option_exists(doc, argv, capsys):
    """Catches the docs teaching a command or an option that `tinylm COMMAND --help` no longer lists."""
    command = argv[0]
    assert command in COMMANDS, f"{doc}: tinylm {command} is not a command"
    text = _help(command, capsys)
    if "FIT_ARG" in text:  # plan, lr-find, scaling take every `tinylm fit` option beside their own
        text += _help("fit", capsys)
    options = [a.split("=")[0] for a in argv[1:] if a.startswith("--")]
    missing = [o for o in options if not re.search(rf"(^|[\s,\[]){re.escape(o.rstrip('+'))}(\b|[\s,\]])", text,
                                                     flags=re.MULTILINE)]
    assert not missing, f"{doc}: tinylm {' '.join(argv)}: {missing} not in `tinylm {command} --help`"


# (the guide's Trainer keeps logger=True, and tensorboard is not installed: Lightning's note, not the guide's fault)
@pytest.mark.filterwarnings("ignore:Starting from v1.9.0, `tensorboardX` has been removed:UserWarning")
def test_the_python_guide_runs_as_written(tmp_path, monkeypatch, capsys):
    """Catches docs/python.md's example (the library's front door: data module, TinyLM, a plain Trainer,
    load_model, generate) no longer running as written, from a checkout's root."""
    _, blocks = _blocks(ROOT / "docs" / "python.md")
    code = "\n".join(body for lang, body in blocks if lang == "python")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "fixtures").symlink_to(ROOT / "tests" / "fixtures")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/python.md", "exec"), {"__name__": "__docs__"})
    out = capsys.readouterr().out
    loss = float(re.search(r"^val/loss (\S+)$", out, re.M).group(1))
    assert loss < 3.4  # (ln 61 = 4.11 at the start: it learned; ~2.9-3.0 after its 60 steps)
    assert (tmp_path / "runs/python/lightning_logs/version_0/checkpoints/epoch=0-step=60.ckpt").is_file()


def _headings(path: Path) -> list[str]:
    return [line.lstrip("#").strip().lower() for line in path.read_text(encoding="utf-8").splitlines()
            if line.startswith("#")]


def test_a_named_section_of_another_doc_exists():
    """Catches benchmarks.md sending readers to the README's \"Cleaning\" section after the README split moved it."""
    said = re.compile(r"(README|[a-z]+\.md)'s \"([^\"]+)\" section")
    for doc in DOCS:
        for name, section in said.findall(doc.read_text(encoding="utf-8")):
            target = ROOT / "README.md" if name == "README" else ROOT / "docs" / name
            assert any(section.lower() in h for h in _headings(target)), f"{doc.name}: {name} has no {section!r}"


def test_the_readme_plan_command_draws_the_picture_it_shows():
    """Catches the README's `plan --gpu H100` under a picture drawn with the full device name (80 GiB line)."""
    studies = (ROOT / "docs" / "studies.md").read_text(encoding="utf-8")
    drawn_with = re.search(r'GPT-2 small with `(--gpu "[^"]+") --out plan\.png`', studies).group(1)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = next(line for line in readme.splitlines() if line.startswith("tinylm plan ") and "--out plan.png" in line)
    assert drawn_with in command, (command, drawn_with)
