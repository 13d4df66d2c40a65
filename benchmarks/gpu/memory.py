"""Peak GPU memory of each shipped GPU recipe: a few optimizer steps of the config's model at its micro-batch,
block size and accumulation (capped at 2 micro-batches: the peak is reached by the second), bf16-mixed, under a
Lightning Trainer as `tinylm fit` runs it, on random token ids (memory does not depend on the text).

`torch.cuda.max_memory_allocated` is what PyTorch's allocator handed out at the worst moment: the weights, AdamW's
two moments (or Muon's momentum), the gradients and the activations of one micro-batch. What the card needs is a
little more (the CUDA context, ~0.5 GiB, and the allocator's cache). Each config is measured eager and, where
`--compile`, compiled (inductor's fused kernels keep fewer activations).

    python benchmarks/gpu/memory.py [--configs configs/gpt2-124m.yaml ...] [--compile] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import logging
import warnings
from pathlib import Path

import lightning as L
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from tinylm.train.module import TinyLM

REPO = Path(__file__).resolve().parents[2]
VOCAB = {"char": 65, "bpe": 8192}  # tinyshakespeare's characters; the BPE recipes' vocab_size
GPT2_VOCAB = 50257


def vocab_of(data: dict) -> int:
    tok = str(data.get("tokenizer", "char"))
    if tok.startswith("tiktoken:"):
        return GPT2_VOCAB
    if tok == "bpe":
        return int(data.get("vocab_size", VOCAB["bpe"]))
    return VOCAB.get(tok, VOCAB["bpe"])


def measure(config: Path, *, compile: bool, steps: int = 2) -> dict:
    cfg = yaml.safe_load(config.read_text())
    model, data, trainer = dict(cfg.get("model") or {}), dict(cfg["data"]), dict(cfg.get("trainer") or {})
    B, T = int(data["batch_size"]), int(data["block_size"])
    accumulate = min(int(trainer.get("accumulate_grad_batches", 1)), 2)
    V = vocab_of(data)
    model["compile_model"] = compile
    L.seed_everything(0, verbose=False)
    lit = TinyLM(vocab_size=V, block_size=T, decay_steps=100, **model)
    ids = torch.randint(0, V, (B * accumulate * steps, T + 1))
    loader = DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=B)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=steps, max_epochs=None,
              accumulate_grad_batches=accumulate, gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
              num_sanity_val_steps=0).fit(lit, loader)
    peak = torch.cuda.max_memory_allocated() - base
    params = lit.model.num_params()
    del lit
    return {"config": config.name, "compile": compile, "params": params, "batch_size": B, "block_size": T,
            "vocab_size": V, "accumulate_measured": accumulate, "optimizer": model.get("optimizer", "adamw"),
            "peak_bytes": peak, "peak_gib": peak / 2**30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu_configs = sorted(p for p in (REPO / "configs").glob("*.yaml") if "-cpu" not in p.name)
    parser.add_argument("--configs", type=Path, nargs="+", default=gpu_configs)
    parser.add_argument("--compile", action="store_true", help="also measure each config compiled")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    rows = []
    print(f"GPU: {torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
    print("| config | params | micro-batch x block | optimizer | compiled | peak memory GiB |\n"
          "|---|---:|---|---|---|---:|")
    for config in args.configs:
        for compile in (False, True) if args.compile else (False,):
            try:
                r = measure(config, compile=compile)
            except torch.OutOfMemoryError as e:
                r = {"config": config.name, "compile": compile, "error": str(e).splitlines()[0]}
            rows.append(r)
            if "error" in r:
                print(f"| {config.name} | | | | {compile} | out of memory |", flush=True)
            else:
                print(f"| {r['config']} | {r['params'] / 1e6:.1f}M | {r['batch_size']} x {r['block_size']} | "
                      f"{r['optimizer']} | {compile} | {r['peak_gib']:.2f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
