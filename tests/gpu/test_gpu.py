"""tinylm on a CUDA GPU: bf16-mixed, fused AdamW, torch.compile, flash / memory-efficient attention, the masks, the KV
cache, exact resume and host syncs. Marked ``gpu``: skipped without CUDA; `pytest -m gpu` (or benchmarks/gpu/run.sh)
runs them on a GPU machine. Tiny models: each test is about the code path, not the speed."""

import csv
import os
import warnings
from pathlib import Path

# cuBLAS reads this when its first handle is made: before any CUDA work in the process (Lightning's
# deterministic=True sets it too, but only once a Trainer exists, which can be too late in a test session)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import lightning as L
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from tinylm.cli import main
from tinylm.generate import STRATEGIES, generate
from tinylm.model import GPT, GPTConfig

pytestmark = pytest.mark.gpu

TINY_GPU = {"accelerator": "gpu", "devices": 1}
# torch's warning for each sync in sync debug mode; not its one-time notice that the mode "does not yet detect all
# synchronizing operations" (counted as a sync by this test's first GPU run: 1 where there were none)
SYNC_WARNING = "called a synchronizing CUDA operation"


def _rows(run_dir: Path, key: str) -> dict[int, float]:
    """``key`` by logged step from a run's metrics.csv (the last row of a step wins)."""
    out: dict[int, float] = {}
    with open(run_dir / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get(key):
                out[int(row["step"])] = float(row[key])
    return out


def _fit(config: Path, *args: str) -> None:
    main(["fit", "--config", str(config), *args])


@pytest.fixture
def gpu_config(run_config):
    """The tests' tiny run on the GPU: 64 wide, block 64, batch 8, loss and grad norm logged every step."""

    def make(**sections):
        base = {"trainer": {**TINY_GPU, "max_steps": 4, "val_check_interval": 4},
                "model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "warmup_steps": 1, "decay_steps": 6},
                "data": {"block_size": 64, "batch_size": 8}}
        for key, value in sections.items():
            base[key] = {**base.get(key, {}), **value}
        return run_config(chars=40_000, **base)

    return make


def test_bf16_mixed_step_is_close_to_fp32_with_fused_adamw_and_the_norm_before_clipping(gpu_config, tmp_path):
    """One optimizer step from the same init on the same batch, in 32-true and bf16-mixed."""
    config = gpu_config(trainer={"max_steps": 1, "gradient_clip_val": 1e-3})
    _fit(config, "--run.name", "fp32", "--trainer.precision", "32-true")
    _fit(config, "--run.name", "bf16", "--trainer.precision", "bf16-mixed")
    fp32, bf16 = (_rows(tmp_path / "runs" / n, "train/loss")[0] for n in ("fp32", "bf16"))
    assert bf16 == pytest.approx(fp32, rel=1e-2)
    assert abs(bf16 - fp32) > 0  # bf16 really ran (the same number would mean fp32 twice)
    # clip_grad_norm_ returns the norm before clipping: a norm after clipping would be at most the 1e-3 limit
    assert _rows(tmp_path / "runs" / "bf16", "train/grad_norm")[0] > 1e-2
    ckpt = torch.load(tmp_path / "runs" / "bf16" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert all(g["fused"] for g in ckpt["optimizer_states"][0]["param_groups"]), "AdamW is not the fused kernel"


def test_compiled_and_eager_runs_agree_and_resume_into_each_other(gpu_config, tmp_path):
    """compile_model: losses as eager within bf16 tolerance, the same checkpoint keys, and a compiled run resumed
    eager (and the other way round) continues with the same losses."""
    config = gpu_config(trainer={"max_steps": 6, "precision": "bf16-mixed", "val_check_interval": 100})
    _fit(config, "--run.name", "eager")
    _fit(config, "--run.name", "compiled", "--model.compile_model", "true")
    eager, compiled = (_rows(tmp_path / "runs" / n, "train/loss") for n in ("eager", "compiled"))
    assert sorted(compiled) == list(range(6))
    for step in range(6):
        assert compiled[step] == pytest.approx(eager[step], rel=2e-2), f"step {step}"

    # half compiled then eager, half eager then compiled (resume keeps the checkpoint's hyperparameters: the runtime
    # option compile_model is taken from this run)
    _fit(config, "--run.name", "c2e", "--model.compile_model", "true", "--trainer.max_steps", "3")
    _fit(config, "--run.name", "c2e", "--model.compile_model", "false", "--ckpt_path", "last")
    _fit(config, "--run.name", "e2c", "--trainer.max_steps", "3")
    _fit(config, "--run.name", "e2c", "--model.compile_model", "true", "--ckpt_path", "last")
    for name in ("c2e", "e2c"):
        resumed = _rows(tmp_path / "runs" / name, "train/loss")
        assert sorted(resumed) == list(range(6)), name
        for step in range(3, 6):
            assert resumed[step] == pytest.approx(eager[step], rel=2e-2), f"{name} step {step}"

    def keys(name: str) -> list[str]:
        path = tmp_path / "runs" / name / "checkpoints" / "last.ckpt"
        return sorted(torch.load(path, map_location="cpu", weights_only=False)["state_dict"])

    assert keys("compiled") == keys("eager") == keys("c2e") == keys("e2c")
    assert not any("_orig_mod" in k for k in keys("compiled"))


def _tiny_gpt(attn_mask: str = "causal", **kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=96, block_size=128, n_layer=2, n_head=4, n_embd=128, bias=False,
                         attn_mask=attn_mask, eos_id=0 if attn_mask == "document" else None, **kw))


def test_causal_attention_runs_on_flash_attention_in_bf16():
    """With SDPA restricted to the flash kernel, a causal forward and backward must still run: the causal path
    passes no mask (flash takes none) and is_causal=True. Memory-efficient attention is checked likewise."""
    model = _tiny_gpt().cuda()
    x = torch.randint(1, 96, (4, 128), device="cuda")
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        with sdpa_kernel([backend]), torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        logits.float().logsumexp(-1).mean().backward()
        assert torch.isfinite(logits).all()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("attn_mask", ["causal", "document", "prefix"])
def test_masks_match_the_cpu_on_memory_efficient_attention(attn_mask):
    """fp32 logits on CUDA (memory-efficient SDPA, which takes the boolean masks) equal the CPU's."""
    model = _tiny_gpt(attn_mask).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 96, (3, 128), generator=g)
    x[:, ::17] = 0  # EOS every 17 tokens: several documents per row for the document mask
    kw = {"prefix_len": torch.tensor([5, 40, 128])} if attn_mask == "prefix" else {}
    with torch.no_grad():
        want = model(x, **kw)
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            got = model.cuda()(x.cuda(), **{k: v.cuda() for k, v in kw.items()}).cpu()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_kv_cache_generation_on_cuda_gives_the_cpus_greedy_ids_and_every_strategy_runs():
    model = _tiny_gpt().eval()
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    want = generate(model, prompts, strategy="greedy", max_new_tokens=40)
    model.cuda()
    assert generate(model, prompts, strategy="greedy", max_new_tokens=40) == want
    assert generate(model, prompts, strategy="greedy", max_new_tokens=40, use_cache=False) == want
    options = {"sample": {"top_k": 8, "seed": 0}, "beam": {"num_beams": 3}, "contrastive": {"top_k": 4}}
    for strategy in STRATEGIES:
        out = generate(model, prompts, strategy=strategy, max_new_tokens=12, **options.get(strategy, {}))
        assert [len(row) for row in out] == [12, 12], strategy


