"""tinylm's from-scratch BPE against Hugging Face tokenizers and tiktoken, side by side on one core.

Measures, on tinyshakespeare (first 90% to train, last 10% "val tail" to compress):
- training time to vocab 2048 (scratch vs HF tokenizers' BpeTrainer, same settings);
- encode throughput in MB/s with GPT-2's ranks (scratch cold/warm cache vs tiktoken vs HF tokenizers);
- compression in bytes per token on the val tail (scratch vs HF trained to 2048, and tiktoken gpt2).

Run: `python benchmarks/bench_bpe.py [--data DIR]` (DIR defaults to ../shared/data or $TINYLM_SHARED_DATA).
"""

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one core for HF tokenizers too (before it is imported)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import platform
import time
from pathlib import Path

import tiktoken
import tiktoken.load
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tinylm.tokenize.bpe import GPT2_PATTERN, ByteLevelBPE

EOT = "<|endoftext|>"
VOCAB = 2048


def _best_of(fn, repeat: int) -> tuple[float, object]:
    """Fastest wall time of `repeat` calls (seconds) and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _hf_trained(train: str) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2 regex, no prefix space
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([train], trainer=trainer)
    return tok


def main() -> None:
    default = Path(os.environ.get("TINYLM_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=default, help="folder with tinyshakespeare.txt and gpt2 files")
    parser.add_argument("--repeat", type=int, default=3, help="timings are the best of this many runs")
    args = parser.parse_args()
    text = (args.data / "tinyshakespeare.txt").read_text(encoding="utf-8")
    cut = int(len(text) * 0.9)
    train, val = text[:cut], text[cut:]
    mb = len(text.encode("utf-8")) / 1e6
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores visible, one thread per library")

    # --- training ---------------------------------------------------------------------------------------------
    t_ours, ours = _best_of(lambda: ByteLevelBPE.train(train, vocab_size=VOCAB, special_tokens=[EOT],
                                                       progress=False), args.repeat)
    t_hf, hf = _best_of(lambda: _hf_trained(train), args.repeat)
    print(f"\ntrain tinyshakespeare[:90%] ({len(train.encode()) / 1e6:.2f} MB) -> vocab {VOCAB}")
    print(f"  scratch {t_ours:6.2f} s | HF tokenizers {t_hf:6.2f} s | scratch/HF = {t_ours / t_hf:.2f}x")

    # --- encode throughput with GPT-2's ranks ------------------------------------------------------------------
    gpt2 = ByteLevelBPE.from_tiktoken_file(args.data / "gpt2.tiktoken", special_tokens={EOT: 50256})
    ranks = tiktoken.load.load_tiktoken_bpe(str(args.data / "gpt2.tiktoken"))
    ref = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={EOT: 50256})
    hf_gpt2 = Tokenizer(models.BPE.from_file(str(args.data / "gpt2_vocab.json"), str(args.data / "gpt2_merges.txt")))
    hf_gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)

    def cold() -> list[int]:
        gpt2.clear_cache()  # measure the merge loop, not only cache hits
        return gpt2.encode_ordinary(text)

    t_cold, ids = _best_of(cold, args.repeat)
    t_warm, _ = _best_of(lambda: gpt2.encode_ordinary(text), args.repeat)
    t_tik, ref_ids = _best_of(lambda: ref.encode_ordinary(text), args.repeat)
    t_hfe, hf_ids = _best_of(lambda: hf_gpt2.encode(text).ids, args.repeat)
    assert ids == ref_ids == hf_ids, "GPT-2 encodings differ"
    print(f"\nencode tinyshakespeare ({mb:.2f} MB, {len(ids):,} GPT-2 tokens; all three agree on every id)")
    print(f"  scratch, cold cache {mb / t_cold:6.2f} MB/s | warm cache {mb / t_warm:6.2f} MB/s")
    print(f"  tiktoken            {mb / t_tik:6.2f} MB/s | scratch(cold)/tiktoken = {t_tik / t_cold:.3f}x speed")
    print(f"  HF tokenizers       {mb / t_hfe:6.2f} MB/s | scratch(cold)/HF       = {t_hfe / t_cold:.3f}x speed")

    # --- compression on the val tail ---------------------------------------------------------------------------
    n = len(val.encode("utf-8"))
    bpt = {
        f"scratch BPE, vocab {VOCAB}": n / len(ours.encode(val)),
        f"HF tokenizers BPE, vocab {VOCAB}": n / len(hf.encode(val).ids),
        "tiktoken gpt2, vocab 50257": n / len(ref.encode(val)),
    }
    print(f"\ncompression on the val tail (last 10%, {n:,} bytes), bytes per token (higher is better)")
    for name, v in bpt.items():
        print(f"  {name:32s} {v:.3f}")
    scratch, hf_v = list(bpt.values())[:2]
    print(f"  scratch/HF = {scratch / hf_v:.4f} ({(scratch / hf_v - 1) * 100:+.2f}%)")


if __name__ == "__main__":
    main()
