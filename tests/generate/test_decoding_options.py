"""The decoding options: declared once (SamplingConfig), taken by the library's `generate`, `tinylm generate`,
fit's `--samples.*` and `tinylm sample-report` with their own defaults and spellings."""

import inspect
import re
import typing
import warnings

import pytest

from tinylm.cli import main
from tinylm.cli.commands import generate as generate_command
from tinylm.cli.commands import parser_for
from tinylm.cli.commands import sample_report as report_command
from tinylm.generate import SamplingConfig, generate
from tinylm.generate.config import Spelling, check_options
from tinylm.generate.options import field_docs
from tinylm.train.samples import SampleText

SURFACES = {"library": generate, "generate": generate_command, "samples": SampleText.__init__,
            "sample-report": report_command}


def _help(parser, flag: str) -> str:
    action = next(a for a in parser._actions if flag in a.option_strings)
    return " ".join(action.help.split())


@pytest.mark.parametrize("surface", SURFACES)
def test_every_surface_takes_types_and_help_from_sampling_config(surface):
    """Catches a decoding option typed or documented a second time on one surface (the copies drifted: generate's
    --top_k said "default 4", fit's said 200 and another thing): each option's type is SamplingConfig's unless the
    surface narrows it on purpose, and its help is SamplingConfig's docstring unless the surface says more."""
    fn = SURFACES[surface]
    params = inspect.signature(fn).parameters
    types = typing.get_type_hints(SamplingConfig)
    own = {"samples": {"seed": int}, "sample-report": {"seed": int}}.get(surface, {})  # never null: resume, seed+i
    options = fn.options.fields
    assert len(options) >= (17 if surface == "library" else 2)  # guard: the surface does take options
    for param, field in options.items():
        assert params[param].annotation == own.get(field, types[field]), (surface, param)
    assert "Option(" not in str(inspect.signature(fn))  # every placeholder default was filled in


def test_help_lines_are_sampling_configs_docstrings():
    """Catches `tinylm generate --help` describing an option otherwise than the library does."""
    docs = field_docs()
    gen = parser_for(generate_command, "tinylm generate")
    assert _help(gen, "--top_p").startswith(docs["top_p"])
    assert _help(gen, "--num_beams") == docs["num_beams"] and gen.get_defaults().num_beams == 4  # its own default
    assert _help(gen, "--stop").startswith("Stop a sample at this string")  # generate's own: escapes, --stop+


def test_fit_help_shows_the_same_docstrings(capsys, config):
    """Catches fit's --samples.* help drifting from SamplingConfig's (it was typed a third time in SampleText)."""
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for field in ("top_p", "typical_p", "repetition_penalty", "no_repeat_ngram_size"):
        assert f"--samples.{field} " in out and field_docs()[field] in out, field
    assert "--samples.strategy {greedy,sample,beam,contrastive}" in out  # the choices, from the one Literal


@pytest.mark.parametrize("spell, want", [
    (Spelling(), r"^top_p must be in \(0, 1\], got 0$"),
    (Spelling("--{}"), r"^--top_p must be in \(0, 1\], got 0$"),
    (Spelling("samples.{}"), r"^samples\.top_p must be in \(0, 1\], got 0$"),
])
def test_bad_values_are_named_as_each_surface_spells_them(spell, want):
    """Catches an error naming `top_p` where the user typed `--top_p` or `samples.top_p`."""
    with pytest.raises(ValueError, match=want):
        check_options({"top_p": 0}, spell)


def test_hints_name_the_surfaces_own_flags():
    """Catches fit's errors pointing at `--strategy` (an option of generate, not of fit) or at `--stop` for the
    library's stop_strings."""
    samples, cli = Spelling("samples.{}"), Spelling("--{}", {"stop_strings": "stop"})
    with pytest.raises(ValueError, match=r"^samples\.num_beams=2 needs the beam strategy \(--samples\.strategy "
                                         r"beam\), got samples\.strategy 'greedy'$"):
        check_options({"strategy": "greedy", "num_beams": 2}, samples)
    with pytest.raises(ValueError, match=r"^--stop must be non-empty strings, got \[''\]$"):
        check_options({"stop_strings": [""]}, cli)
    with pytest.raises(ValueError, match=r"\(--strategy greedy\)$"):
        check_options({"temperature": 0.0}, cli)
    with pytest.raises(ValueError, match=r"^samples\.top_p must be in \(0, 1\], got 0$"):
        SampleText(top_p=0)


def test_library_generate_keeps_its_keywords_and_refuses_unknown_ones():
    """Catches the derived signature dropping an option (or accepting a misspelled one silently)."""
    params = inspect.signature(generate).parameters
    fields = list(typing.get_type_hints(SamplingConfig))
    assert [p for p in params if p in fields] == fields
    assert params["decode"].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError, match="top_q"):
        generate(None, [[1]], top_q=0.9)


@pytest.fixture
def config(run_config):
    return run_config(samples={"every_n_steps": 0})