@pytest.mark.parametrize("precision, tol", [("32-true", 0.0), ("bf16-mixed", 2e-2)])
def test_exact_resume_on_cuda(gpu_config, tmp_path, precision, tol):
    """Straight vs interrupted at step 3 and resumed, deterministic algorithms on, with dropout, accumulation and
    loader workers: bit-identical losses in fp32."""
    config = gpu_config(trainer={"max_steps": 6, "precision": precision, "deterministic": True,
                                 "accumulate_grad_batches": 2, "val_check_interval": 100},
                        model={"dropout": 0.1}, data={"num_workers": 2}, run={"checkpoint_every": 3})
    _fit(config, "--run.name", "straight")
    _fit(config, "--run.name", "resumed", "--trainer.max_steps", "3")
    _fit(config, "--run.name", "resumed", "--ckpt_path", "last")
    straight, resumed = (_rows(tmp_path / "runs" / n, "train/loss") for n in ("straight", "resumed"))
    assert sorted(resumed) == sorted(straight) == list(range(6))
    delta = max(abs(resumed[s] - straight[s]) for s in range(6))
    print(f"exact resume on CUDA, {precision}: max |delta loss| = {delta:.3g}")
    assert delta <= tol


class _SyncCounter(L.Callback):
    """Counts host-device synchronisations from the start of batch `first` to the end of batch `last`: torch's sync
    warnings (torch.cuda.set_sync_debug_mode) and explicit torch.cuda.synchronize() calls, which the debug mode does
    not see. Put it first among the callbacks and its `end` last, so that every end hook of the batch is counted."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.count: int | None = None  # set once the window is over
        self.counting = False
        self._caught = warnings.catch_warnings(record=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx == self.first:
            self._log = self._caught.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            self.counting, self.count = True, 0

    def synchronize(self, real):
        """`real` (torch.cuda.synchronize) counting its calls while the window is open."""

        def counted(*args, **kwargs):
            if self.counting:
                self.count += 1
            return real(*args, **kwargs)

        return counted

    def end(self) -> L.Callback:
        return _SyncCounterEnd(self)


class _SyncCounterEnd(L.Callback):
    def __init__(self, counter: _SyncCounter) -> None:
        self.counter = counter

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        c = self.counter
        if batch_idx == c.last and c.counting:
            torch.cuda.set_sync_debug_mode(0)
            c._caught.__exit__(None, None, None)
            c.counting = False
            c.count += sum(SYNC_WARNING in str(w.message) for w in c._log)


def test_steps_that_log_nothing_make_no_host_sync(tmp_path, small_data, monkeypatch):
    """Between logging steps a step queues its kernels and returns: no .item(), float() or synchronize in the
    training step, tinylm's callbacks (speed, health, RNG state, the stability guard: its decision reaches fused
    AdamW as a tensor) or the CSV logger."""
    from tinylm.data import TinyLMDataModule
    from tinylm.train.callbacks import RNGState, SpeedMonitor
    from tinylm.train.guard import StabilityGuard
    from tinylm.train.health import HealthMonitor
    from tinylm.train.loggers import RunCSVLogger
    from tinylm.train.module import TinyLM

    dm = TinyLMDataModule(corpus=str(small_data / "tinyshakespeare_100k.txt"), tokenizer="char", block_size=64,
                          batch_size=8, cache_dir=str(tmp_path / "cache"), seed=0, val_batches=1)
    dm.prepare_data()
    dm.setup("fit")
    lit = TinyLM(vocab_size=dm.vocab_size, block_size=64, n_layer=2, n_head=2, n_embd=64, decay_steps=12)
    counter = _SyncCounter(first=4, last=6)  # logging every 4 steps: steps 3, 7, 11 log; 4-6 do not (batch = step)
    # (the speed monitor's clock called torch.cuda.synchronize() every step)
    monkeypatch.setattr(torch.cuda, "synchronize", counter.synchronize(torch.cuda.synchronize))
    trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=12, log_every_n_steps=4,
                        gradient_clip_val=1.0, logger=RunCSVLogger(tmp_path / "run"), enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, callbacks=[counter, SpeedMonitor(), HealthMonitor(), RNGState(),
                                                           StabilityGuard(), counter.end()])
    trainer.fit(lit, datamodule=dm)
    assert counter.count == 0, f"{counter.count} host syncs in steps 4-6 (None: not counted)"
