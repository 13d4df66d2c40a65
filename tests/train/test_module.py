"""The LightningModule: loss, optimizer groups, the schedule under accumulation, grad-norm logging."""

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, TensorDataset

from tinylm.data.datamodule import TinyLMDataModule
from tinylm.train.module import TinyLM
from tinylm.train.schedules import lr_at

TINY = {"vocab_size": 50, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, "pad_vocab_multiple": 1}


def _batches(n: int, B: int = 4, T: int = 16, V: int = 50, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, V, (n * B, T + 1), generator=g)
    return DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=B)


def _trainer(**kw) -> L.Trainer:
    defaults = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "precision": "32-true",
        "limit_val_batches": 0,
        "log_every_n_steps": 1,
    }
    return L.Trainer(**{**defaults, **kw})


def test_initial_loss_is_ln_vocab():
    """Catches a bad init (or padded vocab columns leaking into the softmax) that starts far from uniform."""
    torch.manual_seed(0)
    module = TinyLM(**TINY)
    x, y = next(iter(_batches(1, B=8)))
    loss = module._loss((x, y))
    assert abs(loss.item() - math.log(50)) < 0.1


def test_padded_vocab_does_not_change_initial_loss():
    """Catches logits over padding rows being included in the loss (ln 64 instead of ln 50)."""
    torch.manual_seed(0)
    module = TinyLM(**{**TINY, "pad_vocab_multiple": 64})
    x, y = next(iter(_batches(1, B=8)))
    loss, logits = module._loss((x, y)), module(x)
    assert logits.shape[-1] == 50
    assert abs(loss.item() - math.log(50)) < 0.1


def test_the_loss_is_in_fp64_under_64_true():
    """Catches the training and validation losses downcast to fp32 under --trainer.precision 64-true (the logits'
    ``.float()``): a run in double precision got a loss, and gradients, only fp32 can hold (off by ~3e-7)."""
    torch.manual_seed(0)
    module = TinyLM(**TINY).double()
    x, y = next(iter(_batches(1, B=8)))
    loss, logits = module._loss((x, y)), module(x)
    exact = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))  # fp64 throughout
    assert loss.dtype == torch.float64 and abs(loss.item() - exact.item()) < 1e-12
    module.validation_step((x, y), 0)
    assert abs(module.val_loss.compute().item() - exact.item()) < 1e-12


def test_weight_decay_groups():
    """Catches weight decay applied to biases/LayerNorm, or missing from matrices and embeddings."""
    module = TinyLM(**{**TINY, "bias": True})
    trainer = _trainer(max_steps=1)
    module.trainer = trainer  # configure_optimizers reads max_steps through the trainer
    opt = module.configure_optimizers()["optimizer"]
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    n_total = sum(p.numel() for p in module.model.parameters())
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == n_total  # nothing left out
    assert len(no_decay["params"]) > 0


class _Recorder(L.Callback):
    def __init__(self):
        self.lrs, self.steps, self.norms = [], [], []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"])
        self.steps.append(trainer.global_step)
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())


