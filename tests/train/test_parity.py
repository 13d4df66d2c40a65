"""One training run through Lightning is the plain nanoGPT loop, step for step: loss / accumulation, backward,
clip by total norm, AdamW with decay on matrices only, the warmup-cosine LR written out by hand."""

import copy
import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tinylm.train.module as module_mod
from tinylm.train.module import TinyLM

TINY = {"vocab_size": 50, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, "pad_vocab_multiple": 1,
        "bias": True, "dropout": 0.0}


@pytest.mark.parametrize("accumulate", [1, 3])
def test_a_run_is_the_plain_loop_step_for_step(monkeypatch, accumulate):
    """Catches a gradient that is the sum (or the last micro-batch's) instead of the mean over the accumulation
    window, clipping applied per micro-batch or after the step, weight decay on biases/norms, and an LR off by one
    step: after three steps the weights must be the plain loop's (foreach AdamW: the same kernels, so bit for bit;
    the fused one differs in the last bits)."""
    monkeypatch.setattr(module_mod, "fused_adamw", lambda device: False)
    steps, B, clip, lr, min_lr = 3, 4, 0.05, 1e-2, 1e-3
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 50, (steps * accumulate * B, 17), generator=g)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    torch.manual_seed(0)
    module = TinyLM(**TINY, lr=lr, min_lr=min_lr, warmup_steps=1, weight_decay=0.1, beta1=0.9, beta2=0.95)
    ref = copy.deepcopy(module.model)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, precision="32-true",
                        limit_val_batches=0, log_every_n_steps=1, max_steps=steps,
                        accumulate_grad_batches=accumulate, gradient_clip_val=clip)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=B))

    # warmup 1, decay over max_steps 3: step 0 at lr·1/2, step 1 at the peak, step 2 halfway down the cosine
    lrs = [lr / 2, lr, min_lr + 0.5 * (lr - min_lr)]
    params = list(ref.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        for m in range(accumulate):
            i = (step * accumulate + m) * B
            logits = ref(x[i : i + B])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), y[i : i + B].reshape(-1))
            (loss / accumulate).backward()
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert norm.item() > 10 * clip  # guard: clipping was active
    assert trainer.callback_metrics["train/lr"].item() == pytest.approx(lrs[-1], rel=1e-12)
    assert trainer.callback_metrics["train/grad_norm"].item() == pytest.approx(norm.item(), rel=1e-6)
    for (name, got), want in zip(module.model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-7, msg=name)
    assert not math.isclose(lrs[1], lrs[2])
