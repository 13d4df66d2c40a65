"""Muon + AdamW as one optimizer: who gets which parameters, both on the schedule, clipping and grad-norm logging
intact, a clear error on torch without Muon. (Exact resume with Muon: tests/test_resume.py.)"""

import copy

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tinylm.train.module import TinyLM
from tinylm.train.optim import MuonAdamW
from tinylm.train.schedules import lr_at

TINY = {"vocab_size": 50, "block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32, "pad_vocab_multiple": 1,
        "optimizer": "muon"}


def _batches(n: int, B: int = 4, T: int = 16, V: int = 50) -> DataLoader:
    data = torch.randint(0, V, (n * B, T + 1), generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=B)


def _trainer(**kw) -> L.Trainer:
    return L.Trainer(**{"accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False,
                            "enable_progress_bar": False, "enable_model_summary": False, "precision": "32-true",
                            "limit_val_batches": 0, "log_every_n_steps": 1} | kw)


class _LRs(L.Callback):
    def __init__(self):
        self.adamw, self.muon = [], []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.adamw.append(optimizer.param_groups[0]["lr"])
        self.muon.append(optimizer.param_groups[-1]["lr"])


@pytest.mark.parametrize("tie", [True, False])
def test_muon_gets_the_hidden_matrices_and_adamw_the_rest(tie):
    """Catches Muon on an embedding or the LM head (which its authors leave to AdamW), a 1-D gain or bias given to
    Muon (it refuses them), or a parameter in no group or in two (a tied embedding counted twice)."""
    module = TinyLM(**TINY, tie_embeddings=tie)
    module.trainer = _trainer(max_steps=4)
    opt = module.configure_optimizers()["optimizer"]
    assert isinstance(opt, MuonAdamW)
    muon = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    adamw = {id(p) for g in opt.adamw.param_groups for p in g["params"]}
    names = {id(p): n for n, p in module.model.named_parameters()}
    assert sorted(names[i] for i in muon) == sorted(
        n for n in names.values() if n.startswith("transformer.h.") and n.endswith("weight") and "ln_" not in n)
    assert len(muon) == 2 * 4  # c_attn, attn.c_proj, c_fc, mlp.c_proj per layer
    assert {names[i]: n for i, n in opt.splits.items()} == {f"transformer.h.{i}.attn.c_attn.weight": 3 for i in (0, 1)}
    assert "transformer.wte.weight" in {names[i] for i in adamw}
    assert ("lm_head.weight" in {names[i] for i in adamw}) == (not tie)
    assert not muon & adamw and muon | adamw == set(names)
    assert [g["optimizer"] for g in opt.param_groups] == ["adamw", "adamw", "muon"]  # train/lr reads AdamW's


def test_both_optimizers_follow_the_schedule_per_optimizer_step():
    """Catches a Muon lr left at its peak (or stepped per micro-batch) while AdamW's decays: under accumulation both
    groups follow warmup + cosine, each at its own peak, once per optimizer step."""
    torch.manual_seed(0)
    module = TinyLM(**TINY, lr=1e-2, min_lr=1e-3, warmup_steps=2, muon_lr=0.05)
    rec = _LRs()
    _trainer(max_steps=6, accumulate_grad_batches=2, callbacks=[rec]).fit(module, _batches(12))
    factor = [lr_at(s, schedule="cosine", lr=1.0, min_lr=0.1, warmup_steps=2, decay_steps=6) for s in range(6)]
    assert rec.adamw == pytest.approx([1e-2 * f for f in factor])
    assert rec.muon == pytest.approx([0.05 * f for f in factor])


def test_grad_norm_and_clipping_cover_every_parameter_with_muon():
    """Catches clipping or the logged grad norm seeing only one of the two optimizers' parameters."""
    torch.manual_seed(0)
    norms = []

    class Norm(TinyLM):
        def configure_gradient_clipping(self, optimizer, *args, **kwargs):  # Lightning clips just before the step
            super().configure_gradient_clipping(optimizer, *args, **kwargs)
            grads = [p.grad.norm() for p in self.parameters() if p.grad is not None]
            norms.append(torch.stack(grads).norm().item())  # the gradients the step uses: clipped

    module = Norm(**TINY, warmup_steps=0)
    trainer = _trainer(max_steps=1, gradient_clip_val=1e-3)
    trainer.fit(module, _batches(1))
    assert trainer.callback_metrics["train/grad_norm"].item() > 1e-2  # the norm before clipping
    assert norms[0] == pytest.approx(1e-3, rel=1e-3)  # every gradient was clipped, Muon's and AdamW's


