"""`tinylm plan`: the arithmetic of a run (parameters, FLOPs, tokens, Chinchilla, memory) and the command."""

import json

import pytest
import torch

from tinylm.cli import main
from tinylm.model import GPT, GPTConfig
from tinylm.studies.plan import (
    MEMORY_PARTS,
    compute_optimal,
    draw_plan,
    element_sizes,
    frontier_points,
    memory,
    memory_bars,
    memory_in_name,
    plan,
)


def _gpt(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{"vocab_size": 64, "block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 64,
                            "pad_vocab_multiple": 1, **kw}))


def test_compute_optimal_by_hand():
    """Chinchilla's rule: C = 6 N D with D = 20 N, so C = 120 N^2; a slip (6 vs 120, sqrt missing) moves the
    recommended size by orders of magnitude."""
    n, d = compute_optimal(120 * 1e6**2)
    assert n == pytest.approx(1e6) and d == pytest.approx(2e7)


def test_plan_tokens_flops_and_params():
    """Tokens per step are micro-batch x accumulation x devices x context (a missing factor misplans the run's
    length and cost by that factor); the run's FLOPs are FLOPs/token x tokens; the non-embedding count leaves
    out exactly the token and position tables."""
    model = _gpt()
    p = plan(model, batch_size=3, accumulate=4, devices=2, max_steps=10, precision="32-true", gpu="h100",
             mfu=0.5, peak_flops=1e15)
    assert p.tokens_per_step == 3 * 4 * 2 * 32 and p.tokens == 10 * p.tokens_per_step
    assert p.run_flops == pytest.approx(model.flops_per_token() * p.tokens)
    assert p.params == sum(q.numel() for q in model.parameters())
    assert p.params - p.non_embedding_params == 64 * 64 + 32 * 64
    assert p.tokens_per_param == pytest.approx(p.tokens / p.params)
    assert p.wall_seconds == pytest.approx(p.run_flops / (2 * 1e15 * 0.5))
    # Chinchilla's optimum spends this run's 6ND (not the attention FLOPs too: at 20 tokens/param the run is it)
    assert p.chinchilla_flops == 6 * p.params * p.tokens  # in --json too: what optimal_params spends
    assert (p.optimal_params, p.optimal_tokens) == pytest.approx(compute_optimal(p.chinchilla_flops))
    at_20 = plan(model, batch_size=1, accumulate=1, devices=1, max_steps=round(20 * p.params / 32),
                 precision="32-true", gpu="h100", mfu=0.5, peak_flops=1e15)
    assert at_20.optimal_params == pytest.approx(p.params, rel=0.01)
    untied = plan(_gpt(tie_embeddings=False), batch_size=1, accumulate=1, devices=1, max_steps=1,
                  precision="32-true", gpu="h100", mfu=0.5, peak_flops=1e15)
    assert untied.non_embedding_params == p.non_embedding_params  # the untied LM head is a vocabulary matrix too


def test_memory_states_by_precision_and_checkpointing():
    """Weights, gradients and AdamW's two moments are 4 + 4 + 8 bytes per parameter in fp32 (2 + 2 + 4 in
    bf16-true; mixed keeps fp32 states plus 16-bit matrix copies); FSDP splits them; checkpointing shrinks only
    the activations."""
    model = _gpt()
    n = model.num_params()
    fp32 = memory(model, batch_size=4, precision="32-true", checkpointing=False)
    assert (fp32.weights, fp32.gradients, fp32.optimizer) == (4 * n, 4 * n, 8 * n)
    bf16 = memory(model, batch_size=4, precision="bf16-true", checkpointing=False)
    assert (bf16.weights, bf16.optimizer) == (2 * n, 4 * n) and bf16.activations < fp32.activations
    mixed = memory(model, batch_size=4, precision="bf16-mixed", checkpointing=False)
    assert mixed.weights > fp32.weights and mixed.optimizer == fp32.optimizer
    sharded = memory(model, batch_size=4, precision="32-true", checkpointing=False, shards=4)
    assert sharded.optimizer == 2 * n
    deep = _gpt(n_layer=8)  # 8 block inputs + one block recomputed, against 8 blocks' saved tensors
    full = memory(deep, batch_size=4, precision="32-true", checkpointing=False)
    ckpt = memory(deep, batch_size=4, precision="32-true", checkpointing=True)
    assert ckpt.activations < full.activations / 2 and ckpt.optimizer == full.optimizer
    assert element_sizes("16-mixed") == (4, 2) and element_sizes("32") == (4, 4)
    assert element_sizes("64-true") == element_sizes("64") == (8, 8)  # was planned as fp32: half the memory
    # a logit soft-cap keeps one more fp32 tensor of the logits' size alive (its tanh's input)
    capped = memory(_gpt(logit_softcap=15.0), batch_size=4, precision="32-true", checkpointing=False)
    assert capped.activations - fp32.activations == 4 * 32 * 64 * 4  # batch x block x vocab x fp32
    # RoPE keeps q and k rotated apart from the projection's output: 2 x n_embd more per token and layer
    rope = memory(_gpt(positions="rope"), batch_size=4, precision="32-true", checkpointing=False)
    assert rope.activations - fp32.activations == 2 * (4 * 32) * (2 * 64) * 4  # layers x tokens x 2C x fp32


@pytest.mark.parametrize("tie", [True, False])
def test_mixed_precision_counts_the_16_bit_copies_autocast_keeps(tie):
    """Catches bf16-mixed's weights counting a 16-bit copy of the token table of an untied model and of the
    position table: autocast casts the weights of matmuls (the Linear layers, the tied head) and keeps those for the
    backward pass, never an embedding's, which a lookup reads in fp32 (2 V x C bytes too many for an untied head:
    77 MB for GPT-2's vocabulary). The copies are found in what autograd saves during a real forward pass."""
    from tinylm.train.module import token_loss

    model = _gpt(vocab_size=512, tie_embeddings=tie)
    weights = {p.data_ptr(): p for p in model.parameters() if p.dim() >= 2}
    kept = {}

    def pack(t: torch.Tensor) -> torch.Tensor:  # a 16-bit tensor equal to a weight cast down (or its transpose)
        for ptr, p in weights.items():
            low = p.detach().to(torch.bfloat16)
            if t.dtype == torch.bfloat16 and any(t.shape == w.shape and torch.equal(t, w) for w in (low, low.t())):
                kept[ptr] = t.numel() * t.element_size()
        return t

    x = torch.randint(0, 512, (2, 32))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        token_loss(model, x, x, None)
    assert len(kept) == 4 * 2 + 1  # every block's 4 matrices and the head's (not a vacuous search)
    fp32 = memory(model, batch_size=2, precision="32-true", checkpointing=False)
    mixed = memory(model, batch_size=2, precision="bf16-mixed", checkpointing=False)
    assert mixed.weights - fp32.weights == sum(kept.values())