def test_generate_names_a_bad_value_before_loading_the_checkpoint(capsys, tmp_path):
    """Catches `tinylm generate --top_p 0` naming `top_p` (there is no such flag: it is --top_p), and only after
    loading the checkpoint (minutes for a big one) or after failing to find it."""
    with pytest.raises(SystemExit):
        main(["generate", "--ckpt_path", str(tmp_path / "missing.ckpt"), "--top_p", "0"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.search(r"--top_p must be in \(0, 1\], got 0\.0$", line), line


def test_stop_strings_are_taken_as_typed(capsys, tmp_path):
    """Catches `--stop "[END]"` stopping at "END" (jsonargparse read a text option's value as YAML: a list), and a
    `--stop+ "Q: x"` replacing the stop strings before it; `--stop+ ""` makes the line show what was read."""
    with pytest.raises(SystemExit):
        main(["generate", "--ckpt_path", str(tmp_path / "missing.ckpt"), "--stop", "[END]", "--stop+", "Q: x",
              "--stop+", ""])
    assert "--stop must be non-empty strings, got ['[END]', 'Q: x', '']" in capsys.readouterr().err


def test_a_value_starting_with_a_dash_is_shown_after_an_equals_sign(capsys, tmp_path):
    """Catches `--prompt "-x"` ending in argparse's bare "argument --prompt: expected one argument", which does not
    say that the value was read as an option nor how to give it (`--prompt=-x`)."""
    with pytest.raises(SystemExit):
        main(["generate", "--ckpt_path", str(tmp_path / "missing.ckpt"), "--stop+", "-x"])
    assert capsys.readouterr().err.strip().endswith("a value that starts with '-' goes after '=': --stop+=-x")


def test_sample_report_names_its_flags(capsys, tmp_path):
    """Catches sample-report's max_new_tokens range being typed a second time, and named without its dashes."""
    with pytest.raises(SystemExit):
        main(["sample-report", "--ckpt_path", str(tmp_path / "x.ckpt"), "--out", str(tmp_path / "r"),
              "--max_new_tokens", "0"])
    assert "--max_new_tokens must be a whole number in [1, 1000000], got 0" in capsys.readouterr().err


class _Terminal:
    def isatty(self) -> bool:
        return True


def test_a_prompt_file_that_cannot_be_the_prompt_is_one_line_before_loading(capsys, tmp_path, monkeypatch):
    """Catches `--prompt_file` turning a missing, binary, undecodable or empty file, both --prompt and
    --prompt_file, or `-` on a terminal (a hang, waiting for typed text) into a traceback, a silent prompt or a
    wait; each is one line naming the file, before the checkpoint is loaded."""
    (tmp_path / "bad.txt").write_bytes(b"ab\xff")
    (tmp_path / "nul.bin").write_bytes(b"PK\x00\x01")
    (tmp_path / "empty.txt").write_bytes(b"\n")
    (tmp_path / "ok.txt").write_text("ROMEO:")
    monkeypatch.setattr("sys.stdin", _Terminal())
    cases = {
        "missing.txt": "--prompt_file 'missing.txt' cannot be read (No such file or directory)",
        "bad.txt": r"--prompt_file 'bad.txt' is not UTF-8 text (byte b'\xff' at byte 2",
        "nul.bin": "--prompt_file 'nul.bin' is a binary file (a NUL byte at character 2)",
        "empty.txt": "--prompt_file 'empty.txt' is empty",
        "-": "--prompt_file - reads the prompt from standard input, which is a terminal; pipe the text in",
    }
    monkeypatch.chdir(tmp_path)
    for name, want in {**cases, "ok.txt": "--prompt and --prompt_file 'ok.txt' both give the prompt; give one"}.items():
        with pytest.raises(SystemExit) as e:
            main(["generate", "--ckpt_path", "missing.ckpt", "--prompt_file", name,
                  *(["--prompt", "x"] if name == "ok.txt" else [])])
        line = capsys.readouterr().err.strip()
        assert e.value.code == 1 and want in line and "\n" not in line, (name, line)


def test_draft_tokens_without_a_drafter_are_named_in_a_warning(tmp_path):
    """Catches `--num_draft_tokens 9` with no draft checkpoint and no prompt lookup accepted without a word (it does
    nothing), as an option of another strategy is named; on generate, sample-report and fit's samples."""
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    for command in (["generate", "--ckpt_path", str(junk)],
                    ["sample-report", "--ckpt_path", str(junk), "--out", str(tmp_path / "r")]):
        for extra, warned in ((["--num_draft_tokens", "9"], True), (["--num_draft_tokens", "9", "--prompt_lookup",
                                                                     "2"], False), ([], False)):
            with warnings.catch_warnings(record=True) as said, pytest.raises(SystemExit):
                warnings.simplefilter("always")
                main([*command, *extra])  # (no checkpoint: the warning comes before one is loaded)
            said = [str(w.message) for w in said]
            assert ("--num_draft_tokens does nothing without a drafter (it shapes speculative decoding: "
                    "--draft_ckpt_path or --prompt_lookup N)" in said) == warned, (command, extra, said)
    with pytest.warns(UserWarning, match=r"^samples\.num_draft_tokens does nothing without a drafter"):
        SampleText(num_draft_tokens=9)


def test_beam_options_no_beam_can_use_are_named():
    """Catches `tinylm generate --strategy beam --length_penalty 3 --early_stopping true` on a char model printing
    the same text as without them and no word: with no end-of-text token (nor stop string, nor constraint) every
    beam runs to max_new_tokens, so none is ranked by its length or stops the search early."""
    from tinylm.generate.config import idle_beam_options

    beam = {"strategy": "beam", "num_beams": 2, "length_penalty": 3.0, "early_stopping": True}
    assert idle_beam_options(beam, tokenizer="char").startswith("length_penalty and early_stopping do nothing here")
    assert idle_beam_options({**beam, "eos_id": 0}) is None
    assert idle_beam_options({**beam, "stop_strings": ["\n"]}) is None
    assert idle_beam_options({**beam, "regex": "[a-z]+"}) is None
    assert idle_beam_options({"strategy": "beam", "num_beams": 2}) is None
    assert idle_beam_options({**beam, "strategy": "sample"}) is None