def test_muon_learns_one_batch():
    """Catches a Muon part that never steps (or steps with lr 0): the model must overfit one batch."""
    torch.manual_seed(0)
    module = TinyLM(**TINY, lr=3e-3, min_lr=3e-3, muon_lr=0.02, warmup_steps=0, lr_schedule="constant",
                    weight_decay=0.0)
    batch = next(iter(_batches(1)))
    loader = DataLoader(TensorDataset(batch[0].repeat(100, 1), batch[1].repeat(100, 1)), batch_size=4)
    _trainer(max_steps=100).fit(module, loader)
    assert module._loss(batch).item() < 0.5


def test_old_torch_without_muon_gets_one_line(monkeypatch):
    """Catches an AttributeError deep in configure_optimizers on torch < 2.9: the message names the fix."""
    monkeypatch.delattr(torch.optim, "Muon", raising=False)  # (absent below torch 2.9)
    module = TinyLM(**TINY)
    module.trainer = _trainer(max_steps=4)
    with pytest.raises(RuntimeError, match=r"torch.optim.Muon \(torch >= 2.9\).*model.optimizer=adamw"):
        module.configure_optimizers()


@pytest.mark.parametrize("bad, match", [({"optimizer": "sgd"},
                                         "unknown model.optimizer 'sgd'; choose one of adamw, muon"),
                                        ({"muon_lr": 0.0}, r"model.muon_lr must be in \(0, inf\)"),
                                        ({"muon_momentum": 1.0}, r"model.muon_momentum must be in \[0, 1\)")])
def test_bad_optimizer_options_raise(bad, match):
    """Catches a typo'd optimizer silently training with AdamW, or a Muon lr/momentum that diverges."""
    with pytest.raises(ValueError, match=match):
        TinyLM(**(TINY | bad))


@pytest.mark.parametrize("nesterov, weight_decay, adjust", [(True, 0.0, "original"), (False, 0.1, "match_rms_adamw")])
def test_batched_muon_step_equals_torch_muon(nesterov, weight_decay, adjust):
    """Catches the batched Newton–Schulz step (`muon_step`) drifting from torch.optim.Muon's own step: a tall
    matrix not transposed back, one matrix's norm used for its whole batch, the lr scaled by the wrong shape,
    momentum or decay applied differently. Square, wide and tall matrices, two of each shape, three steps."""
    from tinylm.train.optim import muon_step

    g = torch.Generator().manual_seed(0)
    shapes = [(32, 32), (96, 32), (32, 128), (128, 32)] * 2
    ours = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    start = [p.detach().clone() for p in ours]
    settings = {"lr": 0.02, "momentum": 0.95, "nesterov": nesterov, "weight_decay": weight_decay,
                "adjust_lr_fn": adjust}
    opt_ours, opt_ref = torch.optim.Muon(ours, **settings), torch.optim.Muon(ref, **settings)
    for _ in range(3):
        for a, b in zip(ours, ref):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        muon_step(opt_ours, ns_dtype=torch.bfloat16)  # torch's precision (on a CPU tinylm's default is fp32)
        opt_ref.step()
    for a, b, a0 in zip(ours, ref, start):
        assert (a - a0).abs().max() > 1e-2  # it moved
        assert (a - b).abs().max() <= 1e-5  # bf16 matmuls: allow an ulp somewhere
    for a, b in zip(ours, ref):
        torch.testing.assert_close(opt_ours.state[a]["momentum_buffer"], opt_ref.state[b]["momentum_buffer"])


