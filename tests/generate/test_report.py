"""sample-report: metric functions by hand, teacher-forced scoring against a plain loop, and the command end to end."""

import json
import math
import re
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tinylm.cli.commands import run as run_command
from tinylm.generate import report
from tinylm.generate.report import (
    STRATEGIES,
    distinct_n,
    ngrams,
    pooled_repetition_rate,
    repetition_rate,
    sample_report,
    score_tokens,
)
from tinylm.generate.strategies import generate
from tinylm.model import GPT, GPTConfig
from tinylm.tokenize.tokenizer import build_tokenizer
from tinylm.train.module import TinyLM


@pytest.fixture(autouse=True)
def _one_thread():
    """2-layer, 32-wide models: intra-op threads only add overhead (10-30x on a busy 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- metrics by hand ---------------------------------------------------------------------------------------------
def test_distinct_n_by_hand():
    """Catches counting unique n-grams over the wrong set (types vs tokens) or n-grams spanning two samples."""
    assert ngrams([1, 2, 3], 2) == [(1, 2), (2, 3)]
    assert distinct_n([[1, 2, 1, 2]], 2) == pytest.approx(2 / 3)  # (1,2) (2,1) (1,2)
    assert distinct_n([[1, 2, 1, 2]], 1) == pytest.approx(2 / 4)
    assert distinct_n([[1, 2], [1, 2]], 2) == pytest.approx(1 / 2)  # pooled: the same bigram twice
    assert distinct_n([[1, 2], [3, 4]], 2) == 1.0
    assert math.isnan(distinct_n([[1], [2]], 2))  # (1, 2) would only exist across the two samples
    with pytest.raises(ValueError, match="n must be >= 1"):
        distinct_n([[1]], 0)


def test_repetition_rate_by_hand():
    """Catches counting the first occurrence as a repeat, ignoring overlapping repeats, or pooling across samples."""
    assert repetition_rate([1, 2, 3, 4, 1, 2, 3, 4]) == pytest.approx(1 / 5)  # 1234 2341 3412 4123 [1234]
    assert repetition_rate([1, 1, 1, 1, 1]) == pytest.approx(1 / 2)  # the 2nd 1111 overlaps the 1st
    assert repetition_rate([1, 2, 3, 4, 5]) == 0.0
    assert repetition_rate([1, 2, 1, 2], n=2) == pytest.approx(1 / 3)
    assert math.isnan(repetition_rate([1, 2, 3]))
    # each sample is checked against itself only: the second 1234 is new in its own sample
    assert pooled_repetition_rate([[1, 1, 1, 1, 1], [1, 2, 3, 4], [1, 1, 1, 1]]) == pytest.approx(1 / 4)


# ---- scoring -------------------------------------------------------------------------------------------------------
def _manual_scores(model: GPT, prompt: list[int], out: list[int]) -> tuple[list[float], list[float]]:
    """Reference: every generated token scored from its own window of the last block_size tokens."""
    ids = prompt + out
    block = model.config.block_size
    nll, ent = [], []
    for j in range(len(prompt), len(ids)):
        start = max(0, j - block)
        kwargs = {"prefix_len": max(0, len(prompt) - start)} if model.config.attn_mask == "prefix" else {}
        logp = model(torch.tensor([ids[start:j]]), **kwargs)[0, -1].log_softmax(-1)  # (V,)
        nll.append(-logp[ids[j]].item())
        ent.append(-(logp.exp() * logp).sum().item())
    return nll, ent


@pytest.mark.parametrize("attn_mask, rows_per_group", [("causal", None), ("prefix", None), ("causal", 2)])
def test_score_tokens_matches_a_plain_loop_past_block_size(attn_mask, rows_per_group, monkeypatch):
    """Catches an off-by-one between logits and targets, scoring the prompt, padding leaking into shorter rows,
    tokens past block_size scored with the wrong window (or prefix) instead of the one generation used, or rows
    lost or reordered when they are scored in groups."""
    if rows_per_group is not None:
        monkeypatch.setattr(report, "SCORE_CHUNK_LOGITS", rows_per_group * 8 * 20)  # T = block 8, V = 20
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=32, attn_mask=attn_mask)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)  # peaked distributions, so a misaligned target changes the numbers a lot
    prompt = [3, 7, 1]
    outputs = [[5, 5, 2, 9, 11], list(range(1, 14)), []]  # 13 new tokens reach 8 past block_size
    nll, ent = score_tokens(model, prompt, outputs)
    assert [len(n) for n in nll] == [5, 13, 0] and [len(e) for e in ent] == [5, 13, 0]
    with torch.no_grad():
        for row, out in enumerate(outputs):
            want_nll, want_ent = _manual_scores(model, prompt, out)
            assert nll[row] == pytest.approx(want_nll, abs=1e-4)
            assert ent[row] == pytest.approx(want_ent, abs=1e-4)
    assert max(max(n) for n in nll if n) > 2 * min(min(n) for n in nll if n)  # not vacuous: the values vary


def test_report_metrics_behave_on_a_peaked_model():
    """Catches scoring the wrong tokens or the wrong prompt: unbiased T=1 samples must have NLL close to the
    model's entropy, truncation/search must push NLL below it, and greedy copies must show no diversity."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=48, block_size=64, n_layer=2, n_head=2, n_embd=32, eos_id=0)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0)

    class IdTokenizer:
        eos_id = 0

        def encode(self, text: str) -> list[int]:
            return [1 + ord(c) % 40 for c in text]

        def decode(self, ids: list[int]) -> str:
            return "".join(chr(97 + i % 26) for i in ids)

    result = sample_report(model, IdTokenizer(), prompts=["", "ab"], num_samples=6, max_new_tokens=20, seed=0)
    s = result["strategies"]
    assert list(s) == [st.name for st in STRATEGIES] and result["prompts"] == ["", "ab"]
    t1 = s["sample T=1.0"]
    assert abs(t1["nll"] - t1["entropy"]) < 0.25 * t1["entropy"]
    for name in ("greedy", "beam 4", "sample T=0.7"):
        assert s[name]["nll"] < s[name]["entropy"] and s[name]["nll"] < t1["nll"], name
    assert s["greedy"]["samples"] == t1["samples"] == 12  # 6 per prompt: greedy's one run counts 6 times
    assert s["greedy"]["distinct_2"] < t1["distinct_2"]
    assert s["rep-penalty 1.3"]["nll"] > t1["nll"]  # it picks tokens the model would not
    greedy = generate(model, [[0]], strategy="greedy", max_new_tokens=20, eos_id=0)[0]
    assert s["greedy"]["example"] == IdTokenizer().decode(greedy)  # the first prompt's first sample