@pytest.mark.parametrize("accumulate", [1, 3])
def test_schedule_steps_once_per_optimizer_step(accumulate):
    """Catches accumulation stretching the schedule (stepping the LR per micro-batch instead of per update)."""
    torch.manual_seed(0)
    hp = {"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 2}
    module = TinyLM(**TINY, **hp)
    rec = _Recorder()
    trainer = _trainer(max_steps=6, accumulate_grad_batches=accumulate, callbacks=[rec])
    trainer.fit(module, _batches(6 * accumulate))
    assert rec.steps == list(range(6))
    expected = [lr_at(s, schedule="cosine", warmup_steps=2, decay_steps=6, **{k: hp[k] for k in ("lr", "min_lr")})
                for s in range(6)]
    assert rec.lrs == pytest.approx(expected)


def test_logged_lr_is_the_optimizers_under_bf16_true():
    """Catches train/lr rounded to bf16 under --trainer.precision bf16-true (0.00099945 for 1e-3): the logged value was
    made a tensor of the default dtype, which Lightning sets to the precision's."""
    torch.manual_seed(0)
    module = TinyLM(**TINY, lr=1e-3, min_lr=3.25e-4, warmup_steps=0, decay_steps=2)
    trainer = _trainer(max_steps=2, precision="bf16-true")
    trainer.fit(module, _batches(2))
    lr = lr_at(1, schedule="cosine", lr=1e-3, min_lr=3.25e-4, warmup_steps=0, decay_steps=2)  # the last step's
    assert trainer.callback_metrics["train/lr"].item() == pytest.approx(lr, rel=1e-6)
    assert torch.tensor(lr, dtype=torch.bfloat16).item() != pytest.approx(lr, rel=1e-6)  # guard: bf16 rounds it


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_grad_norm_is_logged_before_clipping(precision):
    """Catches logging the clipped norm (which would always read <= gradient_clip_val and hide spikes)."""
    torch.manual_seed(0)
    module = TinyLM(**TINY, lr=1e-3, warmup_steps=0)
    rec = _Recorder()
    trainer = _trainer(max_steps=1, gradient_clip_val=1e-3, callbacks=[rec], precision=precision)
    trainer.fit(module, _batches(1))
    logged = trainer.callback_metrics["train/grad_norm"].item()
    assert logged == pytest.approx(rec.norms[0], rel=1e-4)
    assert logged > 1e-2  # far above the clip value: it is the pre-clip norm


class _ExactNorm(L.Callback):
    """The total norm of the gradients the optimizer is about to use, in float64 (before clipping)."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad.double() for p in pl_module.parameters() if p.grad is not None]
        self.norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()


def test_grad_norm_of_bf16_gradients_is_not_rounded_to_bf16():
    """Catches train/grad_norm (and the norm the clipping and the stability guard use) rounded to bf16 under
    --trainer.precision bf16-true: torch's norm of bf16 gradients is a bf16 number, 3 significant digits (1.453 for
    the 1.449 of those very gradients); in fp32 it is theirs to ~1e-7."""
    torch.manual_seed(0)
    module, exact = TinyLM(**TINY, lr=1e-3, warmup_steps=0), _ExactNorm()
    trainer = _trainer(max_steps=1, callbacks=[exact], precision="bf16-true")
    trainer.fit(module, _batches(1))
    assert trainer.callback_metrics["train/grad_norm"].item() == pytest.approx(exact.norm, rel=1e-5)
    assert torch.tensor(exact.norm, dtype=torch.bfloat16).item() != pytest.approx(exact.norm, rel=1e-5)  # (bf16 rounds)


def test_fp16_gradient_scaling_is_undone_before_clipping():
    """Catches fp16 (16-mixed: a GradScaler, the default on GPUs without bf16) with a fused AdamW: Lightning leaves
    unscaling to the fused step, so clipping and train/grad_norm saw gradients ~65536x too large. The norm seen
    under fp16 must be the fp32 run's, up to fp16's rounding."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    norms = {}
    for name, kw in (("fp32", {"precision": "32-true"}), ("fp16", {"plugins": [MixedPrecision("16-mixed", "cpu")],
                                                                   "precision": None})):
        torch.manual_seed(0)
        module = _SteppedGrads(**TINY, lr=1e-3, warmup_steps=0)
        trainer = _trainer(max_steps=2, gradient_clip_val=1e3, **kw)
        trainer.fit(module, _batches(2))
        norms[name] = trainer.callback_metrics["train/grad_norm"].item()
    assert norms["fp16"] == pytest.approx(norms["fp32"], rel=0.05)


def test_one_batch_overfits():
    """Catches a training loop that does not learn (detached loss, zero LR, frozen parameters)."""
    torch.manual_seed(0)
    module = TinyLM(**TINY, lr=3e-3, min_lr=3e-3, warmup_steps=0, lr_schedule="constant", weight_decay=0.0)
    batch = next(iter(_batches(1)))
    loader = DataLoader(TensorDataset(batch[0].repeat(150, 1), batch[1].repeat(150, 1)), batch_size=4)
    trainer = _trainer(max_steps=150)
    trainer.fit(module, loader)
    loss = module._loss(batch)
    assert loss.item() < 0.1