def test_muon_orthogonalises_q_k_and_v_of_c_attn_on_their_own():
    """Catches c_attn's stacked q, k, v weights orthogonalised as one (3C, C) matrix (its update then couples the
    three, and is scaled by sqrt(3)) instead of as three (C, C) matrices, as the speedruns' separate weights are:
    the split step must equal torch.optim.Muon on three separate parameters."""
    from tinylm.train.optim import muon_step

    g = torch.Generator().manual_seed(0)
    stacked = torch.nn.Parameter(torch.randn(96, 32, generator=g))
    parts = [torch.nn.Parameter(t.detach().clone()) for t in stacked.detach().chunk(3)]
    ours, ref = (torch.optim.Muon([stacked], lr=0.02, weight_decay=0.1),
                 torch.optim.Muon(parts, lr=0.02, weight_decay=0.1))
    for _ in range(3):
        stacked.grad = torch.randn(stacked.shape, generator=g)
        for p, grad in zip(parts, stacked.grad.chunk(3)):
            p.grad = grad.clone()
        muon_step(ours, {id(stacked): 3}, torch.bfloat16)
        ref.step()
    assert (stacked.detach() - torch.cat([p.detach() for p in parts])).abs().max() <= 1e-5


def test_muon_orthogonalises_in_fp32_on_a_cpu_without_bf16_units():
    """Catches Muon's Newton–Schulz iterations running in bf16 on a CPU without bf16 units, where they are 20-50x
    slower than in fp32 (most laptops'; the laptop recipe's Muon step took 1116 ms instead of 57 on a 2-core AMD EPYC:
    benchmarks/bench_modern.py --ops), and leaving bf16 on a GPU or on a CPU with AMX. MuonAdamW's step must be
    muon_step's in that precision; fp32 must differ from bf16 by bf16's rounding only, and orthogonalise better."""
    from tinylm.train.optim import (
        build_optimizer,
        cpu_has_bf16_units,
        newton_schulz,
        newton_schulz_dtype,
    )

    assert newton_schulz_dtype(torch.device("cuda", 0)) == torch.bfloat16
    cpu = newton_schulz_dtype(torch.device("cpu"))
    assert cpu == (torch.bfloat16 if cpu_has_bf16_units() else torch.float32)
    updates = {}
    for dtype in (None, torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        module = TinyLM(**TINY)
        opt = build_optimizer(module.model, optimizer="muon", lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95),
                              muon_lr=0.02, muon_momentum=0.95, muon_weight_decay=0.0, fused=False)
        opt.ns_dtype = dtype
        params = [p for group in opt.muon.param_groups for p in group["params"]]
        before = [p.detach().clone() for p in params]
        g = torch.Generator().manual_seed(1)
        for p in module.model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
        updates[dtype] = [p.detach() - b for p, b in zip(params, before)]
    for default, fp32, bf16 in zip(updates[None], updates[torch.float32], updates[torch.bfloat16]):
        assert torch.equal(default, fp32 if cpu == torch.float32 else bf16)
        assert (fp32 - bf16).abs().max() > 0  # guard: the two precisions are told apart
        torch.testing.assert_close(fp32, bf16, atol=2e-3, rtol=0.1)
    x = torch.randn(4, 32, 64, generator=torch.Generator().manual_seed(2))
    coefficients = (3.4445, -4.7750, 2.0315)

    def err(o):  # how far o's singular values are from 1 (the quintic iteration leaves them in about [0.7, 1.2])
        s = torch.linalg.svdvals(o.float())
        return (s - 1).abs().max().item()

    assert err(newton_schulz(x, coefficients, 5, 1e-7, torch.float32)) <= err(newton_schulz(x, coefficients, 5, 1e-7))


class _LoggedLRs(L.Callback):
    """train/lr and train/muon_lr as logged for each optimizer step (callback_metrics right after the step)."""

    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        metrics = trainer.callback_metrics
        self.rows.append((metrics["train/lr"].item(), metrics["train/muon_lr"].item()))