def test_each_prompt_samples_with_its_own_seed():
    """Catches every prompt sampled with the same seed (not seed + i): two identical prompts then gave two
    identical samples, and the pooled diversity of the report read half of what it was."""
    tok = build_tokenizer("char", documents=lambda: ["abcdefghijklmnopqrstuvwxyz .,"])
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=64, n_layer=2, n_head=2, n_embd=32)).eval()
    sample = [st for st in STRATEGIES if st.name == "sample T=1.0"]
    one = sample_report(model, tok, prompts=["ab"], num_samples=1, max_new_tokens=30, seed=0, strategies=sample)
    two = sample_report(model, tok, prompts=["ab", "ab"], num_samples=1, max_new_tokens=30, seed=0, strategies=sample)
    one, two = one["strategies"]["sample T=1.0"], two["strategies"]["sample T=1.0"]
    assert two["distinct_2"] > 0.75 * one["distinct_2"], (one["distinct_2"], two["distinct_2"])


def test_bad_arguments_name_the_fix():
    """Catches silently writing an empty report for num_samples=0, or a crash for a tokenizer with no start token."""
    model = GPT(GPTConfig(vocab_size=4, block_size=8, n_layer=2, n_head=2, n_embd=32)).eval()
    tok = build_tokenizer("char", documents=lambda: ["abca"])  # one document: no <|endoftext|>, no "\n"
    with pytest.raises(ValueError, match=re.escape("num_samples must be a whole number in [1, inf), got 0")):
        sample_report(model, tok, num_samples=0)
    with pytest.raises(ValueError, match="pass a prompt"):
        sample_report(model, tok, num_samples=1)


@pytest.mark.parametrize("kwargs, message", [
    ({"prompts": []}, "prompts is empty: give at least one (e.g. prompts=['ROMEO:']), or None to start every sample "
                      "from a fresh document"),
    ({"num_samples": 2.5}, "num_samples must be a whole number in [1, inf), got 2.5"),
    ({"num_samples": True}, "num_samples must be a whole number in [1, inf), got True"),
])
def test_an_empty_prompt_list_or_a_fractional_sample_count_is_refused(kwargs, message):
    """Catches sample_report(prompts=[]) reporting on the default prompt, as if none were given (the command refuses an
    empty --prompts), num_samples=2.5 ending in a TypeError from range(), and True reported as its number."""
    tok = build_tokenizer("char", documents=lambda: ["abca\n", "b"])
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=8, n_layer=2, n_head=2, n_embd=32)).eval()
    with pytest.raises(ValueError, match=re.escape(message)):
        sample_report(model, tok, **{"prompts": ["a"], "num_samples": 1, "max_new_tokens": 2,
                                     "strategies": STRATEGIES[:2], **kwargs})


