"""What a training sample costs (`SampleText`, the laptop recipe's `samples:`), against the least decoding can cost.

The laptop recipe's model (4 layers, 128 wide, char vocabulary of 65, block_size 64; random weights, or a
checkpoint's with --ckpt), its samples (prompts "ROMEO:" and "\\n", 200 new tokens, temperature 0.8, top_k 200,
prompt i seeded samples.seed + i): 200 tokens pass block_size, so most steps re-run a whole 64-token window (learned
positions shift with it). Side by side in one process, alternating, CPU seconds per sample step (both prompts):

- tinylm: `SampleText._sample`, as `tinylm fit` calls it every samples.every_n_steps;
- plain loop: nanoGPT's `generate` (the cropped window through `model(idx)` at every token, no cache);
- plain cache: the least decoding can do: one token's forward inside block_size, the whole window past it, no
  processors, no checks;
- forward only: the plain cache's forward passes alone (no sampling, no concatenation).

All three decoders must give the same ids. Prints the medians and each side's median ratio to the plain cache.

    python benchmarks/bench_sample_text.py
    python benchmarks/bench_sample_text.py --repeats 10 --ckpt runs/shakespeare-char-cpu/checkpoints/last.ckpt
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from tinylm.model import GPT, GPTConfig
from tinylm.tokenize import build_tokenizer
from tinylm.train.samples import SampleText

SHAPE = {"vocab_size": 65, "block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128, "bias": False, "dropout": 0.0}
CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # tinyshakespeare's 65


@torch.inference_mode()
def plain_sample(model: GPT, ids: list[int], seed: int, new: int, temperature: float, cache: bool) -> list[int]:
    """nanoGPT's sampling loop (cache=False), or the same with a KV cache inside block_size (cache=True)."""
    block, gen = model.config.block_size, torch.Generator().manual_seed(seed)
    idx = torch.tensor([ids])
    kv = model.new_kv_cache(1) if cache else None
    for _ in range(new):
        if kv is not None and idx.size(1) <= block:
            logits = model.forward(idx[:, kv.pos:], kv_cache=kv, last_only=True)
        else:
            logits = model.forward(idx[:, -block:], last_only=True)
        probs = (logits[:, -1].float() / temperature).softmax(-1)
        idx = torch.cat([idx, torch.multinomial(probs, 1, generator=gen)], dim=1)
    return idx[0, len(ids):].tolist()


@torch.inference_mode()
def forwards_only(model: GPT, ids: list[int], new: int) -> None:
    block, kv = model.config.block_size, model.new_kv_cache(1)
    idx = torch.tensor([ids + [1] * new])
    for L in range(len(ids), len(ids) + new):
        if L <= block:
            model.forward(idx[:, kv.pos:L], kv_cache=kv, last_only=True)
        else:
            model.forward(idx[:, L - block:L], last_only=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="alternating rounds; medians reported")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the recipe trains with 2)")
    parser.add_argument("--ckpt", default=None, help="a checkpoint of the laptop recipe (default: random weights)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE))
    if args.ckpt:
        state = torch.load(args.ckpt, map_location="cpu", weights_only=False)["state_dict"]
        model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    tok = build_tokenizer("char", documents=lambda: [CHARS])
    samples = SampleText(prompts=["ROMEO:", "\n"], max_new_tokens=200)
    c = samples.config
    prompts = [tok.encode(p) for p in samples.prompts]
    sides = {
        "tinylm (SampleText)": lambda: [tok.encode(samples._sample(model, tok, p, i))
                                        for i, p in enumerate(samples.prompts)],
        "plain loop (nanoGPT)": lambda: [plain_sample(model, p, c.seed + i, c.max_new_tokens, c.temperature, False)
                                         for i, p in enumerate(prompts)],
        "plain cache": lambda: [plain_sample(model, p, c.seed + i, c.max_new_tokens, c.temperature, True)
                                for i, p in enumerate(prompts)],
        "forward passes only": lambda: [forwards_only(model, p, c.max_new_tokens) for p in prompts],
    }
    outs = {name: fn() for name, fn in sides.items()}  # (warm-up too)
    if len({repr(o) for name, o in outs.items() if "only" not in name}) != 1:
        raise AssertionError("the decoders' ids differ")
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(args.repeats):
        for name, fn in (sides.items() if r % 2 else reversed(sides.items())):  # alternate the order
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    print(f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{'weights of ' + args.ckpt if args.ckpt else 'random weights'}; {len(prompts)} prompts x "
          f"{c.max_new_tokens} tokens; CPU seconds per sample step, median of {args.repeats}; same ids: yes\n")
    print("| decoder | CPU s | vs plain cache (median ratio) |")
    print("|---|---:|---:|")
    base = times["plain cache"]
    for name, t in times.items():
        ratio = statistics.median(a / b for a, b in zip(t, base))
        print(f"| {name} | {statistics.median(t):.3f} | {ratio:.3f}x |")


if __name__ == "__main__":
    main()