def test_logged_muon_lr_follows_its_own_peak_on_the_schedule():
    """Catches train/muon_lr logging AdamW's learning rate (or a constant) instead of Muon's: at every logged
    step it must be train/lr x muon_lr / lr, the schedule's factor times Muon's own peak."""
    torch.manual_seed(0)
    module = TinyLM(**TINY, lr=1e-2, min_lr=1e-3, warmup_steps=2, muon_lr=0.05)
    rec = _LoggedLRs()
    _trainer(max_steps=3, callbacks=[rec]).fit(module, _batches(3))
    assert len(rec.rows) == 3
    assert [muon for _, muon in rec.rows] == pytest.approx([lr * 0.05 / 1e-2 for lr, _ in rec.rows], rel=1e-6)
    assert len({lr for lr, _ in rec.rows}) == 3  # guard: the factor changes from step to step


def test_muon_run_decays_each_group_by_its_own_weight_decay():
    """Catches model.weight_decay not reaching AdamW's matrices under Muon (embeddings and LM head never decayed),
    decay applied to norms and biases, or Muon's matrices decayed by AdamW's rate (or not at all). With every
    gradient zero a step is the decay alone: p * (1 - lr * wd), 1 - 0.01 * 0.1 = 0.999 for AdamW's matrices,
    1 - 0.02 * 0.5 = 0.99 for Muon's, 1 for the 1-D gains and biases."""
    torch.manual_seed(0)
    module = TinyLM(**TINY, tie_embeddings=False, lr=0.01, weight_decay=0.1, muon_lr=0.02, muon_weight_decay=0.5,
                    warmup_steps=0, lr_schedule="constant")
    module.trainer = _trainer(max_steps=4)
    opt = module.configure_optimizers()["optimizer"]
    with torch.no_grad():
        module.model.transformer.h[0].ln_1.bias.fill_(0.5)  # biases start at zero, where a decay would not show
    before = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    for p in module.model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    factors = {"transformer.wte.weight": 0.999, "lm_head.weight": 0.999, "transformer.h.0.attn.c_attn.weight": 0.99,
               "transformer.h.1.mlp.c_proj.weight": 0.99, "transformer.ln_f.weight": 1.0,
               "transformer.h.0.ln_1.bias": 1.0}
    params = dict(module.model.named_parameters())
    for name, factor in factors.items():
        assert before[name].abs().max() > 0.01, name  # guard: a decay would show
        torch.testing.assert_close(params[name].detach(), before[name] * factor, rtol=1e-6, atol=0, msg=name)


def test_muon_steps_with_nesterov_momentum():
    """Catches Muon built without Nesterov momentum (the speedruns' setting). A 1x2 matrix's orthogonalised update
    is its momentum direction, scaled to a fixed length, so the direction is checkable by hand: momentum 0.5,
    gradients e1 then e2. Buffer after step 2: 0.5 * (0.5 e1) + 0.5 e2 = (0.25, 0.5); Nesterov's update looks
    ahead: 0.5 * g + 0.5 * buffer = (0.125, 0.75), a ratio of 6 (plain momentum: the buffer, a ratio of 2)."""
    from tinylm.train.optim import build_optimizer

    model = torch.nn.Module()
    model.transformer = torch.nn.Module()
    model.transformer.h = torch.nn.ModuleList([torch.nn.Linear(2, 1)])  # weight: Muon, bias: AdamW
    opt = build_optimizer(model, optimizer="muon", lr=0.01, weight_decay=0.0, betas=(0.9, 0.95), muon_lr=0.1,
                          muon_momentum=0.5, muon_weight_decay=0.0, fused=False)
    weight = model.transformer.h[0].weight
    assert [p is weight for g in opt.muon.param_groups for p in g["params"]] == [True]
    for grad in ([[1.0, 0.0]], [[0.0, 1.0]]):
        start = weight.detach().clone()
        weight.grad = torch.tensor(grad)
        opt.step()
    step = (start - weight.detach())[0]  # the second update, pointing along the Nesterov direction
    assert step[1] / step[0] == pytest.approx(6.0, rel=0.02)  # bf16 Newton–Schulz: within 2%