def test_max_steps_required_for_schedule():
    """Catches a cosine schedule silently built with no length (max_steps unset)."""
    module = TinyLM(**TINY)
    module.trainer = _trainer(max_epochs=1)
    with pytest.raises(ValueError, match="max_steps"):
        module.configure_optimizers()


def test_constant_schedule_needs_no_max_steps():
    """Catches configure_optimizers asking the `constant` schedule for a length it never uses: TinyLM(lr_schedule=
    "constant") in a Trainer(max_epochs=1) stopped before its first step with "the LR schedule needs a length"
    (the cosine's refusal above is right: it has no length without max_steps)."""
    module = TinyLM(**TINY, lr_schedule="constant", lr=2e-3, warmup_steps=0)
    module.trainer = _trainer(max_epochs=1)
    scheduler = module.configure_optimizers()["lr_scheduler"]["scheduler"]
    assert scheduler.get_last_lr() == [2e-3, 2e-3]


@pytest.mark.parametrize(
    "bad, match",
    [({"vocab_size": 0}, "vocab_size"), ({"lr_schedule": "linear"}, "lr_schedule"), ({"min_lr": 1.0}, "min_lr")],
)
def test_bad_hyperparameters_raise(bad, match):
    """Catches nonsense hyperparameters surfacing later as NaNs or shape errors."""
    with pytest.raises(ValueError, match=match):
        TinyLM(**{**TINY, **bad})


@pytest.mark.parametrize("attn_mask", ["causal", "document", "prefix"])
def test_every_attention_mask_trains(attn_mask):
    """Catches a mask the model supports but the training step cannot drive (prefix needs prefix_len)."""
    torch.manual_seed(0)
    module = TinyLM(**TINY, attn_mask=attn_mask, eos_id=0, prefix_len=4 if attn_mask == "prefix" else 0)
    trainer = _trainer(max_steps=2)
    trainer.fit(module, _batches(2))
    assert trainer.global_step == 2


def test_cpu_precision_choice():
    """Catches the CPU default picking bf16-mixed for small models, where it measured 1.35x slower than fp32."""
    from tinylm.device import (
        CPU_BF16_MIN_WIDTH,
        _cpu_has_native_bf16,
        resolve_precision,
    )

    assert resolve_precision("16-mixed", 128) == "16-mixed"  # an explicit choice always wins
    if torch.cuda.is_available():
        pytest.skip("the CPU rule applies only without a GPU")
    assert resolve_precision(None, 128) == "32-true"
    wide = resolve_precision(None, CPU_BF16_MIN_WIDTH)
    assert wide == ("bf16-mixed" if _cpu_has_native_bf16() else "32-true")


def test_bf16_mixed_trains_on_cpu():
    """Catches bf16-mixed breaking on CPU (autocast dtype errors, a non-finite loss)."""
    torch.manual_seed(0)
    module = TinyLM(**TINY, warmup_steps=0)
    trainer = _trainer(max_steps=3, precision="bf16-mixed", gradient_clip_val=1.0)
    trainer.fit(module, _batches(3))
    assert math.isfinite(trainer.callback_metrics["train/loss"].item())
    assert all(p.dtype == torch.float32 for p in module.parameters())  # mixed: weights stay fp32