def test_write_report_refuses_what_is_no_report_before_making_its_folder(tmp_path):
    """Catches write_report({}, dir) failing with a KeyError after it had made the folder."""
    for bad in ({}, [], {"prompts": []}):
        with pytest.raises(ValueError, match="report must be what sample_report returns; this one has no "):
            report.write_report(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags, message", [(["--max_new_tokens", "0"], "max_new_tokens must be a whole number"),
                                            (["--num_samples", "0"], "num_samples must be a whole number"),
                                            (["--prompts", "[]"], "--prompts is empty: give at least one")])
def test_sizes_are_checked_before_the_checkpoint_is_loaded(tmp_path, flags, message):
    """Catches `sample-report --max_new_tokens 0` loading the checkpoint and starting its progress bar before the
    refusal (here the checkpoint does not exist: the size must be named first), and `--prompts []` reporting on the
    default prompt as if it were not given."""
    with pytest.raises(ValueError, match=message):
        run_command("sample-report", ["--ckpt_path", str(tmp_path / "none.ckpt"), "--out", str(tmp_path / "r"), *flags])


# ---- end to end ----------------------------------------------------------------------------------------------------
def _tiny_checkpoint(path: Path, text: str, seed: int = 0, n_layer: int = 2, n_embd: int = 32) -> Path:
    """A real `trainer.save_checkpoint` file of a 2-layer char model trained 2 steps."""
    tok = build_tokenizer("char", vocab_size=0, documents=lambda: [text])
    torch.manual_seed(seed)
    module = TinyLM(vocab_size=tok.vocab_size, block_size=64, n_layer=n_layer, n_head=2, n_embd=n_embd,
                    warmup_steps=0, lr=1e-2)
    module.tokenizer_state = tok.state_dict()
    data = torch.tensor(tok.encode(text[: 8 * 65]), dtype=torch.long).view(8, 65)
    loader = DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, loader)
    trainer.save_checkpoint(path)
    return path


def test_sample_report_command_end_to_end(tmp_path, small_data, capsys):
    """Catches the command failing on a real checkpoint, a missing output file, NaN in metrics.json, or metrics
    that contradict what the strategies do (greedy must be the likelier, sampling the more varied)."""
    pytest.importorskip("matplotlib")
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:2000]
    ckpt = _tiny_checkpoint(tmp_path / "tiny.ckpt", text)
    out = tmp_path / "report"
    run_command("sample-report", ["--ckpt_path", str(ckpt), "--out", str(out), "--num_samples", "4",
                                  "--max_new_tokens", "24", "--device", "cpu"])
    assert "wrote report.md, metrics.json, diversity_vs_likelihood.png" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    s = metrics["strategies"]
    assert set(s) == {st.name for st in STRATEGIES}
    assert metrics["prompts"] == ["\n"]  # a one-document char tokenizer has no EOS: start from a newline
    assert s["greedy"]["nll"] <= s["sample T=1.0"]["nll"]
    assert s["sample T=1.0"]["distinct_2"] >= s["greedy"]["distinct_2"]
    for m in s.values():
        assert m["samples"] == 4 and 0 < m["mean_tokens"] <= 24
        assert all(isinstance(m[k], float) for k in ("distinct_1", "distinct_2", "distinct_3", "entropy", "nll"))
    md = (out / "report.md").read_text(encoding="utf-8")
    assert all(f"| {name} |" in md and f"### {name}" in md for name in s)
    assert "How to read this" in md and "](diversity_vs_likelihood.png)" in md
    assert (out / "diversity_vs_likelihood.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sample_report_prompts_as_the_readme_writes_them(tmp_path, small_data, capsys, monkeypatch):
    """Catches `--prompts TEXT` failing ("Expected a <class 'list'>"): one prompt is plain text, `--prompts+` adds
    more, and escapes are understood as in generate; and a prompt read as YAML (`--prompts "- a"` prompted "a", a
    `--prompts+ "I: a"` replaced the prompts before it). `--prompts_file`: one prompt a line."""
    pytest.importorskip("matplotlib")
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:2000]
    ckpt = _tiny_checkpoint(tmp_path / "tiny.ckpt", text)
    common = ["--ckpt_path", str(ckpt), "--num_samples", "1", "--max_new_tokens", "4", "--device", "cpu"]
    for name, prompts, want in [("one", ["--prompts", "the"], ["the"]),
                                ("two", ["--prompts+", "the", "--prompts+", "and\\n"], ["the", "and\n"]),
                                ("yaml-like", ["--prompts", "- a", "--prompts+", "I: a"], ["- a", "I: a"])]:
        run_command("sample-report", [*common, "--out", str(tmp_path / name), *prompts])
        assert json.loads((tmp_path / name / "metrics.json").read_text(encoding="utf-8"))["prompts"] == want
    # a file: one prompt a line, escapes read, blank lines and a byte-order mark skipped, Windows line ends
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.txt").write_bytes("\ufeffthe\r\n\r\n  \nand\\n\r\n- a\n".encode())
    run_command("sample-report", [*common, "--out", str(tmp_path / "file"), "--prompts_file", "prompts.txt"])
    assert json.loads((tmp_path / "file" / "metrics.json").read_text(encoding="utf-8"))["prompts"] == [
        "the", "and\n", "- a"]
    (tmp_path / "blank.txt").write_text("\n \n")
    for args, want in [(["--prompts_file", "blank.txt"], "--prompts_file 'blank.txt' holds no prompt"),
                       (["--prompts_file", "prompts.txt", "--prompts", "x"], "--prompts and --prompts_file 'prompts"
                        ".txt' both give the prompts; give one"),
                       (["--prompts_file", "nope.txt"], "--prompts_file 'nope.txt' cannot be read")]:
        with pytest.raises(ValueError, match=re.escape(want)):
            run_command("sample-report", [*common, "--out", str(tmp_path / "refused"), *args])
    assert not (tmp_path / "refused").exists()