def test_a_sharded_runs_muon_state_loads_where_one_device_resumes():
    """Catches a Muon + AdamW state saved by FSDP2 (torch.optim's one form over both optimizers' groups, which
    torch.distributed.checkpoint reads) that one device or DDP cannot resume, and one device's (two states)
    that FSDP2 cannot: both forms load into MuonAdamW and give the same next step."""
    from tinylm.train.optim import build_optimizer, flat_state, split_state

    def made():
        torch.manual_seed(0)
        module = TinyLM(**TINY)
        return module, build_optimizer(module.model, optimizer="muon", lr=1e-2, weight_decay=0.1,
                                       betas=(0.9, 0.95), muon_lr=0.02, muon_momentum=0.95, muon_weight_decay=0.0,
                                       fused=False)

    first, opt = made()
    for _ in range(2):
        first._loss(next(iter(_batches(1)))).backward()
        opt.step()
    saved = opt.state_dict()
    flat = flat_state(saved)
    assert set(flat) == {"state", "param_groups"} and len(flat["state"]) == len(opt.state) > 0
    assert [g["optimizer"] for g in flat["param_groups"]] == [g["optimizer"] for g in opt.param_groups]
    assert len(split_state(flat)["muon"]["state"]) == len(saved["muon"]["state"]) > 0
    steps = []
    for state in (saved, flat):
        module, resumed = made()
        module.load_state_dict(first.state_dict())
        resumed.load_state_dict(copy.deepcopy(state))  # a load keeps the very tensors, which a step changes
        module._loss(next(iter(_batches(1)))).backward()
        resumed.step()
        steps.append([p.detach().clone() for p in module.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*steps))


def _reference_muon_update(momentum_update: torch.Tensor) -> torch.Tensor:
    """Muon's orthogonalised update of one matrix, written from Keller Jordan's Muon as nanochat's first
    nanochat/muon.py has it (zeropower_via_newtonschulz5; fp32 here), times its lr scale sqrt(max(1, rows/cols))."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    x = momentum_update.mT if momentum_update.size(0) > momentum_update.size(1) else momentum_update
    x = x / (x.norm() + 1e-7)
    for _ in range(5):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    x = x.mT if momentum_update.size(0) > momentum_update.size(1) else x
    return x * max(1, momentum_update.size(0) / momentum_update.size(1)) ** 0.5


def test_the_muon_recipe_steps_as_the_speedruns_reference():
    """Catches build_optimizer's Muon drifting from the speedruns' recipe that docs/modern.md states: other
    Newton–Schulz coefficients or iterations, Moonshot's lr scale 0.2·sqrt(max(rows, cols)) instead of Keller
    Jordan's sqrt(max(1, rows/cols)), plain momentum, or c_attn's q, k and v orthogonalised as one matrix. Three
    steps of a GPT's block matrices against Muon written from nanochat's muon.py (both in fp32)."""
    from tinylm.model.gpt import GPT, GPTConfig
    from tinylm.train.optim import build_optimizer, split_params

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16, bias=False, mlp="relu2"))
    opt = build_optimizer(model, optimizer="muon", lr=1e-3, weight_decay=0.0, betas=(0.9, 0.95), muon_lr=0.02,
                          muon_momentum=0.95, muon_weight_decay=0.0, fused=False)
    opt.ns_dtype = torch.float32
    names = {id(p): n for n, p in model.named_parameters()}
    hidden = split_params(model)[0]
    assert sorted(names[id(p)].split(".", 3)[-1] for p in hidden) == ["attn.c_attn.weight", "attn.c_proj.weight",
                                                                       "mlp.c_fc.weight", "mlp.c_proj.weight"]
    expected = {id(p): p.detach().clone() for p in hidden}
    buffers = {id(p): torch.zeros_like(p) for p in hidden}
    for _ in range(3):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        for p in hidden:
            buffers[id(p)].lerp_(p.grad, 1 - 0.95)
            nesterov = p.grad.lerp(buffers[id(p)], 0.95)
            parts = nesterov.chunk(3) if names[id(p)].endswith("c_attn.weight") else [nesterov]
            expected[id(p)] -= 0.02 * torch.cat([_reference_muon_update(u) for u in parts])
        opt.step()
    for p in hidden:
        torch.testing.assert_close(p.detach(), expected[id(p)], rtol=0, atol=1e-5, msg=names[id(p)])