def test_prefix_positions_that_see_their_target_count_in_no_loss():
    """Catches a prefix-LM scored on prefix positions whose own target is inside the bidirectional prefix: the
    target is read off the input (loss ~0.1, so the `leak` alert would fire on a correct run) and teaches nothing.
    The counted positions are derived from the mask itself: position i counts iff it cannot see token i + 1."""
    from tinylm.model import build_attention_mask
    from tinylm.train.module import IGNORE

    P, T = 5, TINY["block_size"]
    module = TinyLM(**TINY, attn_mask="prefix", prefix_len=P)
    x, y = next(iter(_batches(1, B=2)))
    sees = build_attention_mask(x, attn_mask="prefix", prefix_len=P)[0, 0]  # (T, T): query i sees key j
    sees_target = [bool(sees[i, i + 1]) for i in range(T - 1)] + [False]  # the last target is not in x at all
    assert sees_target == [True] * (P - 1) + [False] * (T - P + 1)  # hand check: positions 0..3 see tokens 1..4
    counted = module._targets(y) != IGNORE  # (B, T)
    assert counted.tolist() == [[not s for s in sees_target]] * 2
    loss, logits = module._loss((x, y)), module(x)
    by_hand = F.cross_entropy(logits[:, P - 1 :].reshape(-1, 50), y[:, P - 1 :].reshape(-1))
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-6)
    causal = TinyLM(**TINY)
    assert (causal._targets(y) != IGNORE).all()  # guard: causal models count every position