def test_muon_under_fsdp2_counts_the_whole_hidden_matrices_each_rank_gathers():
    """Catches plan's step peak for Muon under FSDP2 without the hidden matrices' updates each rank gathers whole
    (and a buffer of each for its result): `fits_on` then chose a strategy that ran out of memory in the step."""
    from tinylm.train.optim import split_params

    model = _gpt()
    hidden = sum(p.numel() for p in split_params(model)[0])
    one = memory(model, batch_size=1, precision="32-true", checkpointing=False, optimizer="muon", shards=1, fsdp=True)
    two = memory(model, batch_size=1, precision="32-true", checkpointing=False, optimizer="muon", shards=2)
    step = lambda m: m.weights + m.optimizer + m.gradients  # noqa: E731 (the step's states, before Muon's own)
    assert two.peak - step(two) == one.peak - step(one) + 4 * hidden  # fp32: the gathered copy of each matrix


MODERN = {"positions": "rope", "norm": "rmsnorm", "qk_norm": True, "mlp": "relu2", "tie_embeddings": False,
          "logit_softcap": 15.0, "optimizer": "muon"}


@pytest.mark.parametrize(("ckpt", "accumulate", "arch", "batch"), [
    (False, 1, {}, 4), (True, 1, {}, 4), (False, 2, {}, 4), (True, 2, {}, 4), (False, 1, MODERN, 4),
    (True, 1, MODERN, 1),  # Muon's step is the peak here
    (False, 1, {"mlp": "swiglu"}, 4),
    (False, 1, {"vocab_size": 8192}, 1), (False, 2, {"vocab_size": 8192}, 1),  # the tied table's two gradients
    (False, 1, {"vocab_size": 8192, "precision": "64-true"}, 8),  # the head's logits in fp64, not fp32
    # one recomputed block's 16-bit weight copies alive in the backward pass, not every block's (all: 1.108x)
    (True, 1, {"precision": "bf16-mixed", "n_layer": 8, "n_embd": 128, "within": 0.03}, 4),
    # dropout on a CPU: its masks, and SDPA's math path (B x H x T x T weights; left out: 0.74x, 0.68x mixed)
    (False, 1, {"dropout": 0.2, "n_head": 8}, 16),
    (False, 1, {"dropout": 0.2, "n_head": 8, "precision": "bf16-mixed"}, 16),
], ids=["plain", "ckpt", "accumulate", "ckpt-accumulate", "modern", "modern-ckpt-small-batch", "swiglu",
        "tied-large-vocab", "tied-large-vocab-accumulate", "fp64-large-vocab", "ckpt-mixed-deep", "dropout",
        "dropout-mixed"])
def test_memory_estimate_matches_measured_peak(ckpt, accumulate, arch, batch):
    """The estimate is within 10% (``within``) of the measured peak of live tensors in the third optimizer step of a
    real Lightning training run. Would fail: gradients kept until the next forward (Lightning's own order), the
    accumulated gradients left out, every checkpointed block's 16-bit weight copies counted in the backward pass,
    the modern options' extra saved tensors or Muon's step memory left out, a wrong activation count, a missing
    optimizer state or the head's logits (under 64-true: counted in fp32). Measured with the torch profiler's
    memory timeline, as benchmarks/bench_memory.py does for larger models."""
    import lightning as L
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    from tinylm.train.module import TinyLM

    class Peak(L.Callback):  # profiles the batches of optimizer step 2 (steps 0 and 1 made the optimizer states)
        first, last, bytes = 2 * accumulate, 3 * accumulate - 1, None

        def on_train_start(self, trainer, module):
            # one Newton–Schulz iteration instead of Muon's 5: each frees the last one's tensors, so the peak is the
            # same to the byte, and the bf16 matmuls (~30x slower than fp32 on a CPU without bf16 units) take 4x less
            for group in trainer.optimizers[0].param_groups:
                if "ns_steps" in group:
                    group["ns_steps"] = 1

        def on_train_batch_start(self, trainer, module, batch, i):
            if i == self.first:
                self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                                    with_stack=True)
                self.prof.__enter__()

        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            if i == self.last:
                self.prof.__exit__(None, None, None)
                timeline = MemoryProfileTimeline(self.prof._memory_profile())
                self.bytes = max(sum(s) for s in timeline._coalesce_timeline(torch.device("cpu"))[1])
                trainer.should_stop = True

    torch.manual_seed(0)
    arch = {"vocab_size": 64, "n_layer": 2, "n_embd": 256, **arch}
    precision, within = arch.pop("precision", "32-true"), arch.pop("within", 0.10)
    module = TinyLM(block_size=64, n_head=arch.pop("n_head", 2), pad_vocab_multiple=1, activation_checkpointing=ckpt,
                    warmup_steps=0, **arch)
    data = [(x, x) for x in torch.randint(0, arch["vocab_size"], (12, batch, 64))]
    peak = Peak()
    trainer = L.Trainer(max_steps=5, accumulate_grad_batches=accumulate, gradient_clip_val=1.0, callbacks=[peak],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1, precision=precision)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=None))
    est = memory(module.model, batch_size=batch, precision=precision, checkpointing=ckpt, accumulate=accumulate,
                 optimizer=arch.get("optimizer", "adamw")).peak
    assert abs(est / peak.bytes - 1) < within, (est, peak.bytes)