def test_sample_report_seed_leaves_room_for_every_prompt(tmp_path, small_data):
    """Catches the largest seed with two prompts failing after the first prompt's sampling, naming seed + 1, a
    value the user never passed: prompt i samples with seed + i."""
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:2000]
    ckpt = _tiny_checkpoint(tmp_path / "tiny.ckpt", text)
    with pytest.raises(ValueError, match=r"--seed must be in \[0, 2\*\*63 - 2\] .* got 9223372036854775807"):
        run_command("sample-report", ["--ckpt_path", str(ckpt), "--out", str(tmp_path / "r"), "--seed", str(2**63 - 1),
                                      "--prompts+", "a", "--prompts+", "b"])
    assert not (tmp_path / "r").exists()


def test_sample_report_replaces_only_an_earlier_report(tmp_path, small_data, capsys, monkeypatch):
    """Catches --out's own files (a report.md of the user's, notes) silently overwritten, and a failed write leaving
    a mix of an earlier report and this one: an earlier report is replaced whole, anything else is refused."""
    pytest.importorskip("matplotlib")
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:2000]
    ckpt = _tiny_checkpoint(tmp_path / "tiny.ckpt", text)
    common = ["--ckpt_path", str(ckpt), "--num_samples", "1", "--max_new_tokens", "4", "--device", "cpu"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes\n")
    with pytest.raises(FileExistsError, match=r"holds files that are not a tinylm sample report \(report.md\)"):
        run_command("sample-report", [*common, "--out", str(mine)])
    assert (mine / "report.md").read_text() == "my notes\n"
    out = tmp_path / "report"
    run_command("sample-report", [*common, "--out", str(out)])
    run_command("sample-report", [*common, "--out", str(out), "--seed", "1"])  # an earlier report: replaced
    assert sorted(p.name for p in out.iterdir()) == ["diversity_vs_likelihood.png", "metrics.json", "report.md"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "format_markdown", disk_full)  # the last file of the new report fails to write
    with pytest.raises(OSError, match="No space left"):
        run_command("sample-report", [*common, "--out", str(out), "--seed", "2"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier report whole, no partial left
    monkeypatch.undo()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes.txt"):
        run_command("sample-report", [*common, "--out", str(out)])


def test_sample_report_compares_speculative_and_constrained_decoding(tmp_path, small_data, capsys, monkeypatch):
    """Catches sample-report leaving out speculative decoding (a draft checkpoint, prompt lookup) or constrained
    decoding (a regex) when asked, the speculative rows writing other text than their plain twins (greedy's twin
    must give greedy's text), acceptance / tokens per pass missing or out of range, constrained samples that do not
    match, and a regex the char vocabulary cannot write being found only after the other strategies ran."""
    pytest.importorskip("llguidance")
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:2000]
    ckpt = _tiny_checkpoint(tmp_path / "tiny.ckpt", text)
    draft = _tiny_checkpoint(tmp_path / "draft.ckpt", text, seed=1, n_layer=1, n_embd=16)
    out = tmp_path / "report"
    common = ["--ckpt_path", str(ckpt), "--num_samples", "3", "--max_new_tokens", "16", "--device", "cpu"]
    run_command("sample-report", [*common, "--out", str(out), "--draft_ckpt_path", str(draft), "--prompt_lookup", "2",
                                  "--num_draft_tokens", "3", "--regex", r"[a-z]{1,4}( [a-z]{1,4})?\."])
    printed = capsys.readouterr().out
    s = json.loads((out / "metrics.json").read_text(encoding="utf-8"))["strategies"]
    twins = [f"{plain} + {how} K=3" for how in ("draft", "lookup n=2") for plain in ("greedy", "sample T=1.0")]
    assert set(twins) | {"greedy + regex", "sample T=1.0 + regex", "beam 4 + regex"} <= set(s)
    for name in twins:
        assert 0 <= s[name]["acceptance"] <= 1 and 1 <= s[name]["tokens_per_pass"] <= 4, name
        plain = s[name.split(" + ")[0]]
        if name.startswith("greedy"):  # exact: the very same text
            assert (s[name]["example"], s[name]["nll"]) == (plain["example"], plain["nll"]), name
    assert s["greedy + draft K=3"]["acceptance"] < 1  # guard: the draft is another model, some drafts are rejected
    assert "acceptance" not in s["greedy"] and s["greedy"]["matches"] == 0.0  # free text does not match
    for name in ("greedy + regex", "sample T=1.0 + regex", "beam 4 + regex"):
        assert s[name]["matches"] == 1.0, (name, s[name]["example"])
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "| accept | tokens/pass | matches |" in md and "**Speculative decoding**" in md
    assert "tokens/pass" in printed and "greedy + draft K=3" in printed
    from tinylm import progress

    monkeypatch.setattr(progress, "draws_bars", lambda stream: True)  # tqdm's bar: it shows from its start
    with pytest.raises(ValueError, match=r"the regex '\(x\|y\)ü' needs text this char tokenizer .* after '[xy]' "
                                         r"\(it needs 'ü' there\)"):
        run_command("sample-report", [*common, "--out", str(tmp_path / "no"), "--regex", "(x|y)ü"])
    assert "sample-report" not in capsys.readouterr().err  # refused before the first strategy's progress bar


def test_plot_labels_do_not_overlap():
    """Catches the numbers of strategies that land on (or next to) each other being drawn over one another: a
    speculative twin sits exactly on its plain strategy, and near points crowd. No two labels' boxes (matplotlib's
    text extents) may intersect, and every strategy's number is in one; every strategy has a colour of its own."""
    pytest.importorskip("matplotlib")
    points = [(2.0, 0.5), (2.0, 0.5), (2.001, 0.501), (2.002, 0.5), (2.0, 0.503), (2.5, 0.9), (2.5, 0.9), (3.0, 0.2)]
    points += [(2.0 + 0.004 * i, 0.5 + 0.002 * i) for i in range(8)]
    strategies = {f"s{i}": {"nll": x, "distinct_2": y, "deterministic": i % 2 == 0} for i, (x, y) in
                  enumerate(points)}
    fig = report.diversity_figure({"strategies": strategies})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in labels]
    clash = [(a.get_text(), b.get_text()) for i, (a, ba) in enumerate(zip(labels, boxes))
             for b, bb in zip(labels[i + 1 :], boxes[i + 1 :]) if ba.overlaps(bb)]
    assert clash == []
    numbers = sorted(int(n) for t in labels for n in t.get_text().split(","))
    assert numbers == list(range(1, len(points) + 1))
    pixels = ax.transData.transform(points[:8])  # guard: labelled at their points, these would overlap
    assert abs(pixels[2] - pixels[0]).max() < 3 and len(labels) < len(points)
    # 16 strategies, 16 colours (a draft and a grammar make 14: on the 10-colour cycle, 1 and 11 were one colour)
    assert len({tuple(c.get_facecolor()[0]) for c in ax.collections}) == len(points)


def test_a_refused_grammar_leaves_standard_output_empty(tmp_path, small_data, capsys):
    """Catches `tinylm generate --prompt ROMEO: --regex '[a-z]+ü' > out.txt` (a character the char vocabulary lacks)
    refused in one line, but with the prompt already written into out.txt: it is printed with the first token."""
    pytest.importorskip("llguidance")
    from tinylm.cli import main

    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:2000]
    ckpt = _tiny_checkpoint(tmp_path / "tiny.ckpt", text)
    with pytest.raises(SystemExit):
        main(["generate", "--ckpt_path", str(ckpt), "--prompt", "First", "--regex", "[a-z]+ü", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert out == "" and "cannot write" in err
    main(["generate", "--ckpt_path", str(ckpt), "--prompt", "First", "--regex", "[a-z]+", "--device", "cpu",
          "--max_new_tokens", "4"])
    assert capsys.readouterr().out.startswith("First")


def test_one_prompt_as_a_str_and_an_empty_prompt_to_score():
    """Catches sample_report(prompts="ROMEO:") reporting on six one-character prompts, and score_tokens with an
    empty prompt scoring the first token as certain (NLL 0, entropy 0: it had no context at all)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16)).eval()
    with pytest.raises(ValueError, match=r"score_tokens needs a prompt of at least one token: .* start the prompt "
                                         r"with the end-of-text token"):
        score_tokens(model, [], [[3, 4]])
    assert score_tokens(model, [1], [[3, 4]])[0][0][0] > 0

    class Chars:
        eos_id = 0

        def encode(self, text: str) -> list[int]:
            return [1 + ord(c) % 19 for c in text]

        def decode(self, ids: list[int]) -> str:
            return "".join(chr(97 + i) for i in ids)

    result = sample_report(model, Chars(), prompts="ROMEO:", num_samples=2, max_new_tokens=3, seed=0,
                           strategies=STRATEGIES[:1])
    assert result["prompts"] == ["ROMEO:"]


def test_the_reports_prompts_are_shown_as_typed():
    """Catches report.md's prompts written as bare Python reprs into a Markdown paragraph: `'*hi* <b>x</b>'` read as
    emphasis and HTML (a viewer showed 'hi x', in italics and bold), a prompt's backticks as the start of code. Each is
    a code span whose delimiter is longer than any backtick run inside."""
    metrics = dict.fromkeys(("mean_tokens", "distinct_1", "distinct_2", "distinct_3", "repetition_rate_4", "entropy",
                             "nll"), 1.0)
    result = {"prompts": ["*hi* <b>x</b>", "a `q` b", ""], "num_samples": 1, "max_new_tokens": 1, "seed": 0,
              "strategies": {"greedy": {"samples": 1, "deterministic": True, **metrics, "example": "x"}}}
    line = next(ln for ln in report.format_markdown(result, plot_name=None).splitlines() if "Prompts:" in ln)
    assert "Prompts: `'*hi* <b>x</b>'`, ``'a `q` b'``, (empty: starts from end-of-text)." in line, line


def test_a_prompts_file_has_one_prompt_a_line(tmp_path):
    """Catches a prompts file's line split at a form feed or U+2028 inside it (str.splitlines ends a line at
    either): two lines were four prompts. Lines end at \\n, \\r\\n or \\r."""
    from tinylm.cli.prompts import read_prompts_file

    (tmp_path / "p.txt").write_bytes("first\u2028half\r\nsecond\fpage\rthird\n".encode())
    assert read_prompts_file(str(tmp_path / "p.txt")) == ["first\u2028half", "second\fpage", "third"]


def test_the_terminal_table_keeps_its_columns_for_an_nll_of_ten_or_more(capsys):
    """Catches the NLL column 5 wide: an untrained model's NLL (10.825 over GPT-2's vocabulary) pushed rep-4 and the
    columns after it one place to the right of their headers (and strategy names shorter than "strategy" all)."""
    from tinylm.cli.commands import _print_report_table

    metrics = {"distinct_2": 0.5, "repetition_rate_4": 0.125}
    _print_report_table({"strategies": {"greedy": {**metrics, "nll": 10.825}, "top_k": {**metrics, "nll": 2.5}}})
    header, *rows = capsys.readouterr().out.splitlines()
    ends = {h: header.index(h) + len(h) for h in ("distinct-2", "NLL", "rep-4")}
    for row, nll in zip(rows, ("10.825", "2.500")):
        assert row.index(nll) + len(nll) == ends["NLL"] and row.index("0.125") + 5 == ends["rep-4"], (header, row)
