"""What sharing one step's checkpoint files costs (tinylm.checkpoint_share): before ``last.ckpt`` takes the bytes of
the ``step-N.ckpt`` just written at the same step, the earlier file is read back and its state compared with the
new one. Timed here against the save itself, on CPU, for a checkpoint as a run writes it (weights, AdamW's two
moments, loops, callbacks, RNG states):

- save: ``AtomicCheckpointIO.save_checkpoint`` of ``step-N.ckpt`` (a new state: nothing read back);
- read-back: ``load_checkpoint(step-N.ckpt, mmap=True)`` (the file just written: from the page cache);
- compare: ``same_state`` of the new checkpoint and the read-back one (every tensor, bit for bit);
- second save: ``last.ckpt`` of the same state through the same writer, all of it (read-back, compare, write,
  then the sharing: a reflink, a read-only hard link, or none: root on ext4 keeps copies).

Each round writes into a fresh folder (a writer remembers a folder where nothing can be shared and stops comparing
there). Medians over the rounds; the machine and its load are printed (the machine may be shared).

    python benchmarks/bench_checkpoint_share.py                     # the laptop recipe and GPT-2 124M, 3 rounds
    python benchmarks/bench_checkpoint_share.py --sizes laptop --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train_step import machine_line  # noqa: E402 (the benchmarks folder is no package)

from tinylm.checkpoint import CHECKPOINT_FORMAT, load_checkpoint  # noqa: E402
from tinylm.checkpoint_share import same_state  # noqa: E402
from tinylm.model import GPT, GPTConfig  # noqa: E402
from tinylm.train.checkpoint_io import AtomicCheckpointIO  # noqa: E402
from tinylm.train.optim import build_optimizer  # noqa: E402

SIZES = {  # name: GPTConfig kwargs
    "laptop": {"vocab_size": 65, "block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 128, "bias": False},
    "124m": {"vocab_size": 50304, "block_size": 1024, "n_layer": 12, "n_head": 12, "n_embd": 768},
}


def make_checkpoint(kwargs: dict) -> dict:
    """A checkpoint as Lightning hands it to the CheckpointIO after one AdamW step (moments filled)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**kwargs))
    opt = build_optimizer(model, optimizer="adamw", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), muon_lr=0.02,
                          muon_momentum=0.95, muon_weight_decay=0.0, fused=False)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    opt.step()
    return {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "optimizer_states": [opt.state_dict()], "lr_schedulers": [{"last_epoch": 1}], "epoch": 0,
            "global_step": 1, "loops": {"fit_loop": {"batches": 1}},
            "callbacks": {"ModelCheckpoint": {"best_model_path": "", "last_model_path": ""},
                          "RNGState": {"torch": torch.get_rng_state()}},
            "hyper_parameters": kwargs, "tinylm": {"format": CHECKPOINT_FORMAT}}


def with_bookkeeping(ckpt: dict, last: str) -> dict:
    """The same state as the next file of the step holds it: only the checkpoint callback's bookkeeping differs."""
    return {**ckpt, "callbacks": {**ckpt["callbacks"], "ModelCheckpoint": {"best_model_path": "",
                                                                           "last_model_path": last}}}


def one_round(ckpt: dict, folder: Path) -> dict[str, float]:
    folder.mkdir()
    io, times = AtomicCheckpointIO(), {}
    t = time.perf_counter()
    io.save_checkpoint(ckpt, folder / "step-1.ckpt")
    times["save"] = time.perf_counter() - t
    t = time.perf_counter()
    loaded = load_checkpoint(folder / "step-1.ckpt", mmap=True)
    times["read-back"] = time.perf_counter() - t
    second = with_bookkeeping(ckpt, str(folder / "last.ckpt"))
    t = time.perf_counter()
    assert same_state(second, loaded)
    times["compare"] = time.perf_counter() - t
    del loaded
    t = time.perf_counter()
    io.save_checkpoint(second, folder / "last.ckpt")
    times["second save"] = time.perf_counter() - t
    times["shared by"] = io._step_files.methods.get(folder)  # type: ignore[assignment]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder)")
    args = parser.parse_args()
    print(machine_line())
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for size in args.sizes:
            ckpt = make_checkpoint(SIZES[size])
            rounds = [one_round(ckpt, Path(tmp) / f"{size}-{i}") for i in range(args.rounds)]
            mb = (Path(tmp) / f"{size}-0" / "step-1.ckpt").stat().st_size / 1e6
            med = {k: statistics.median(r[k] for r in rounds) for k in ("save", "read-back", "compare",
                                                                         "second save")}
            check = med["read-back"] + med["compare"]
            print(f"{size}: {mb:,.1f} MB a file; save {med['save']:.3f} s, read-back {med['read-back']:.3f} s, "
                  f"compare {med['compare']:.3f} s (read-back + compare = {check / med['save']:.0%} of the save); "
                  f"second save, all of it, {med['second save']:.3f} s (shared by: {rounds[0]['shared by']}; "
                  f"{args.rounds} rounds, medians)")
            del ckpt


if __name__ == "__main__":
    main()