def test_plan_of_a_rope_model_without_a_position_table(run_config, capsys):
    """Catches `tinylm plan` assuming a learned position table: every RoPE config (the shipped *-modern.yaml)
    crashed with an AttributeError on `wpe`; its non-embedding count leaves out the token table alone."""
    model = _gpt(positions="rope")
    p = plan(model, batch_size=1, accumulate=1, devices=1, max_steps=1, precision="32-true", gpu="cpu", mfu=0.5,
             peak_flops=None)
    assert p.params - p.non_embedding_params == 64 * 64
    main(["plan", "--config", str(run_config(model={"positions": "rope", "norm": "rmsnorm"})), "--json"])
    assert json.loads(capsys.readouterr().out)["params"] > 0


def test_muon_optimizer_memory_is_what_its_state_holds():
    """Catches the plan counting AdamW's two moments for Muon's matrices, which keep one momentum buffer: the
    estimate must equal the bytes of the optimizer state after a real step."""
    from tinylm.train.optim import build_optimizer

    model = _gpt()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt = build_optimizer(model, optimizer="muon", lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), muon_lr=0.02,
                          muon_momentum=0.95, muon_weight_decay=0.0, fused=False)
    opt.step()
    held = sum(t.numel() * t.element_size() for state in opt.state.values() for t in state.values()
               if torch.is_tensor(t) and t.dim() > 0)  # AdamW's step counters are scalars
    estimate = memory(model, batch_size=1, precision="32-true", checkpointing=False, optimizer="muon").optimizer
    assert estimate == held < memory(model, batch_size=1, precision="32-true", checkpointing=False).optimizer


def test_plan_command_json_and_overrides(run_config, capsys):
    """`tinylm plan` reads a fit config as fit does (overrides included) and prints JSON with --json: a plan of
    another model than the one fit would train would be worse than none."""
    cfg = run_config(trainer={"accumulate_grad_batches": 3, "max_steps": 5})
    main(["plan", "--config", str(cfg), "--json", "--model.n_layer", "3", "--gpu", "A100"])
    out = json.loads(capsys.readouterr().out)
    assert out["tokens_per_step"] == 2 * 3 * 16 and out["tokens"] == 5 * 2 * 3 * 16
    assert out["precision"] == "32-true" and out["peak_flops"] > 0  # A100 fp32 from Lightning's table
    main(["plan", "--config", str(cfg), "--json"])
    two_layers = json.loads(capsys.readouterr().out)
    assert two_layers["params"] < out["params"]
    assert two_layers["memory_checkpointed"]["activations"] < two_layers["memory"]["activations"]


@pytest.mark.parametrize("number, string", [("32", "32-true"), ("16", "16-mixed")])
def test_plan_takes_the_precisions_lightning_takes_as_numbers(run_config, capsys, number, string):
    """Catches `--trainer.precision 32` (which fit takes) failing in plan with "argument of type 'int' is not
    iterable": the plan of a number is the plan of its string."""
    cfg = run_config()
    plans = []
    for precision in (number, string):
        main(["plan", "--config", str(cfg), "--json", "--gpu", "H100", "--trainer.precision", precision])
        plans.append(json.loads(capsys.readouterr().out))
    assert plans[0]["peak_flops"] == plans[1]["peak_flops"] > 0 and plans[0]["memory"] == plans[1]["memory"]


def test_plan_command_plans_fsdp(run_config, capsys):
    """`tinylm plan --trainer.strategy fsdp` divides the states by the devices (FSDP2 shards them: measured in
    benchmarks/bench_fsdp2_memory.py), and plans several nodes without a cluster: plan starts no processes, so
    fit's launch checks do not apply to it."""
    cfg = run_config()
    main(["plan", "--config", str(cfg), "--json", "--gpu", "H100", "--trainer.devices", "4"])
    ddp = json.loads(capsys.readouterr().out)
    main(["plan", "--config", str(cfg), "--json", "--gpu", "H100", "--trainer.devices", "4", "--trainer.strategy",
          "fsdp"])
    fsdp = json.loads(capsys.readouterr().out)
    assert fsdp["memory"]["optimizer"] == ddp["memory"]["optimizer"] // 4 and fsdp["devices"] == 4
    main(["plan", "--config", str(cfg), "--json", "--gpu", "H100", "--trainer.devices", "2", "--trainer.num_nodes",
          "2"])
    assert json.loads(capsys.readouterr().out)["devices"] == 4


