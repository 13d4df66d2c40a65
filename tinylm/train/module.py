"""The LightningModule: loss, AdamW parameter groups, the LR schedule, metrics and logging around `GPT`.

Batches are ``(x, y)`` with ``x`` and ``y`` int64 of shape (B, T) and ``y`` = ``x`` shifted by one token.
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import fields
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.checkpoint import checkpoint
from torchmetrics.aggregation import MeanMetric, SumMetric

from tinylm.checkpoint import CHECKPOINT_FORMAT, tinylm_section
from tinylm.data.loader import IGNORE
from tinylm.device import check_compile_torch, wide_dtype
from tinylm.model import GPT, GPTConfig
from tinylm.model.config import config_fields
from tinylm.model.gpt import Block
from tinylm.model.layers import at_least_fp32
from tinylm.net import model_source
from tinylm.ranges import check_ranges
from tinylm.train.init_from import load_pretrained, own_tokenizer, warn_same_batches
from tinylm.train.optim import SkipFreedZeroGrad, build_optimizer, fused_adamw
from tinylm.train.options import (
    RANGES,
    WHOLE,
    call_options,
    check_choices,
    check_known_options,
    config_options,
    model_option_names,
    save_hyperparameters,
)
from tinylm.train.parallel import broadcast_weights, clip_by_global_norm, is_sharded, shard_gpt
from tinylm.train.schedules import lr_at


def logging_step(trainer: L.Trainer | None) -> bool:
    """Whether the loggers write metrics this optimizer step (every ``trainer.log_every_n_steps``).

    ``self.log`` costs about 1 ms of CPU per call in Lightning 2.6 even when nothing is written; calling it only on
    the steps that are written made the CPU laptop recipe's step ~7% faster (benchmarks/bench_train_step.py).
    """
    connector = getattr(trainer, "_logger_connector", None)
    return True if connector is None else bool(connector.should_update_logs)


def host_scalar(value: float) -> torch.Tensor:
    """A value for ``self.log(..., prog_bar=True)`` as a CPU tensor, so that a GPU run's steps need no host sync.

    Lightning turns a logged Python number into a tensor on the module's device (a blocking copy to the GPU), and
    converts every progress-bar value of the last logging step to a Python number again at the end of *every* batch
    (``_LoggerConnector.on_batch_end``): one ``.item()`` per value per step, each waiting for the step's queued
    kernels. A CPU tensor stays on the CPU (Lightning keeps a tensor's device), so neither happens. Measured with
    ``torch.cuda.set_sync_debug_mode`` (benchmarks/gpu/syncs.py): 4.6 syncs per step that logged nothing before, on an
    H200; tests/gpu/test_gpu.py checks that it is 0."""
    return torch.tensor(float(value), dtype=torch.float64)  # (not the default dtype: bf16 under bf16-true)


def _validation_metrics() -> tuple[MeanMetric, SumMetric, SumMetric]:
    """val/loss's token-weighted mean, and val/bpb's sums (nats / ln 2 / bytes, both over the targets evaluated that
    stand for text, not EOS). A NaN batch makes the validation NaN: torchmetrics' default drops it (a diverged
    model's val/bpb came out 0.0, a perfect score); the mean's NaN is "replaced" by NaN, as its "disable" drops the
    weights too. All in float64: a float32 sum of loss x targets drifted over ~1M batches (3.3085 for 3.3000)."""
    sums = (SumMetric(nan_strategy="disable").set_dtype(torch.float64) for _ in range(2))
    return MeanMetric(nan_strategy=math.nan).set_dtype(torch.float64), *sums


class RecomputedBlock(Block):
    """A `Block` run under torch.utils.checkpoint while training with gradients: only its input is saved, and the
    backward pass runs it again to get what it needs. Evaluation and generation run it as is. A block becomes one by
    its class (``block.__class__ = RecomputedBlock``): the same parameters and state_dict keys, and copies and
    pickles (EMA, ``ddp_spawn``) that carry their own behaviour."""

    def forward(self, x: torch.Tensor, **attn_kwargs: Any) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            return checkpoint(super().forward, x, use_reentrant=False, **attn_kwargs)
        return super().forward(x, **attn_kwargs)


def token_loss(model: GPT, x: torch.Tensor, y: torch.Tensor, prefix_len: int | None = None) -> torch.Tensor:
    """The mean cross-entropy of ``model`` on inputs ``x`` (B, T) and targets ``y`` (B, T), computed in fp32 (also
    under bf16 autocast; in fp64 under 64-true), over the targets that are not IGNORE."""
    logits = model(x, prefix_len=prefix_len)  # (B, T, V)
    return F.cross_entropy(at_least_fp32(logits.reshape(-1, logits.size(-1))), y.reshape(-1), ignore_index=IGNORE)


def _build_gpt(gpt_config: GPTConfig, state: dict | None, activation_checkpointing: bool) -> GPT:
    """The GPT of ``gpt_config`` (with the init_from weights ``state``), or a one-line error when it does not fit in
    memory; with activation checkpointing its blocks recompute their activations in the backward pass."""
    try:
        model = GPT(gpt_config)
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        if not isinstance(e, MemoryError) and "alloc" not in str(e) and "out of memory" not in str(e).lower():
            raise
        raise ValueError(f"the model does not fit in this machine's memory ({gpt_config.n_layer} layers, n_embd "
                         f"{gpt_config.n_embd}, {gpt_config.padded_vocab_size:,} embedding rows): lower "
                         "model.n_embd, model.n_layer or model.pad_vocab_multiple (`tinylm plan --config ...` "
                         "shows a model's size first)") from None
    if state is not None:
        model.load_state_dict(state)
    if activation_checkpointing:  # the model stays a plain GPT: same state_dict keys, no training code in it
        for block in model.transformer.h:
            block.__class__ = RecomputedBlock
    return model


class TinyLM(SkipFreedZeroGrad, L.LightningModule):
    """A GPT language model (nanoGPT by default; modern options below) trained with AdamW (or Muon + AdamW) and a
    warmup + decay learning-rate schedule.

    Its options are GPTConfig's fields (the model: n_layer, n_embd, positions, ...; declared and documented in
    tinylm/model/config.py, given here as ``**config``) and its own below; `tinylm.train.options` merges them into the
    one signature that LightningCLI reads (``--model.*``) and checkpoints save.

    Args:
        prefix_len: With ``attn_mask: prefix``: the first this-many tokens of every training window see each other
            both ways (a prefix-LM); 0 makes it plain causal. The loss counts only the predictions of tokens after
            the prefix (positions >= prefix_len - 1): a prefix position would otherwise see its own target.
        optimizer: ``adamw`` (every parameter) or ``muon``: torch.optim.Muon (torch >= 2.9) for the 2-D matrices
            inside the blocks at ``muon_lr`` (its maths and state; c_attn's q, k, v orthogonalised apart);
            AdamW at ``lr`` for embeddings, LM head, norms and biases. Both follow the LR schedule (the same
            warmup/decay factor times their own peak).
        muon_lr: Muon's peak learning rate. 0.02 as Keller Jordan's Muon reference and nanochat's ``matrix_lr``
            (modded-nanogpt's record runs use 0.05 at a much larger batch).
        muon_momentum: Muon's (Nesterov) momentum, constant; the speedruns warm 0.85 up to 0.95 over 300 steps.
        muon_weight_decay: Muon's decoupled weight decay (applied as lr·wd·W); 0 as in the speedruns' early records
            (now cautious decay: docs/modern.md "What differs from the speedruns").
        lr: Peak learning rate, reached at the end of warmup (with ``optimizer: muon``: the AdamW part's).
        min_lr: Learning rate at the end of the decay (typically lr / 10).
        lr_schedule: ``cosine`` (warmup + cosine decay), ``wsd`` (warmup-stable-decay) or ``constant``.
        warmup_steps: Optimizer steps of linear warmup.
        decay_steps: Optimizer step at which the decay reaches ``min_lr``; defaults to ``trainer.max_steps``.
        decay_fraction: For ``wsd``: the fraction of the run (after warmup) spent decaying.
        weight_decay: AdamW weight decay on matrices and embeddings (never on biases and norm gains); with
            ``optimizer: muon`` only the embeddings and LM head (AdamW's) take it, the blocks' matrices
            muon_weight_decay.
        beta1: AdamW beta1 (the speedruns use 0.8 with Muon; tinylm keeps one default).
        beta2: AdamW beta2 (0.95 for large batches; 0.99 for the tiny char recipes).
        compile_model: ``torch.compile`` the GPT in place (keys in checkpoints stay unchanged), and the training
            step's forward and loss as one graph (the fp32 upcast of the logits fuses into the log-softmax: no fp32
            copy of the (B, T, V) logits is written).
        activation_checkpointing: Keep only each transformer block's input in the forward pass and recompute the
            rest in the backward pass (torch.utils.checkpoint): `tinylm plan` counts a block's activations at
            about 1/17 per layer in fp32 (1/10 under bf16-mixed), for one more forward pass of compute; measured on
            CPU (docs/benchmarks.md): the step's peak memory 37-45 % lower, the step ~1.5x as long.
        fsdp_reshard_after_forward: Under ``--trainer.strategy fsdp`` (FSDP2): free each block's gathered weights
            after its forward pass and gather them again for its backward pass (less memory, one more all-gather
            per block per step); false keeps them from forward to backward. Ignored by other strategies.
        init_from: Start from pretrained weights (a new run, not a resume; as nanoGPT's ``init_from``): a tinylm
            ``.ckpt`` or a Hugging Face GPT-2 / Llama directory (e.g. from ``tinylm export``; OpenAI's own GPT-2
            weights use the tanh GELU, ``gelu_new``, and are refused, see docs/export.md). The architecture
            (n_layer, n_head, n_embd, bias, positions, norm, mlp, ...) comes from the weights and overrides this
            section's; vocab_size and the tokenizer must be the weights' own (a different one is refused).
    """

    _loss_to_log: torch.Tensor | None = None  # the step's train/loss, logged after the optimizer step

    @config_options
    def __init__(
        self,
        *,
        prefix_len: int = 0,
        optimizer: str = "adamw",
        muon_lr: float = 0.02,
        muon_momentum: float = 0.95,
        muon_weight_decay: float = 0.0,
        lr: float = 6e-4,
        min_lr: float = 6e-5,
        lr_schedule: str = "cosine",
        warmup_steps: int = 100,
        decay_steps: int | None = None,
        decay_fraction: float = 0.2,
        weight_decay: float = 0.1,
        beta1: float = 0.9,
        beta2: float = 0.95,
        compile_model: bool = False,
        activation_checkpointing: bool = False,
        fsdp_reshard_after_forward: bool = True,
        init_from: str | None = None,
        **config: Any,
    ) -> None:
        super().__init__()
        options = call_options(TinyLM.__init__, inspect.currentframe())  # its own and GPTConfig's, by name
        vocab_size, block_size = options["vocab_size"], options["block_size"]
        check_choices(options)
        # the frame passed in: Lightning's own lookup keeps a reference cycle through it, which held the caller's
        # locals (data loaders and their worker processes among them) until a garbage collection
        save_hyperparameters(self, options, inspect.currentframe())
        check_ranges("model", self.hparams, RANGES, whole=WHOLE)
        self.muon_lr_ratio: float | None = None  # the LR range test ties Muon's LR to AdamW's (tinylm.studies.lr_find)
        self.lr_range_test = False  # True while the LR range test replaces the schedule (tinylm.studies.lr_find)
        self.range_test_losses: list[float] = []  # each step's loss during it (step_loss)
        self._init_fingerprint = state = None  # the tokenizer the init_from weights were trained with
        # the first weights' absolute source and step (a run saves over last.ckpt), in every checkpoint of the run
        local = None if init_from is None else model_source(init_from, "model.init_from")  # (a Hub name: its folder)
        self.init_source, self.init_step = local and os.path.abspath(local), None
        if local is not None:
            architecture, state, self._init_fingerprint, (self.init_step, self._init_data) = load_pretrained(
                local, vocab_size=vocab_size, block_size=block_size)
            self.hparams.update(architecture)  # the checkpoint's hyperparameters describe the model it holds
        # every GPTConfig field is a TinyLM option of the same name (checkpoint.load_model relies on it too)
        self.model = _build_gpt(GPTConfig(**{f.name: self.hparams[f.name] for f in fields(GPTConfig)}), state,
                                activation_checkpointing)
        self.val_loss, self.val_text_nats, self.val_text_bytes = _validation_metrics()
        self.token_bytes: torch.Tensor | None = None  # (V,) UTF-8 bytes per id, 0 for specials; from the tokenizer
        self.token_bytes_first: torch.Tensor | None = None  # (V,) the same after an EOS, where they differ (▁the)
        self.val_bytes: int | None = None  # the UTF-8 bytes of text the last validation scored
        self.tokenizer_state: dict | None = None  # filled from the data module or the checkpoint
        self.wandb_id: str | None = None  # the run folder's W&B run, kept across resumes that log without W&B
        self.wandb_project: str | None = None  # the project of the run's W&B run, kept as wandb_id is
        self.read_step: int | None = None  # fit: the step of the checkpoint the command read before Lightning loads it
        self.last_grad_norm: torch.Tensor | None = None
        self._step_losses: list[torch.Tensor] = []  # this optimizer step's micro-batch losses so far
        self.step_loss: torch.Tensor | None = None  # the last optimizer step's loss (read by the health monitor)
        # the stability guard's judge (tinylm.train.guard), called with the gradient norm before the update, and its
        # decision: whether the last optimizer step was skipped (a bool tensor; None without the guard)
        self.step_guard, self.step_skipped = None, None
        self._val_parts: dict[int, list] = {}  # dataloader index -> [nats, targets] of this validation

    # ---- model --------------------------------------------------------------------------------------------------
    def _apply(self, fn, *args: Any, **kwargs: Any):
        # Lightning's bf16-true (and 16-/64-true) converts the module with .to(dtype), torchmetrics' states too; the
        # validation sums keep theirs (a bf16 sum stops growing at ~256x its increment: val/loss and bpb were biased)
        # float64 sums, float32 on MPS (none there), probed from where they are (a .half() on MPS stays on MPS)
        wide = wide_dtype(fn(torch.zeros((), device=self.val_text_nats.device)).device)
        for metric in (self.val_loss, self.val_text_nats, self.val_text_bytes) if wide != torch.float64 else ():
            metric.set_dtype(wide)  # before the move
        out = super()._apply(fn, *args, **kwargs)
        for metric in (self.val_loss, self.val_text_nats, self.val_text_bytes):
            if metric.dtype != wide:
                metric.set_dtype(wide)
        return out

    def configure_model(self) -> None:
        sharding = getattr(self, "_device_mesh", None) is not None  # FSDP2 (tinylm.train.parallel.FSDP2Strategy)
        if sharding and not is_sharded(self.model):  # once: configure_model may run again
            self._shard(self._device_mesh)
        if self.hparams.compile_model and not hasattr(self, "_token_loss"):
            check_compile_torch()
            if sharding:  # the blocks were compiled one by one before sharding: the loss runs eagerly around them
                self._token_loss = token_loss
                return
            self.model.compile()  # in place: state_dict keys keep their names (no `_orig_mod.`)
            # the training loss as one graph with the model (dynamo inlines the module compiled above): eagerly on the
            # compiled model's logits it wrote them again in fp32 and read them twice: ~10 % of a 124M step on an H100
            self._token_loss = torch.compile(token_loss)

    def _shard(self, mesh: Any) -> None:
        """FSDP2: every rank starts from rank 0's weights, then each block and the GPT are sharded over ``mesh``
        (compiled block by block first with compile_model, as torchtitan does)."""
        broadcast_weights(self.model)
        if self.hparams.compile_model:
            for block in self.model.transformer.h:
                block.compile()
        precision = str(getattr(self._trainer, "precision", "")) if self._trainer is not None else ""
        shard_gpt(self.model, mesh, reshard_after_forward=self.hparams.fsdp_reshard_after_forward,
                  bf16=precision.startswith("bf16"))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        prefix = self.hparams.prefix_len if self.hparams.attn_mask == "prefix" else None
        return self.model(idx, prefix_len=prefix)

    def _targets(self, y: torch.Tensor) -> torch.Tensor:
        """``y`` (B, T) with IGNORE where the input can see the target. Under the prefix mask position i sees tokens
        0 .. max(i, P - 1) and its target is token i + 1, so positions 0 .. P - 2 see theirs: for P = 4, positions
        0, 1, 2 predict tokens 1, 2, 3 of the prefix they attend to, position 3 predicts token 4 (unseen)."""
        P = self.hparams.prefix_len if self.hparams.attn_mask == "prefix" else 0
        if P < 2:
            return y
        y = y.clone()
        y[:, : P - 1] = IGNORE
        return y

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The mean loss over all counted B*T predictions: every position of every row is a training example,
        except prefix positions that see their own target (copying it would drive their loss to ~0 and teach
        nothing)."""
        x, y = batch  # (B, T), (B, T)
        prefix = self.hparams.prefix_len if self.hparams.attn_mask == "prefix" else None
        return getattr(self, "_token_loss", token_loss)(self.model, x, self._targets(y), prefix)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self._step_losses.append(loss.detach())  # the step's loss is their mean, taken when the optimizer steps
        if logging_step(self.trainer):
            self.log("train/lr", host_scalar(self.current_lr()), prog_bar=True)
            if self.hparams.optimizer == "muon":
                self.log("train/muon_lr", host_scalar(self.current_lr(group=-1)))
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int,
                        dataloader_idx: int = 0) -> None:
        x, y = batch[0], self._targets(batch[1])  # the targets the loss counts, so val/ppl = exp(val/loss)
        logits = self(x)  # (B, T, V)
        nats = F.cross_entropy(at_least_fp32(logits.reshape(-1, logits.size(-1))), y.reshape(-1), ignore_index=IGNORE,
                               reduction="none")  # (B*T,), 0 where ignored
        counted = y.reshape(-1) != IGNORE
        # (a rank's padding batch counts no target: weight 0, and a mean of 0 rather than 0/0)
        self.val_loss.update(nats.sum() / counted.sum().clamp(min=1), weight=counted.sum())
        part = self._val_parts.setdefault(dataloader_idx, [0.0, 0])  # a mixture's corpora: val/loss/NAME each
        part[0], part[1] = part[0] + nats.detach().sum(dtype=wide_dtype(y.device)), part[1] + counted.sum()
        if self.token_bytes is not None:
            ids, table = y.reshape(-1).clamp(min=0), self.token_bytes.to(y.device, wide_dtype(y.device))
            nbytes = table[ids] * counted
            if self.token_bytes_first is not None and self.hparams.get("eos_id") is not None:
                # a document's first token: SentencePiece's "▁Once" stands for "Once" there, " Once" elsewhere
                first = self.token_bytes_first.to(y.device, table.dtype)[ids] * counted
                nbytes = torch.where(x.reshape(-1) == self.hparams.eos_id, first, nbytes)
            self.val_text_nats.update((nats * (nbytes > 0)).sum())  # (a text token's: not an EOS, nor a start's "▁")
            self.val_text_bytes.update(nbytes.sum())

    def on_validation_epoch_end(self) -> None:
        loss = self.val_loss.compute()
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/ppl", loss.exp(), sync_dist=True)  # exp of the token-weighted mean: no second softmax pass
        if self.token_bytes is not None:
            # the nats of the tokens evaluated over the raw UTF-8 bytes they stand for: bits per byte, comparable
            # across tokenizers (an EOS is no text: neither its nats nor bytes count)
            nats, nbytes = self.val_text_nats.compute(), self.val_text_bytes.compute()
            self.log("val/bpb", nats / math.log(2) / nbytes.clamp(min=1), sync_dist=True)
            self.val_bytes = int(nbytes)  # the text scored (all ranks'): what `tinylm validate` says it read
        names = getattr(getattr(self._trainer, "datamodule", None), "val_names", [])
        if len(names) > 1:  # each corpus's nats and targets summed over the ranks (each evaluated a share)
            parts = torch.tensor([[float(p) for p in self._val_parts.get(i, (0.0, 0))] for i in range(len(names))],
                                 dtype=wide_dtype(self.device), device=self.device)  # (corpora, 2): nats, targets
            if self._trainer.world_size > 1:
                parts = self._trainer.strategy.reduce(parts, reduce_op="sum")
            for name, (nats, n) in zip(names, parts):
                self.log(f"val/loss/{name}", (nats / n.clamp(min=1)).float(), sync_dist=True)  # (the same on each)
        self._val_parts = {}
        for metric in (self.val_loss, self.val_text_nats, self.val_text_bytes):
            metric.reset()

    # ---- optimization -------------------------------------------------------------------------------------------
    def lr_now(self) -> float:
        """The learning rate tinylm's schedule gives the optimizer step about to be taken."""
        return self._lr_at(self.global_step)

    def current_lr(self, group: int = 0) -> float:
        """The learning rate the optimizer will use for this step, read from its parameter group ``group`` (the
        first: what `train/lr` logs, the truth even if a callback or a user's scheduler changed it). With Muon the
        first group is AdamW's and the last (-1) Muon's (`train/muon_lr`)."""
        optimizers = self.optimizers(use_pl_optimizer=False) if self._trainer is not None else None
        optimizer = optimizers[0] if isinstance(optimizers, list) else optimizers
        if optimizer is None:
            return self.lr_now() * (self.hparams.muon_lr / self.hparams.lr if group == -1 else 1.0)
        return float(optimizer.param_groups[group]["lr"])

    def _decay_steps(self) -> int | float:
        if self.hparams.decay_steps is not None:
            return self.hparams.decay_steps
        max_steps = self.trainer.max_steps if self._trainer is not None else -1
        if (max_steps is None or max_steps < 1) and self.hparams.lr_schedule != "constant":
            raise ValueError(f"the LR schedule needs a length: set --trainer.max_steps N (got {max_steps}) or "
                             "--model.decay_steps N")
        return max_steps if max_steps and max_steps > 0 else math.inf  # (constant needs none: a run of max_epochs)

    def _lr_at(self, step: int) -> float:
        hp = self.hparams
        return lr_at(
            step,
            schedule=hp.lr_schedule,
            lr=hp.lr,
            min_lr=hp.min_lr,
            warmup_steps=hp.warmup_steps,
            decay_steps=0 if hp.lr_schedule == "constant" else self._decay_steps(),  # constant needs no length
            decay_fraction=hp.decay_fraction,
        )

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        # matrices and embeddings decay; biases and norm gains (1-D) do not. With Muon, one optimizer object holds
        # Muon and AdamW (tinylm/train/optim.py says why): Lightning's clipping, accumulation and checkpoints just work
        optimizer = build_optimizer(
            self.model, optimizer=hp.optimizer, lr=hp.lr, weight_decay=hp.weight_decay, betas=(hp.beta1, hp.beta2),
            muon_lr=hp.muon_lr, muon_momentum=hp.muon_momentum, muon_weight_decay=hp.muon_weight_decay,
            # not under fp16's GradScaler: Lightning leaves unscaling to a fused optimizer's step, so the clipping
            # (tinylm's own, before the step) would see gradients scaled by ~65536
            fused=fused_adamw(self.device) and getattr(self._precision_plugin(), "scaler", None) is None,
        )
        decay_steps = self._decay_steps()  # fail early, before the first step, if the schedule has no length
        fast_dev_run = self._trainer is not None and bool(self.trainer.fast_dev_run)
        if hp.warmup_steps >= decay_steps and not (self.lr_range_test or fast_dev_run):  # those are not the run
            from lightning.pytorch.utilities import rank_zero_warn

            rank_zero_warn(f"model.warmup_steps={hp.warmup_steps} is not below the schedule's length {decay_steps} "
                           f"(model.decay_steps, else trainer.max_steps): the warmup outlasts the run and the LR "
                           f"never reaches model.lr={hp.lr:g}; "
                           + ("lengthen the run (--trainer.max_steps: a resume keeps the run's model options)"
                              if self._trainer is not None and self.trainer.ckpt_path else
                              "lower --model.warmup_steps or lengthen the run"))
        # LambdaLR multiplies each group's own peak lr (AdamW's lr, Muon's muon_lr) by the schedule's factor; it is
        # stepped once per optimizer step, so last_epoch == global_step
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: self._lr_at(step) / hp.lr)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._step_losses:  # the loss of the whole optimizer step, the mean over its micro-batches (on device)
            self.step_loss = torch.stack(self._step_losses).mean()
            self._step_losses = []
            if self.lr_range_test:  # (one host sync a step, as Lightning's own range test has)
                from tinylm.studies.lr_find import diverged

                self.range_test_losses.append(float(self.step_loss))
                if diverged(self.range_test_losses):  # (Lightning's callback passes rank 0's on to every rank)
                    self.trainer.should_stop = True
            if logging_step(self.trainer):  # and over the ranks' (each the same number of windows), so the curve
                loss = self.step_loss  # ignores how the batch is split
                if self.trainer.world_size > 1:
                    loss = self.trainer.strategy.reduce(loss, reduce_op="mean")
                self._loss_to_log = loss  # logged once the optimizer step is queued (optimizer_step says why)
        if self.muon_lr_ratio is not None:  # set by the LR range test only (tinylm.studies.lr_find says why)
            adamw_lr = optimizer.param_groups[0]["lr"]
            for group in optimizer.param_groups:
                if group.get("optimizer") == "muon":
                    group["lr"] = adamw_lr * self.muon_lr_ratio

    def _precision_plugin(self) -> Any:
        return getattr(self._trainer, "precision_plugin", None) if self._trainer is not None else None

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        # Free the gradients as soon as the step has used them, as nanoGPT does. Lightning sets them to None only
        # after the next training_step's forward, so they would stay alive beside that forward's activations:
        # a peak higher by the gradients' size (tinylm.studies.plan's memory model counts this).
        optimizer.zero_grad(set_to_none=True)
        if self._loss_to_log is not None:
            # The copy to the host waits on a GPU for every kernel queued before it. Here, after the optimizer's
            # kernels, as nanoGPT reads its loss: in on_before_optimizer_step it waited for the backward and left the
            # GPU idle while the host queued clipping and the optimizer (benchmarks/bench_fit_overhead.py counts it)
            loss, self._loss_to_log = self._loss_to_log, None
            self.log("train/loss", loss.cpu(), prog_bar=True)  # host_scalar says why on the CPU

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None
    ) -> None:
        # Called on every optimizer step after accumulation and AMP unscaling, before the step: clip_by_global_norm
        # returns the total norm *before* clipping, which is what we want to watch.
        if gradient_clip_algorithm not in (None, "norm"):
            algorithm = getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)  # Lightning passes an enum
            raise ValueError(f"tinylm clips by norm only; got trainer.gradient_clip_algorithm={algorithm!r}: leave it "
                             "unset (or pass 'norm')")
        # a negative max_norm flips every gradient (clip_grad_norm_ scales by max_norm / norm): gradient ascent
        check_ranges("trainer", {"gradient_clip_val": gradient_clip_val}, {"gradient_clip_val": "[0, inf)"})
        max_norm = gradient_clip_val if gradient_clip_val else float("inf")
        norm = clip_by_global_norm(self.model, max_norm, sharded=getattr(self, "_device_mesh", None) is not None)
        self.last_grad_norm = norm.detach()  # read by the health monitor on every step
        if self.step_guard is not None:  # skips the update on the device when the step is not to be applied
            self.step_guard(self, optimizer, self.last_grad_norm)
        if logging_step(self.trainer):
            self.log("train/grad_norm", norm)

    def on_train_start(self) -> None:
        # A resume restores each group's LR as the checkpoint's schedule left it, and LambdaLR sets the schedule's
        # value only at its next step: a run extended without model.decay_steps took its first step at the old
        # schedule's LR. Set the LR of this step now (for an unchanged schedule the very value it had: exact resume).
        for config in self.trainer.lr_scheduler_configs:
            sched = config.scheduler
            if isinstance(sched, torch.optim.lr_scheduler.LambdaLR):
                for group, base, fn in zip(sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas, strict=True):
                    group["lr"] = base * fn(sched.last_epoch)

    # ---- checkpoints carry the tokenizer ------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        self._grab_tokenizer()

    def on_validation_start(self) -> None:
        self._grab_tokenizer()

    def check_init_data(self, dm: Any) -> None:
        """The CLI's checks of init_from's weights against the run's data module ``dm`` before the run writes."""
        self.check_init_tokenizer(getattr(dm, "tokenizer", None))
        if self.init_source is not None:
            warn_same_batches(self.init_source, getattr(self, "_init_data", None), dm)

    def check_init_tokenizer(self, tok: Any) -> None:
        """Refuse to fine-tune model.init_from's weights with another tokenizer than theirs (the ids would mean
        other text). The CLI calls it before the run writes anything; fit start checks again for library users."""
        if tok is not None and self._init_fingerprint not in (None, tok.fingerprint):
            raise ValueError(f"model.init_from {self.hparams.init_from!r} was trained with another tokenizer "
                             f"(fingerprint {self._init_fingerprint[:12]}) than this run's {tok.spec!r} (fingerprint "
                             f"{tok.fingerprint[:12]}); fine-tune with the weights' own tokenizer: "
                             f"{own_tokenizer(self.init_source or self.hparams.init_from)}")

    def _grab_tokenizer(self) -> None:
        dm = getattr(self.trainer, "datamodule", None)
        tok = getattr(dm, "tokenizer", None)
        self.check_init_tokenizer(tok)
        if tok is not None and tok.vocab_size > self.hparams.vocab_size:  # (the loss would fail on the first id past)
            raise ValueError(f"the model has vocab_size {self.hparams.vocab_size:,} but the data module's tokenizer "
                             f"{tok.spec!r} has {tok.vocab_size:,} ids; pass TinyLM(vocab_size=datamodule.vocab_size,"
                             " ...) (`tinylm fit` links it)")
        if tok is not None and self.tokenizer_state is None:
            self.tokenizer_state = tok.state_dict()
        if tok is not None and self.token_bytes is None:
            self.token_bytes = torch.tensor(tok.token_byte_lengths(), dtype=torch.float64)
            first = torch.tensor(tok.token_byte_lengths(first=True), dtype=torch.float64)
            self.token_bytes_first = None if torch.equal(first, self.token_bytes) else first

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from tinylm.train.loggers import wandb_loggers, wandb_project_of

        wandb = wandb_loggers(self.trainer.loggers)
        wandb_id = wandb[0].version if wandb else self.wandb_id
        wandb_project = wandb_project_of(wandb[0]) if wandb else self.wandb_project
        checkpoint["tinylm"] = {**(checkpoint.get("tinylm") or {}),  # (the run's config: tinylm.cli's RunConfig)
                                "format": CHECKPOINT_FORMAT, "tokenizer": self.tokenizer_state, "wandb_id": wandb_id,
                                "wandb_project": wandb_project, "init_from": self.init_source,
                                "init_from_step": self.init_step,
                                "options": model_option_names(),  # (an older tinylm refuses a newer's option)
                                # one CPU process's torch threads: a resume with others sums in another order
                                "cpu_threads": torch.get_num_threads() if self.device.type == "cpu" and
                                self.trainer.world_size == 1 else None}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        meta = tinylm_section(checkpoint)
        saved = checkpoint.get("hyper_parameters", {})
        check_known_options(saved, None, meta.get("options"))  # a newer tinylm's (load_from_checkpoint dropped it)
        shape = (*config_fields("data", "size", "arch"), "optimizer")  # what the weights and optimizer state are
        diffs = [f"{k}: checkpoint {saved[k]!r}, this run {self.hparams[k]!r}" for k in shape
                 if k in saved and saved[k] != self.hparams[k]]
        fitting = self._trainer is None or self._trainer.state.fn == TrainerFn.FITTING
        data = getattr(self._trainer, "datamodule", None) if self._trainer is not None and fitting else None
        if diffs and hasattr(data, "check_same_text") and (state := checkpoint.get(type(data).__qualname__)):
            data.check_same_text(state)  # the text it read changed (a character more: another vocab_size): why
        if diffs:
            from tinylm.checkpoint import CheckpointError

            fix = ("resume with the same data.tokenizer and data.block_size, or start a new run"
                   if fitting else
                   "leave --data.block_size and --data.tokenizer out (of the command and its --config): tinylm "
                   "validate then uses the checkpoint's own")
            raise CheckpointError(f"the checkpoint is for a different model shape ({'; '.join(diffs)}); vocab_size "
                                  f"and block_size come from the data: {fix}")
        from tinylm.checkpoint import check_finite, check_weights

        if resuming := self._trainer is not None and fitting:
            # a resume that splits the global batch another way (devices traded for accumulation) counts its
            # position in the new micro-batches, before Lightning restores the data module and its loops
            resume_split = getattr(self._trainer.datamodule, "resume_split", None)
            if resume_split is not None:
                resume_split(checkpoint)
        # before Lightning's load_state_dict: an edited or merged file is one line naming the tensor (FSDP2's
        # strategy loaded the weights itself, into their shards, and hands no state_dict here)
        if "state_dict" in checkpoint:
            path = getattr(self._trainer, "ckpt_path", None) or "checkpoint"
            check_weights(checkpoint["state_dict"], self.state_dict(), path)
            check_finite(checkpoint["state_dict"], path, optimizer=resuming and checkpoint.get("optimizer_states"))
        self._check_tokenizer(meta.get("tokenizer"))
        self.tokenizer_state = meta.get("tokenizer")
        # the step of the file whose weights these are (a live run's last.ckpt may have been replaced since the
        # command read it for its settings: validate reports this one)
        self.loaded_step = int(checkpoint.get("global_step", 0))
        read = getattr(self, "read_step", None)  # fit: the step of the file the command read for its settings
        if fitting and read is not None and read != self.loaded_step:  # (a branch from a live run's last.ckpt)
            from tinylm.errors import TinyLMError

            raise TinyLMError(
                f"{getattr(self._trainer, 'ckpt_path', None) or 'the checkpoint'} was replaced while this command "
                f"read it (a running `tinylm fit` saving it?): its settings were checked at step {read}, the file "
                f"loaded is step {self.loaded_step}; pass one no run is replacing (a step-N.ckpt of that run, or a "
                "copy of last.ckpt)")
        self.read_step = None  # (checked once: a rollback of the stability guard loads an earlier step on purpose)
        self.init_source = meta.get("init_from") or saved.get("init_from")  # the latter: checkpoints before it
        self.init_step = meta.get("init_from_step")

    def _check_tokenizer(self, saved: dict | None) -> None:
        """Refuse a resume (or validation) whose data module has another tokenizer than the checkpoint's, even of the
        same vocabulary size: the checkpoint keeps its own, so generate/export would decode with the wrong one."""
        tok = getattr(getattr(self._trainer, "datamodule", None), "tokenizer", None)
        if saved is None or tok is None:
            return  # loaded outside a run (load_from_checkpoint), or no tinylm data module
        from tinylm.checkpoint import CheckpointError
        from tinylm.tokenize import TRAINED_SPECS, Tokenizer
        from tinylm.tokenize.tokenizer import changed_file_message

        fingerprint = Tokenizer.from_state_dict(saved).fingerprint
        if fingerprint != tok.fingerprint and saved.get("spec") == tok.spec and tok.spec not in TRAINED_SPECS:
            raise CheckpointError(changed_file_message(  # (a trained kind's spec names no file: its corpus or
                tok.spec, fingerprint, tok.fingerprint, resume=self.trainer.state.fn == TrainerFn.FITTING))  # size)
        if fingerprint != tok.fingerprint:
            fix = ("resume with the data.tokenizer, data.corpus, data.vocab_size and data.tokenizer_train_chars the "
                   "checkpoint was trained with, or start a new run" if self.trainer.state.fn == TrainerFn.FITTING else
                   "leave --data.tokenizer out (of the command and its --config): tinylm validate then uses the "
                   "checkpoint's own")
            raise CheckpointError(
                f"the checkpoint's tokenizer ({saved.get('spec')!r}, fingerprint {fingerprint[:12]}) is not this run's "
                f"({tok.spec!r}, fingerprint {tok.fingerprint[:12]}), so generate/export would decode with the wrong "
                f"one; {fix}"
            )