def test_prefix_lm_cannot_win_by_copying_on_random_tokens():
    """Catches the prefix-LM loss (train and val) dropping far below ln(V) on random tokens, which only copying
    visible targets can do: before the fix the loss over the window fell from 3.9 to 2.9 in 80 steps (1.5 on the
    prefix positions) while the counted positions stayed at ln(50) = 3.91."""
    torch.manual_seed(0)
    hp = {"lr": 1e-2, "min_lr": 1e-2, "lr_schedule": "constant", "warmup_steps": 0, "weight_decay": 0.0}
    module = TinyLM(**TINY, attn_mask="prefix", prefix_len=8, **hp)
    trainer = _trainer(max_steps=80, limit_val_batches=None)
    trainer.fit(module, _batches(80, B=8, seed=1))
    assert trainer.callback_metrics["train/loss"].item() > 0.93 * math.log(50)
    (metrics,) = trainer.validate(module, _batches(4, B=8, seed=2), verbose=False)
    assert metrics["val/loss"] > 0.95 * math.log(50)
    assert metrics["val/ppl"] == pytest.approx(math.exp(metrics["val/loss"]), rel=1e-4)  # same targets counted
    # guard: the model did train (a model that cannot learn would pass the above trivially)
    torch.manual_seed(0)
    copy_task = TinyLM(**TINY, **hp)
    x = torch.randint(0, 50, (80 * 8, 16), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(TensorDataset(x, x), batch_size=8)  # y = x: the causal model sees its target; it must copy
    trainer = _trainer(max_steps=80)
    trainer.fit(copy_task, loader)
    assert trainer.callback_metrics["train/loss"].item() < 0.5 * math.log(50)


class _SteppedGrads(TinyLM):
    """Records the total gradient norm each optimizer step uses: right after tinylm's clipping, which Lightning
    calls after `on_before_optimizer_step` (so that hook sees the raw gradients) and before the step (after which
    tinylm frees the gradients)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.norms = []

    def configure_gradient_clipping(self, optimizer, *args, **kwargs):
        super().configure_gradient_clipping(optimizer, *args, **kwargs)
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())


def test_gradients_are_freed_after_each_optimizer_step_and_kept_while_accumulating():
    """Prevents the gradients from staying alive beside the next forward's activations (Lightning sets them to None
    only after the next training_step: a peak higher by the gradients' size), and freeing them mid-accumulation
    (which would drop the earlier micro-batches' gradients)."""

    class Grads(L.Callback):
        def __init__(self):
            self.alive = []

        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            self.alive.append(any(p.grad is not None for p in module.parameters()))

    torch.manual_seed(0)
    rec = Grads()
    _trainer(max_steps=3, accumulate_grad_batches=2, callbacks=[rec]).fit(TinyLM(**TINY), _batches(6))
    assert rec.alive == [True, False] * 3  # after the first micro-batch: accumulating; after the step: freed


def test_lightning_zero_grad_runs_only_where_a_gradient_is_left(monkeypatch):
    """Catches Lightning's zero_grad running every step after tinylm has freed the gradients (a profiler record and a
    pass over the parameters for nothing: 0.2-0.3 ms of a 2-core CPU's step), and a gradient that is left (a step
    interrupted before its optimizer step) not being cleared by it before the next backward."""
    calls = []
    zero_grad = torch.optim.AdamW.zero_grad
    monkeypatch.setattr(torch.optim.AdamW, "zero_grad", lambda opt, *a, **k: calls.append(1) or zero_grad(opt, *a, **k))
    torch.manual_seed(0)
    module = TinyLM(**TINY)
    _trainer(max_steps=3).fit(module, _batches(3))
    assert len(calls) == 3  # tinylm's own, after each optimizer step; none of Lightning's before each backward
    optimizer = module.trainer.optimizers[0]
    module.optimizer_zero_grad(0, 0, optimizer)
    assert len(calls) == 3
    next(module.parameters()).grad = torch.ones_like(next(module.parameters()))
    module.optimizer_zero_grad(0, 0, optimizer)
    assert len(calls) == 4 and all(p.grad is None for p in module.parameters())


def test_adamw_steps_with_the_clipped_gradient():
    """Catches gradient clipping that is never applied (the pre-clip norm is logged, then the step uses the raw
    gradients): with gradient_clip_val=1e-3 the gradients AdamW steps with must have total norm <= 1e-3, while
    train/grad_norm (logged before clipping) is far above it."""
    torch.manual_seed(0)
    module = rec = _SteppedGrads(**TINY, lr=1e-3, warmup_steps=0)
    raw = _Recorder()
    trainer = _trainer(max_steps=3, gradient_clip_val=1e-3, callbacks=[raw])
    trainer.fit(module, _batches(3))
    assert len(rec.norms) == 3
    assert all(n <= 1e-3 * (1 + 1e-4) for n in rec.norms), rec.norms
    assert all(n > 1e-2 for n in raw.norms)  # guard: the raw gradients really were clipped (>10x the bound)
    assert trainer.callback_metrics["train/grad_norm"].item() == pytest.approx(raw.norms[-1], rel=1e-4)


def test_prefix_lm_validation_scores_the_training_targets():
    """Catches validation of a prefix-LM counting the prefix positions that training leaves out (they see their
    own target): val/loss on a batch must be the training loss `_loss` gives that batch."""
    torch.manual_seed(0)
    P = 6
    module = TinyLM(**TINY, attn_mask="prefix", prefix_len=P)
    x, y = next(iter(_batches(1, B=4)))
    (metrics,) = _trainer(limit_val_batches=None).validate(module, DataLoader(TensorDataset(x, y), batch_size=4),
                                                            verbose=False)
    with torch.no_grad():
        loss, logits = module._loss((x, y)), module(x)
    assert metrics["val/loss"] == pytest.approx(loss.item(), rel=1e-5)
    every_position = F.cross_entropy(logits.reshape(-1, 50), y.reshape(-1)).item()
    assert abs(every_position - loss.item()) > 1e-3  # guard: counting the prefix too would give another number


def test_val_loss_is_the_token_weighted_mean_over_batches():
    """Catches val/loss averaging the batch means (a last, smaller batch weighing as much as a full one): 5
    windows in batches of 4 then 1 must give the mean cross-entropy over all 5 x 16 targets."""
    torch.manual_seed(0)
    module = TinyLM(**TINY)
    g = torch.Generator().manual_seed(3)
    data = torch.randint(0, 50, (5, 17), generator=g)
    data[4] = 7  # the lone last window: a constant run, whose loss is far from the random windows'
    x, y = data[:, :-1], data[:, 1:]
    loader = DataLoader(TensorDataset(x, y), batch_size=4)
    assert [len(b[0]) for b in loader] == [4, 1]
    (metrics,) = _trainer(limit_val_batches=None).validate(module, loader, verbose=False)
    module.eval()
    with torch.no_grad():
        nats = F.cross_entropy(module(x).reshape(-1, 50), y.reshape(-1), reduction="none").reshape(5, 16)
    assert metrics["val/loss"] == pytest.approx(nats.mean().item(), rel=1e-5)
    batch_means = (nats[:4].mean() + nats[4].mean()) / 2
    assert abs(batch_means - nats.mean()) > 1e-3  # guard: the unweighted mean is another number


class _TwoCorpora(L.LightningDataModule):
    """A mixture's validation (what on_validation_epoch_end reads): corpora `a` and `b`, each the same batch of 16
    windows 200 times."""

    val_names = ["a", "b"]

    def val_dataloader(self):
        data = torch.randint(0, 50, (16, 17), generator=torch.Generator().manual_seed(3)).repeat(200, 1)
        return [DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=16) for _ in self.val_names]


def test_val_loss_of_each_corpus_is_summed_in_float64():
    """Catches a mixture's val/loss/NAME summed over its batches in float32 (val/loss's own sums are float64, as a
    float32 sum drifted over ~1M batches: 3.3085 for 3.3000): 200 batches already put it 1.3e-6 off the exact
    mean, 40x the rounding of the logged float32; the drift grows with the batches."""
    torch.manual_seed(0)
    module = TinyLM(**TINY)
    metrics = _trainer(limit_val_batches=None).validate(module, datamodule=_TwoCorpora(), verbose=False)[0]
    x, y = next(iter(_TwoCorpora().val_dataloader()[0]))
    with torch.no_grad():
        nats = F.cross_entropy(module(x).reshape(-1, 50), y.reshape(-1), reduction="none")  # as validation_step
    exact = nats.double().sum().item() / nats.numel()  # the mean of 200 copies of the same batch
    assert metrics["val/loss/a"] == metrics["val/loss/b"] == pytest.approx(exact, rel=1e-7)


def test_compile_model_compiles_the_model_and_the_loss_as_one_graph(monkeypatch):
    """Catches the training loss running eagerly on the compiled model's logits: it wrote the (B, T, V) logits again
    in fp32 and read them back twice, ~10 % of a GPT-2 124M step on an H200 (docs/gpu/README.md). The compile must
    hold the model and the cross-entropy in one graph (no break) and give eager's loss and gradients. aot_eager runs
    dynamo and AOT autograd without generating kernels (inductor takes ~30 s for this model on a CPU)."""
    import functools

    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=counter))
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = TinyLM(**TINY, compile_model=True, attn_mask="prefix", prefix_len=4)
    x, y = next(iter(_batches(1)))
    want = module._loss((x, y))
    want_grads = torch.autograd.grad(want, list(module.parameters()))
    module.configure_model()
    got = module._loss((x, y))
    got_grads = torch.autograd.grad(got, list(module.parameters()))
    assert counter.frame_count == 1  # one graph: the model's forward and the loss
    assert "cross_entropy" in counter.graphs[0].code
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grads, want_grads)
    assert list(module.state_dict()) == list(TinyLM(**TINY).state_dict())  # keys unchanged by the compile