def test_plan_command_table_and_errors(run_config, capsys):
    """The table names every quantity a learner asks about; bad values are one-line errors naming the option."""
    cfg = run_config()
    main(["plan", "--config", str(cfg), "--gpu", "cpu"])
    out = capsys.readouterr().out
    for word in ("parameters", "FLOPs per token", "tokens per parameter", "compute-optimal", "memory per device",
                 "activation ckpt", "wall time"):
        assert word in out
    with pytest.raises(SystemExit):
        main(["plan", "--config", str(cfg), "--mfu", "2"])
    assert "mfu" in capsys.readouterr().err
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    assert rows["with activation ckpt"].endswith("(--model.activation_checkpointing true)")
    main(["plan", "--config", str(cfg), "--model.activation_checkpointing", "true"])  # which row is the run's
    rows = {line.split("  ")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert rows["with activation ckpt"].endswith("(this run)")
    assert next(v for k, v in rows.items() if k.startswith("memory per device")).endswith("checkpointing false)")
    with pytest.raises(SystemExit):  # was planned as one device (fit refuses it)
        main(["plan", "--config", str(cfg), "--trainer.devices", "0"])
    assert "trainer.devices must be a number of devices (1 or more)" in capsys.readouterr().err
    # a second --config with plan's own options: the fit config's parser would say only "does not accept option"
    own = cfg.parent / "plan.yaml"
    own.write_text("gpu: A100\nmfu: 0.4\n")
    with pytest.raises(SystemExit):
        main(["plan", "--config", str(cfg), f"--config={own}"])
    assert f"{own} sets gpu, mfu, which `tinylm plan` takes as flags: pass --gpu ... --mfu ... on the command line" \
        in capsys.readouterr().err


@pytest.mark.parametrize("devices", ["-1", "[0,1]"])
def test_plan_on_the_cpu_reads_the_devices_as_fit_does(run_config, capsys, devices):
    """Catches a CPU plan of 1 or 2 devices for --trainer.devices -1 or a list of GPU indices, which fit refuses on
    the CPU: plan says fit's own line; a GPU plan (--gpu) takes the GPU indices as devices."""
    from tinylm.cli.trainer_checks import check_trainer_options

    cfg = run_config(trainer={"accelerator": "cpu"})
    with pytest.raises(ValueError) as fit_said:
        check_trainer_options({"accelerator": "cpu", "devices": json.loads(devices), "max_steps": 2}, "fit")
    with pytest.raises(SystemExit):
        main(["plan", "--config", str(cfg), "--trainer.devices", devices])
    assert capsys.readouterr().err.strip().endswith(str(fit_said.value))
    if devices == "[0,1]":
        main(["plan", "--config", str(cfg), "--json", "--gpu", "H100", "--trainer.devices", devices])
        assert json.loads(capsys.readouterr().out)["devices"] == 2


def _png(path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_plot_draws_the_tables_numbers():
    """The picture's bars are the Memory values the table prints (stacked in MEMORY_PARTS order), and its points
    are the run's (N, D) and Chinchilla's optimum on the run's isoFLOP line 6ND: a picture drawn from a second,
    drifting estimate would contradict the text beside it. The device line appears only when its size is known."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    p = plan(_gpt(n_layer=4), batch_size=4, accumulate=2, devices=1, max_steps=100, precision="bf16-mixed",
             gpu="h100", mfu=0.4, peak_flops=1e15)
    bars = memory_bars(p)
    assert list(bars) == ["no checkpointing", "activation checkpointing"]
    assert bars["no checkpointing"] == {k: getattr(p.memory, k) for k in MEMORY_PARTS}
    assert bars["activation checkpointing"]["activations"] == p.memory_checkpointed.activations
    assert bars["activation checkpointing"]["activations"] < bars["no checkpointing"]["activations"]  # not vacuous
    (n, d), (n_opt, d_opt) = frontier_points(p)["run"], frontier_points(p)["optimal"]
    assert (n, d) == (p.params, p.tokens)
    assert 6 * n_opt * d_opt == pytest.approx(6 * n * d) and d_opt == pytest.approx(20 * n_opt)

    fig = Figure()
    draw_plan(fig, p)
    mem_ax = fig.axes[0]
    heights = [r.get_height() for r in mem_ax.patches]  # part by part, each over both bars
    expected = [bars[b][part] / 2**20 for part in MEMORY_PARTS for b in bars]  # MiB: this model is small
    assert heights == pytest.approx(expected)
    assert "MiB" in mem_ax.get_ylabel()
    assert not any(line.get_linestyle() == "--" for line in mem_ax.lines)  # no device memory: no line
    fig = Figure()
    draw_plan(fig, p, device_memory=2**29)
    assert [line.get_ydata()[0] for line in fig.axes[0].lines if line.get_linestyle() == "--"] == [512]


def test_memory_in_name_reads_only_what_the_name_states():
    """The device line comes from the name the user gave ("80GB"), never from a guess: a bare "H100" (80 or 94
    GB?) or "cpu" has no line."""
    assert memory_in_name("NVIDIA H100 80GB HBM3") == 80 * 2**30
    assert memory_in_name("NVIDIA A100-SXM4-40GB") == 40 * 2**30
    assert memory_in_name("H100") is None and memory_in_name("cpu") is None and memory_in_name("GB200") is None


def test_plan_command_writes_png(run_config, tmp_path, capsys):
    """--out writes a PNG (its folder made) after the table; with --json stdout stays one JSON document."""
    pytest.importorskip("matplotlib")
    cfg = run_config()
    png = tmp_path / "pictures" / "plan.png"
    main(["plan", "--config", str(cfg), "--gpu", "cpu", "--out", str(png)])
    out = capsys.readouterr().out
    assert "memory per device" in out and f"wrote {png} and {png.with_suffix('.json')}" in out
    assert _png(png) and json.loads(png.with_suffix(".json").read_text())["chinchilla_flops"] > 0
    again = tmp_path / "plan2.png"
    main(["plan", "--config", str(cfg), "--json", "--out", str(again), "--gpu", "NVIDIA A100-SXM4-40GB"])
    assert json.loads(capsys.readouterr().out)["params"] > 0 and _png(again)


def test_plan_out_keeps_another_commands_picture(run_config, tmp_path, capsys):
    """Catches `tinylm plan --out lr.png` overwriting lr-find's picture and leaving lr-find's lr.json beside
    plan's PNG: refused in one line before any work, as lr-find and scaling refuse another's .json (its own is
    replaced)."""
    cfg = run_config()
    png = tmp_path / "lr.png"
    png.write_bytes(b"lr-find's picture")
    png.with_suffix(".json").write_text(json.dumps({"suggestion": 1e-3, "rule_of_thumb": 6e-4}))
    with pytest.raises(SystemExit):
        main(["plan", "--config", str(cfg), "--gpu", "H100", "--out", str(png)])
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not a `tinylm plan` result" in err and str(png) in err, err
    assert png.read_bytes() == b"lr-find's picture"


def test_a_plan_cut_short_while_it_drew_is_drawn_again(run_config, tmp_path, monkeypatch):
    """Catches the picture written before its numbers: a plan stopped in between (a full disk, a kill) left a PNG
    without its .json, and the rerun refused it as "another file"; the numbers come first."""
    pytest.importorskip("matplotlib")
    from tinylm.studies import plan as plan_module

    cfg, png = run_config(), tmp_path / "p.png"
    drawn = plan_module.plot_plan

    def stopped(*args, **kwargs):
        drawn(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(plan_module, "plot_plan", stopped)
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        main(["plan", "--config", str(cfg), "--gpu", "H100", "--out", str(png)])
    monkeypatch.setattr(plan_module, "plot_plan", drawn)
    main(["plan", "--config", str(cfg), "--gpu", "H100", "--out", str(png)])
    assert png.is_file() and "chinchilla_flops" in json.loads(png.with_suffix(".json").read_text())


def test_plan_command_out_errors(run_config, tmp_path, monkeypatch, capsys):
    """A path that cannot be written, a name that is not a .png and a missing matplotlib are each one line on
    stderr naming the path or the fix, not a traceback from inside matplotlib."""
    cfg = run_config()
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    for bad, said in ((tmp_path / "notes.txt" / "plan.png", "which is a file, not a folder"),
                      (tmp_path / "plan.pdf", "--out must name a .png file"), (tmp_path, "--out must name a .png")):
        if said.startswith("cannot"):
            pytest.importorskip("matplotlib")
        with pytest.raises(SystemExit):
            main(["plan", "--config", str(cfg), "--gpu", "cpu", "--out", str(bad)])
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tinylm plan: error:")]
        assert len(err) == 1 and said in err[0] and str(bad) in err[0], err
    monkeypatch.setitem(__import__("sys").modules, "matplotlib.figure", None)
    with pytest.raises(SystemExit):
        main(["plan", "--config", str(cfg), "--gpu", "cpu", "--out", str(tmp_path / "p.png")])
    assert 'pip install "tinylm[plots]"' in capsys.readouterr().err


def test_gpu_names_match_whole_chip_names_only():
    """Catches `--gpu ""`, `--gpu x` or `--gpu a` planning at some GPU's peak (a fragment matched inside a chip
    name); real names and short chip names still find their peak."""
    from tinylm.device import peak_flops_by_name

    for fragment in ("", "x", "a", "cpu", "nvidia"):
        assert peak_flops_by_name(fragment, "bf16-mixed") is None and peak_flops_by_name(fragment, "32-true") is None
    assert peak_flops_by_name("NVIDIA H100 80GB HBM3", "bf16-mixed") == peak_flops_by_name("h100", "bf16-mixed") > 9e14
    assert peak_flops_by_name("NVIDIA A100-SXM4-40GB", "32-true") == peak_flops_by_name("a100", "32-true") > 1e13
    # nvidia-smi's names with hyphens; no chip found inside another's model number (A40 in A4000, L4 in L40S, H200's
    # figure for an H20)
    assert peak_flops_by_name("Tesla V100-SXM2-16GB", "32-true") == 15.7e12
    assert (peak_flops_by_name("NVIDIA RTX A4000", "bf16-mixed") is None
            and peak_flops_by_name("H20", "bf16-mixed") is None)
    assert peak_flops_by_name("L40S", "32-true") != peak_flops_by_name("L4", "32-true")
    # a short name with its memory, or a chip's name without its "rtx", as `V100` and `T4 16GB` were taken
    assert peak_flops_by_name("V100 32GB", "16-mixed") == peak_flops_by_name("v100", "16-mixed") is not None
    assert peak_flops_by_name("2080 Ti", "16-mixed") == peak_flops_by_name("rtx 2080 ti", "16-mixed") is not None
    assert peak_flops_by_name("80GB", "16-mixed") is None and peak_flops_by_name("080 ti", "16-mixed") is None


@pytest.mark.parametrize("name, precision, tflops", [
    ("NVIDIA H100 80GB HBM3", "32-true", 66.9),  # the SXM part: was None (and "h100" the NVL's two-GPU 133.8)
    ("h100", "32-true", 66.9),
    ("h100", "64-true", 33.5),  # fp64, not fp32's figure
    ("NVIDIA H200 NVL", "bf16-mixed", 835.5),  # not the SXM's 989.5
    ("NVIDIA GH200 480GB", "bf16-mixed", 989.5),  # was unknown
    ("NVIDIA RTX A6000", "bf16-mixed", 154.8),  # tensor cores, not Lightning's vector 38.7: MFU was 4x too high
    ("NVIDIA A40", "16-mixed", 149.7),
    ("NVIDIA GeForce RTX 4080", "bf16-mixed", 97.5),
    ("NVIDIA GeForce RTX 3080", "bf16-mixed", 59.5),
    ("NVIDIA GeForce RTX 3070 Ti", "bf16-mixed", 43.5),  # not the 3070's entry
    ("NVIDIA GH200 480GB", "32-true", 66.9),
    ("v100", "16-mixed", 125.0),
])
def test_peak_flops_are_dense_tensor_core_peaks(name, precision, tflops):
    """Catches MFU and wall times off by 2-4x from a table entry of another form factor, the vector rate, or
    another precision's column."""
    from tinylm.device import peak_flops_by_name

    assert peak_flops_by_name(name, precision) == pytest.approx(tflops * 1e12)


def test_fp32_peak_is_tf32_s_once_matmuls_may_use_it():
    """Catches MFU of a 32-true run with TF32 matmuls on (torch.set_float32_matmul_precision("high")) measured
    against the fp32 peak, 7x too high on an H100; or against the sparse TF32 peak (Lightning's for an H200 and
    an H100 NVL): half its value. An H100 NVL's fp32 peak is one card's, not the pair's."""
    from tinylm.device import peak_flops_by_name

    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert peak_flops_by_name("NVIDIA H100 80GB HBM3", "32-true") == pytest.approx(494.75e12)
        assert peak_flops_by_name("NVIDIA H200", "32-true") == pytest.approx(494.75e12)
        assert peak_flops_by_name("NVIDIA H100 NVL", "32-true") == pytest.approx(417.5e12)
        assert peak_flops_by_name("a100", "32-true") == pytest.approx(156e12)
        assert peak_flops_by_name("a100", "bf16-mixed") == pytest.approx(312e12)  # 16-bit runs are unchanged
    finally:
        torch.set_float32_matmul_precision(before)
    assert peak_flops_by_name("a100", "32-true") == pytest.approx(19.5e12)
    assert peak_flops_by_name("NVIDIA H100 NVL", "32-true") == pytest.approx(60e12)


def test_plan_for_a_gpu_without_bf16_takes_fit_s_precision(run_config, capsys):
    """Catches `tinylm plan --gpu V100` planning bf16-mixed (which fit would not pick there) and so no wall time."""
    main(["plan", "--config", str(run_config(trainer={"precision": None})), "--json", "--gpu", "V100"])
    out = json.loads(capsys.readouterr().out)
    assert out["precision"] == "16-mixed" and out["peak_flops"] == 125e12 and out["wall_seconds"] > 0


def _offline(monkeypatch) -> None:
    """No network: a connection attempt fails at once, as on a machine without one."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("no network in this test")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_plan_of_the_readme_config_needs_neither_data_nor_network(shared_data, monkeypatch, capsys):
    """Catches the README's own `tinylm plan --config configs/gpt2-124m.yaml` failing offline: the config names a
    Hugging Face dataset and GPT-2's tiktoken encoding (downloaded on first use), and sizing the model needs neither.
    The plan equals the one made with GPT-2's real rank file (tiktoken:PATH), and a line says what it read."""
    from pathlib import Path

    config = str(Path(__file__).resolve().parents[2] / "configs" / "gpt2-124m.yaml")
    _offline(monkeypatch)
    main(["plan", "--config", config, "--json", "--gpu", "H100"])  # (this CPU's timing would differ run to run)
    captured = capsys.readouterr()
    offline = json.loads(captured.out)
    assert "vocab_size 50257: tiktoken:gpt2's own size; neither the corpus nor the tokenizer's files" in captured.err
    main(["plan", "--config", config, "--json", "--gpu", "H100", "--data.tokenizer",
          f"tiktoken:{shared_data / 'gpt2.tiktoken'}"])
    assert offline == json.loads(capsys.readouterr().out) and 124e6 < offline["params"] < 125e6


def test_plan_of_a_hub_corpus_offline_asks_the_hub_once(monkeypatch, capsys):
    """Catches `tinylm plan --config configs/tinystories.yaml` with no network waiting ~26 s on `datasets`' retries
    of the hub (28 s in all, a "Retrying in 1s" line each time) before sizing the BPE at its target: the hub is
    asked once, and unreachable, the dataset is read in offline mode (its cache, or a failure at once)."""
    from pathlib import Path

    config = str(Path(__file__).resolve().parents[2] / "configs" / "tinystories.yaml")
    _offline(monkeypatch)
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # (the tests' own; a user's machine has none)
        monkeypatch.delenv(var)
    main(["plan", "--config", config, "--json"])
    err = capsys.readouterr().err
    assert "the hub, https://huggingface.co, cannot be reached and the Hugging Face cache holds no copy" in err, err
    assert "Retrying" not in err


def test_plan_sizes_a_bpe_whose_corpus_is_not_here_at_its_target(run_config, tmp_path, capsys):
    """Catches plan failing on a trained BPE whose corpus cannot be read here (not downloaded, offline): the model
    is sized at data.vocab_size, the most such a tokenizer has, and a line says so."""
    cfg = run_config(data={"corpus": str(tmp_path / "not-here.txt"), "tokenizer": "bpe"})
    plans = {}
    for vocab in (300, 400):
        main(["plan", "--config", str(cfg), "--json", "--gpu", "H100", "--data.vocab_size", str(vocab)])
        captured = capsys.readouterr()
        plans[vocab] = json.loads(captured.out)["params"]
        assert f"vocab_size {vocab}: data.vocab_size, the most a bpe tokenizer trained on" in captured.err
    assert plans[400] - plans[300] == 100 * 32  # tied embeddings of n_embd 32: 100 more rows


def test_plan_of_a_huge_model_builds_no_weights(run_config, capsys):
    """Catches `tinylm plan` building the model's weights (a 40B plan ran > 120 s and took 5 GB): the model is made on
    the meta device, so a 30B+ plan allocates nothing, and the meta model counts what a real one holds (the plan of a
    small config equals a real GPT's count and FLOPs). Nor its blocks: `--model.n_layer 100000` built 100,000 on the
    meta device (minutes); one is built, and the plan counts it 100,000 times."""
    import resource

    from tinylm.cli.fit_config import fit_objects

    cfg = run_config()
    small = ["--config", str(cfg), "--model.n_layer", "3", "--model.n_embd", "48", "--model.n_head", "4",
             "--model.positions", "rope"]
    main(["plan", "--json", *small])
    planned = json.loads(capsys.readouterr().out)
    real = fit_objects(small, trains_here=True).model.model  # built as lr-find builds it: real weights
    assert next(real.parameters()).device.type == "cpu"
    assert planned["params"] == real.num_params() and planned["flops_per_token"] == real.flops_per_token()
    main(["plan", "--json", *small, "--model.n_layer", "100000"])
    deep = json.loads(capsys.readouterr().out)
    block = sum(p.numel() for p in real.transformer.h[0].parameters())
    assert deep["params"] == real.num_params() + 99_997 * block
    attention = 12 * 4 * (48 // 4) * 16  # 12 x heads x head size x block_size, per layer
    assert deep["flops_per_token"] == real.flops_per_token() + 99_997 * (6 * block + attention)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    main(["plan", "--config", str(cfg), "--json", "--model.n_layer", "48", "--model.n_embd", "8192",
          "--model.n_head", "64"])
    huge = json.loads(capsys.readouterr().out)
    assert huge["params"] > 30e9  # 120 GB of fp32 weights, were they built
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300 * 1024


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_memory_of_a_shape_is_the_memory_of_its_gpt(optimizer):
    """Catches the plan of a model counted from one block (GPTShape: plan builds no more) estimating other memory
    than for the GPT built whole: every part, with FSDP2 (one block's gathered copies) and Muon (its per-shape step
    buffers) too."""
    from tinylm.model import GPTShape

    model = _gpt(n_layer=3, mlp="swiglu")
    for shards, fsdp, ckpt in [(1, False, False), (1, True, True), (4, True, False)]:
        kw = {"batch_size": 2, "precision": "bf16-mixed", "checkpointing": ckpt, "shards": shards, "fsdp": fsdp,
              "optimizer": optimizer}
        assert memory(GPTShape.of(model.config), **kw) == memory(model, **kw)


def test_plan_of_a_cpu_run_answers_for_this_cpu(run_config, capsys):
    """Catches the plan of a CPU recipe answering for an H100 (and `--gpu cpu` giving no time): a config that runs on
    the CPU (accelerator cpu, or auto here without CUDA) is timed on this CPU, the table says at what rate and how it
    was measured, and the H100's answer stays beside it."""
    cfg = run_config(trainer={"max_steps": 10, "accelerator": "cpu"})
    main(["plan", "--config", str(cfg), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["gpu"] == "cpu" and out["measured_flops"] > 0 and "training steps of this model" in out["rate"]
    assert out["wall_seconds"] == pytest.approx(out["run_flops"] / out["measured_flops"])
    assert out["step_seconds"] == pytest.approx(out["wall_seconds"] / 10)
    main(["plan", "--config", str(cfg), "--gpu", "cpu"])
    rows = {line.split("  ")[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "on this CPU" in rows["wall time"] and "GFLOP/s" in rows["wall time"]
    assert "H100 at 40% MFU" in next(v for k, v in rows.items() if k.startswith("on a GPU"))
    main(["plan", "--config", str(cfg), "--json", "--gpu", "H100"])  # a named GPU: its peak, no CPU timing
    assert json.loads(capsys.readouterr().out)["measured_flops"] is None


def test_cpu_rate_of_a_large_model_times_a_matmul_only():
    """Catches plan building (and training) a large model to time it on a CPU: beyond the size limit only a matmul
    is timed, its rate x MFU said in words: the product's shape (was the GPTShape's repr, dozens of lines, once the
    plan of a huge n_layer counted the model without building it under the same variable's name)."""
    from tinylm.studies.cpu_rate import measure

    big = GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    rate = measure(big, batch_size=16, precision="32-true", mfu=0.5)
    assert not rate.measured_steps and rate.flops_per_second == pytest.approx(rate.matmul_flops * 0.5)
    assert "measured by a 256x768 @ 768x3072 float32 matmul x 50% MFU" in rate.how


# Per-rank bytes measured by benchmarks/bench_fsdp2_memory.py (8 layers x 512, vocab 8192, micro-batch 2 x 64, fp32,
# AdamW, reshard after forward; torch 2.13 CPU, gloo, 2-core KVM at load ~8; the largest rank's): the states right
# after an optimizer step (the same in every run), and the peak of the next whole step (allocation events of the
# profiler) in three runs: it moves by up to three blocks' buffers with the collectives' timing.
FSDP2_STATES = {1: 471_154_688, 2: 235_577_344, 4: 117_788_672}
FSDP2_PEAKS = {1: (534_231_448, 534_231_048, 534_231_048), 2: (344_938_904, 357_548_040, 382_767_112),
               4: (243_987_864, 256_597_000, 263_098_888)}


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_fsdp2_memory_estimate_matches_the_measured_per_rank_bytes(ranks):
    """Catches the FSDP2 plan drifting from what FSDP2 holds: its states (weights + gradients + AdamW, sharded) equal
    the bytes measured after a step, and its step peak is within 10% of each measured one. It was 0.80-0.88x: the
    whole-gradient and reduce-scatter buffers were not counted, nor FSDP2's gathered parameters on one device; and
    the states were compared with the gathered parameters added (1.18x at 2 ranks)."""
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=8192, block_size=64, n_layer=8, n_head=8, n_embd=512))
    est = memory(model, batch_size=2, precision="32-true", checkpointing=False, shards=ranks, fsdp=True)
    assert est.states == FSDP2_STATES[ranks]
    for peak in FSDP2_PEAKS[ranks]:
        assert abs(est.peak / peak - 1) < 0.10, (est.peak, peak)
    assert est.gathered > 0 and est.weights - est.gathered == 4 * model.num_params() // ranks


def test_plan_says_which_strategy_fits_the_devices():
    """The strategies row's peaks come fastest first (DDP, + checkpointing, FSDP2, + checkpointing) and the verdict
    is the first that fits the device's memory: a learner with 4 x 24 GB cards is told FSDP2 is needed, and why."""
    from tinylm.studies.plan import fits_on

    model = _gpt(n_layer=4)
    p = plan(model, batch_size=4, accumulate=1, devices=4, max_steps=10, precision="32-true", gpu="h100", mfu=0.4,
             peak_flops=1e15)
    names = ["DDP", "DDP + activation ckpt", "FSDP2", "FSDP2 + activation ckpt"]
    assert list(p.strategies) == names and p.strategies["DDP"] == p.memory.peak
    assert p.strategies["FSDP2 + activation ckpt"] < p.strategies["FSDP2"] < p.strategies["DDP"]
    assert fits_on(p, p.strategies["DDP"]) == "DDP"
    assert fits_on(p, p.strategies["FSDP2"]) in names[1:3]
    assert fits_on(p, p.strategies["FSDP2 + activation ckpt"] - 1) is None
    one = plan(model, batch_size=4, accumulate=1, devices=1, max_steps=10, precision="32-true", gpu="h100", mfu=0.4,
               peak_flops=1e15)
    assert list(one.strategies) == names[:2]  # FSDP2 needs devices to shard over


def test_a_gpu_plan_of_a_tiny_model_says_it_is_launch_bound(run_config, capsys):
    """Catches a plan answering 10 us a step on an H100 for a tiny model (its FLOPs at 40 % MFU) without a word:
    such a step is bound by its kernel launches and Python, milliseconds, which no MFU describes."""
    main(["plan", "--config", str(run_config()), "--gpu", "H100"])
    said = capsys.readouterr().out
    assert "2 ms or more: a model this small is bound by its kernel launches and Python" in said  # 2 steps
    main(["plan", "--config", str(run_config(model={"n_layer": 12, "n_head": 12, "n_embd": 768},
                                             data={"block_size": 1024, "batch_size": 16})), "--gpu", "H100"])
    assert "kernel launches" not in capsys.readouterr().out


def test_plan_of_a_prefix_lm_on_the_cpu_times_its_steps(run_config, capsys):
    """Catches `tinylm plan` of a config `fit` trains (attn_mask prefix) ending in "this model uses attn_mask='prefix':
    pass prefix_len": the CPU timing called the model without the run's prefix_len."""
    cfg = run_config(trainer={"max_steps": 4, "accelerator": "cpu"}, model={"attn_mask": "prefix", "prefix_len": 4})
    main(["plan", "--config", str(cfg), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["measured_flops"] > 0 and "training steps of this model" in out["rate"]


def test_plan_of_16_mixed_on_the_cpu_plans_the_bf16_lightning_trains(run_config, capsys):
    """Catches plan timing and labelling a CPU run of 16-mixed in fp16 autocast: Lightning trains it as bf16-mixed
    on a CPU (its own warning says so)."""
    cfg = run_config(trainer={"max_steps": 4, "accelerator": "cpu", "precision": "16-mixed"})
    main(["plan", "--config", str(cfg), "--json"])
    assert json.loads(capsys.readouterr().out)["precision"] == "bf16-mixed"


def test_a_gpu_plan_counts_the_cublas_workspaces_in_every_peak():
    """Catches plan's GPU peak without the two cuBLAS workspaces torch keeps (32 MiB each on Hopper: the forward's
    handle and autograd's backward thread's): on an H200 plan missed 63-83 MiB of max_memory_allocated at every
    size, 0.37x the laptop recipe's measured peak (benchmarks/gpu/plan_memory.py, docs/gpu run 5). A CPU plan has
    none; the printed memory line names them."""
    from types import SimpleNamespace

    from tinylm.cli.plan import format_plan
    from tinylm.studies.plan import CUDA_WORKSPACES

    model = _gpt()
    on = {gpu: plan(model, batch_size=2, accumulate=1, devices=2, max_steps=10, precision="32-true", gpu=gpu,
                    mfu=0.4, peak_flops=1e15) for gpu in ("cpu", "H100")}
    assert CUDA_WORKSPACES == 64 * 2**20
    assert on["cpu"].memory.workspace == 0
    for field in ("memory", "memory_checkpointed"):
        gpu, cpu = getattr(on["H100"], field), getattr(on["cpu"], field)
        assert gpu.peak - cpu.peak == CUDA_WORKSPACES and gpu.workspace == CUDA_WORKSPACES
    assert {k: v - on["cpu"].strategies[k] for k, v in on["H100"].strategies.items()} == \
        dict.fromkeys(on["cpu"].strategies, CUDA_WORKSPACES)
    hp = SimpleNamespace(n_layer=2, n_embd=64, n_head=2, block_size=32, vocab_size=64)
    assert "cuBLAS workspaces 64.0 MiB" in format_plan(on["H100"], hp)
    assert "cuBLAS" not in format_plan(on["cpu"], hp)


@pytest.mark.parametrize("gpu", ["cpu", "H100"])
def test_the_plot_stacks_the_cublas_workspaces_its_peak_counts(gpu):
    """Catches a GPU plan's peak line lifted by the cuBLAS workspaces above bars that leave them out: a one
    micro-batch step (accumulate 1) was labelled 'accumulated gradients stay beside the activations' (the
    shakespeare-char recipe with --gpu, --out). The bars sum to what the peak counts, and the label follows the
    accumulation, on a CPU plan and a GPU one."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    p = plan(_gpt(), batch_size=2, accumulate=1, devices=1, max_steps=10, precision="32-true", gpu=gpu, mfu=0.4,
             peak_flops=1e15)
    bars = memory_bars(p)
    assert bars["no checkpointing"].get("workspace", 0) == p.memory.workspace
    assert ("workspace" in bars["no checkpointing"]) == (gpu != "cpu")
    fig = Figure()
    draw_plan(fig, p)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any(label.startswith("peak (gradients and activations") for label in labels), labels


def test_studies_doc_quotes_plans_strategies_row_for_the_1_5b_recipe(monkeypatch, capsys):
    """docs/studies.md quotes `tinylm plan --config configs/gpt2-1.5b.yaml --gpu "RTX 4090 24GB" --trainer.devices 2`;
    the quoted strategies row must be what plan prints (it went stale when cuBLAS workspaces joined the peak)."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    _offline(monkeypatch)
    main(["plan", "--config", str(repo / "configs" / "gpt2-1.5b.yaml"), "--gpu", "RTX 4090 24GB",
          "--trainer.devices", "2"])
    printed = " ".join(capsys.readouterr().out.split())
    doc = " ".join((repo / "docs" / "studies.md").read_text().split())
    quoted = re.search(r'--trainer\.devices 2` → `\.\.\. (DDP [^`]*)`', doc).group(1)
    assert quoted in printed


def test_plans_durations_read_as_numbers_at_the_unit_boundaries():
    """Catches 0.9996 s said as "1e+03 ms" (milliseconds to 3 digits round up to 1000)."""
    from tinylm.cli.plan import _duration

    said = [_duration(s) for s in (0.0123, 0.9994, 0.9996, 9.96, 119.6, 7199, 172799)]
    assert said == ["12.3 ms", "999 ms", "1 s", "10 s", "120 s", "120 min", "48.0 h"]


def test_distributed_doc_quotes_plans_peaks_for_the_1_5b_recipe(monkeypatch, capsys):
    """docs/distributed.md quotes plan's peak per GPU of `tinylm plan --config configs/gpt2-1.5b.yaml --gpu "H100
    80GB" --trainer.strategy fsdp --trainer.devices N`; each figure must be what plan prints, to its 0.1 GiB (its
    30.2 GiB went stale when plan stopped counting every checkpointed block's 16-bit weights: plan says 29.9)."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    _offline(monkeypatch)
    doc = " ".join((repo / "docs" / "distributed.md").read_text().split())
    quoted = re.search(r"plan's peak per GPU is ([\d.]+) GiB under DDP \(more than a 24 GB card; ([\d.]+) with FSDP2 "
                       r"on one GPU\), ([\d.]+) GiB with FSDP2 on 2 GPUs, ([\d.]+) on 4, ([\d.]+) on 8 \(([\d.]+) GiB "
                       r"per GPU under DDP without activation checkpointing\)", doc).groups()
    printed = {}
    for n in (1, 2, 4, 8):
        main(["plan", "--config", str(repo / "configs" / "gpt2-1.5b.yaml"), "--gpu", "H100 80GB",
              "--trainer.strategy", "fsdp", "--trainer.devices", str(n)])
        out = capsys.readouterr().out
        printed[n] = float(re.search(r"^with activation ckpt +([\d.]+) GiB", out, re.M).group(1))
        ddp, ddp_ckpt = re.search(r"DDP ([\d.]+) GiB, DDP \+ activation ckpt ([\d.]+) GiB", out).groups()
    figures = [float(ddp_ckpt), printed[1], printed[2], printed[4], printed[8], float(ddp)]
    assert [float(q) for q in quoted] == [round(f, 1) for f in figures], (quoted, figures)
