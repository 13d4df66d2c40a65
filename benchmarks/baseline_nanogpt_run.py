"""nanoGPT's `train.py` for one recipe, in plain PyTorch: the baseline whole run of `bench_whole_run.py`.

What it does is what nanoGPT's train.py does for `config/train_shakespeare_char.py` on CPU (no DDP, no compile,
no wandb, gradient_accumulation_steps 1), with the model shape, optimizer and schedule of a tinylm recipe:
- `tinylm.model.GPT` built from the recipe (its vocabulary from the prepared dataset's meta.json);
- batches as nanoGPT's `get_batch`: random windows from a fresh `np.memmap` of train.bin / val.bin per batch;
- AdamW with decay on matrices and embeddings only, linear warmup then cosine decay to `min_lr` at max_steps;
- gradient clipping; `loss.item()` printed every `log_every_n_steps` steps;
- every `val_check_interval` steps *and at step 0* nanoGPT's `estimate_loss`: the mean loss of `val_batches`
  batches of the train split and as many of the val split, in eval mode under no_grad;
- a checkpoint (model, optimizer, model args, step, best val loss) written with `torch.save` whenever the
  validation loss improves (not at step 0, as nanoGPT).

It imports nothing of tinylm but the model (tinylm/model imports only torch), so its start-up cost is that of
torch + numpy + yaml, as nanoGPT's.

    python benchmarks/baseline_nanogpt_run.py --config configs/shakespeare-char-cpu.yaml \
        --dataset DATA_CACHE/datasets/<prepared folder> --out /tmp/nanogpt-run --max-steps 300
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml

from tinylm.model import GPT, GPTConfig
from tinylm.train.optim import fused_adamw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="tinylm recipe YAML (model, data, trainer)")
    parser.add_argument("--dataset", type=Path, required=True, help="prepared folder: train.bin, val.bin, meta.json")
    parser.add_argument("--out", type=Path, required=True, help="folder for ckpt.pt")
    parser.add_argument("--max-steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    args = parser.parse_args()

    cfg = yaml.safe_load(args.config.read_text())
    m, d, t = cfg["model"], cfg["data"], cfg["trainer"]
    meta = json.loads((args.dataset / "meta.json").read_text())
    max_steps = args.max_steps or t["max_steps"]
    eval_interval, eval_iters, log_interval = t["val_check_interval"], d["val_batches"], t["log_every_n_steps"]
    block_size, batch_size, clip = d["block_size"], d["batch_size"], t.get("gradient_clip_val") or 0.0
    lr, min_lr, warmup = m["lr"], m["min_lr"], m["warmup_steps"]
    dtype = np.dtype(meta["dtype"]).newbyteorder("<")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.get("seed_everything", 1337))

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        # a new memmap per batch, as nanoGPT does (avoids a memory leak, per its comment)
        data = np.memmap(args.dataset / f"{split}.bin", dtype=dtype, mode="r")
        ix = torch.randint(len(data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])  # (B, T)
        y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
        return x, y

    model_args = {"vocab_size": meta["vocab_size"], "block_size": block_size, "n_layer": m["n_layer"],
                      "n_head": m["n_head"], "n_embd": m["n_embd"], "dropout": m.get("dropout", 0.0),
                      "bias": m.get("bias", True)}
    model = GPT(GPTConfig(**model_args))

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": m.get("weight_decay", 0.1)},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(m.get("beta1", 0.9), m.get("beta2", 0.95)),
                                  fused=fused_adamw(torch.device("cpu")))  # as tinylm: the same work

    def get_lr(it: int) -> float:
        if it < warmup:
            return lr * (it + 1) / (warmup + 1)
        if it > max_steps:
            return min_lr
        ratio = (it - warmup) / (max_steps - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        model.eval()
        out = {}
        for split in ("train", "val"):
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                losses[k] = loss_of(*get_batch(split)).item()
            out[split] = losses.mean().item()
        model.train()
        return out

    x, y = get_batch("train")
    best_val, t0 = 1e9, time.time()
    for step in range(max_steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(step)
        if step % eval_interval == 0 or step == max_steps:
            losses = estimate_loss()
            print(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
            if losses["val"] < best_val:
                best_val = losses["val"]
                if step > 0:
                    ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "model_args": model_args,
                            "iter_num": step, "best_val_loss": best_val, "config": cfg}
                    torch.save(ckpt, args.out / "ckpt.pt")
        if step == max_steps:
            break
        loss = loss_of(x, y)
        x, y = get_batch("train")  # the next batch, fetched while nanoGPT's GPU would still be busy
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % log_interval == 0:
            t1 = time.time()
            print(f"iter {step}: loss {loss.item():.4f}, time {(t1 - t0) * 1000:.2f}ms", flush=True)
            t0 = t1
    print(f"done: {max_steps} steps, best val loss {best_val:.4f}; pid {os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