def test_train_loss_goes_to_the_host_after_the_optimizer_step(monkeypatch):
    """Catches the step's loss copied to the host (`.cpu()`: on a GPU, a wait for every queued kernel) before the
    optimizer step: the host then waited for the backward while the GPU, once done, idled until clipping and the
    optimizer were queued. nanoGPT reads its loss after the step; so does tinylm, with the same value logged."""
    events, log = [], TinyLM.log

    def recording_log(self, name, value, *args, **kwargs):
        if name == "train/loss":
            events.append(("train/loss", float(value)))
        return log(self, name, value, *args, **kwargs)

    monkeypatch.setattr(TinyLM, "log", recording_log)
    losses = []
    handle = register_optimizer_step_post_hook(lambda *_: events.append(("step", None)))
    torch.manual_seed(0)
    module = TinyLM(**TINY, lr=1e-3, warmup_steps=0)
    step = module.training_step

    def recorded_step(*args):
        loss = step(*args)
        losses.append(loss.item())
        return loss

    monkeypatch.setattr(module, "training_step", recorded_step)
    try:
        _trainer(max_steps=3, accumulate_grad_batches=2).fit(module, _batches(6))
    finally:
        handle.remove()
    assert [kind for kind, _ in events] == ["step", "train/loss"] * 3
    want = [(losses[2 * i] + losses[2 * i + 1]) / 2 for i in range(3)]  # the mean over the step's micro-batches
    assert [v for kind, v in events if kind == "train/loss"] == pytest.approx(want, rel=1e-5)


def test_a_model_with_fewer_ids_than_its_data_modules_tokenizer_is_named(tmp_path):
    """Catches TinyLM(vocab_size=50) on a data module whose char tokenizer has more ids failing in the loss with
    torch's "IndexError: Target 55 is out of bounds" (or a CUDA device assert), in fit and in validate."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(chr(ord("!") + i % 60) for i in range(3000)), encoding="utf-8")
    dm = TinyLMDataModule(corpus=str(corpus), tokenizer="char", block_size=16, batch_size=2,
                          cache_dir=str(tmp_path / "cache"))
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    model = TinyLM(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16)
    for run in (trainer.fit, trainer.validate):
        with pytest.raises(ValueError, match=r"the model has vocab_size 50 but the data module's tokenizer 'char' "
                                             r"has 60 ids; pass TinyLM\(vocab_size=datamodule.vocab_size"):
            run(model, datamodule=dm)
    fits = TinyLM(vocab_size=dm.vocab_size + 4, block_size=16, n_layer=1, n_head=2, n_embd=16)  # more rows: fine
    trainer.fit(fits, datamodule=dm)
    assert trainer.global_step == 1


@pytest.mark.parametrize(("name", "value"), [("warmup_steps", 1.5), ("decay_steps", 10.0), ("prefix_len", 2.0)])
def test_step_counts_must_be_whole_numbers(name, value):
    """Catches TinyLM(warmup_steps=1.5) accepted (the schedule then warms up over a fractional step count)."""
    extra = {"attn_mask": "prefix"} if name == "prefix_len" else {}
    with pytest.raises(ValueError, match=rf"model.{name} must be a whole number in .*, got {value}"):
        TinyLM(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=16, **{name: value}, **extra)


def test_no_float64_state_moves_to_mps(monkeypatch):
    """MPS has no float64: moving a float64 tensor there is a TypeError (pytorch#122602), and Lightning moves the
    module to MPS whenever a Mac has it (accelerator auto). The validation sums go in float32 there; 'meta' stands in
    for MPS (no MPS on the test machine)."""
    import tinylm.train.module as module_mod
    from tinylm.device import wide_dtype

    assert wide_dtype(torch.device("mps")) == torch.float32 and wide_dtype(torch.device("cpu")) == torch.float64
    monkeypatch.setattr(module_mod, "wide_dtype", lambda d: torch.float32 if d.type in ("mps", "meta")
                        else torch.float64, raising=False)
    moved = TinyLM(**TINY).to("meta")
    states = [getattr(m, k) for m in (moved.val_loss, moved.val_text_nats, moved.val_text_bytes) for k in m._defaults]
    assert states and all(t.device.type == "meta" and t.dtype != torch.float64 for t in states)
    on_cpu = TinyLM(**TINY).to("cpu")  # where float64 exists the sums keep it
    assert on_cpu.val_text_nats.dtype == on_cpu.val_text_bytes.dtype == torch.float64


@pytest.mark.parametrize("convert", ["half", "bfloat16", "float", "double"])
def test_a_dtype_change_on_mps_moves_no_float64_state_there(monkeypatch, convert):
    """Catches TinyLM._apply learning the target device from a CPU probe: a dtype change of a module already on MPS
    (`model.to("mps")` then `.half()` / `.to(torch.bfloat16)`, Lightning's bf16-true on a model placed first) gave
    the validation sums back float64 there, a TypeError on MPS. 'meta' stands in for MPS, as above."""
    import tinylm.train.module as module_mod

    monkeypatch.setattr(module_mod, "wide_dtype", lambda d: torch.float32 if d.type in ("mps", "meta")
                        else torch.float64, raising=False)
    moved = getattr(TinyLM(**TINY).to("meta"), convert)()
    states = [getattr(m, k) for m in (moved.val_text_nats, moved.val_text_bytes) for k in m._defaults]
    assert states and all(t.device.type == "meta" and t.dtype != torch.float64 for t in states)
