"""Text samples during training: SampleText writes a few continuations of fixed prompts to ``samples.txt`` (and
W&B) every ``--samples.every_n_steps``, decoded with the options of `tinylm generate` (SamplingConfig, declared once
in tinylm/generate/config.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import torch

from tinylm.generate.options import Option, sampling_options
from tinylm.train.callbacks import SpeedMonitor, run_tokenizer, work_mark
from tinylm.train.parallel import shards_weights


class SampleText(L.Callback):
    """Samples text from fixed prompts every N optimizer steps, to watch a model learn to write.

    The text goes to the console, to ``<run dir>/samples.txt`` and to W&B as a table (rank zero only). Sampling
    uses its own seeded generator, so it neither changes the training RNG stream nor breaks exact resume.

    Args:
        every_n_steps: Optimizer steps between samples; 0 turns sampling off.
        prompts: Texts to continue (an empty prompt starts from the end-of-text token); null: one prompt, a line
            break (the end-of-text token, else the vocabulary's first character, where the tokenizer has no line break).
        top_k: sample: keep only the k most likely tokens (null keeps all); contrastive search takes its own
            default (4 candidates per step) unless this is set away from its default.
        seed: Seed of the sampling generator (the same samples for the same weights); prompt i samples with
            seed + i, so the samples of different prompts do not share their random numbers.

    The other options are decoding options, documented on SamplingConfig (tinylm/generate/config.py).
    """

    # Option(): a decoding option, its type, default and help SamplingConfig's (tinylm/generate/config.py)
    @sampling_options("samples.{}")
    def __init__(
        self,
        *,
        every_n_steps: int = 500,
        prompts: list[str] | None = None,
        max_new_tokens=Option(default=100),
        strategy=Option(),
        temperature=Option(default=0.8),
        top_k=Option(default=200),
        top_p=Option(),
        min_p=Option(),
        typical_p=Option(),
        repetition_penalty=Option(),
        no_repeat_ngram_size=Option(),
        num_beams=Option(default=4),  # the width samples.strategy beam uses (SamplingConfig's 1 is "no beams")
        seed=Option(default=1234, annotation=int),  # never the global RNG: that would change the training run
        draft_ckpt_path=Option(),
        prompt_lookup=Option(),
        num_draft_tokens=Option(),
        regex=Option(),
        json_schema=Option(),
        grammar=Option(),
    ) -> None:
        from tinylm.generate.config import check_speculative, idle_draft_tokens, unused_options

        if every_n_steps < 0:
            raise ValueError(f"samples.every_n_steps must be >= 0 (0 turns sampling off), got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.prompts = list(prompts) if prompts is not None else ["\n"]
        self._default_prompts = prompts is None  # "\n": none of a char vocabulary of text without line breaks
        if every_n_steps and not self.prompts:  # it wrote a sample step's heading over no samples, every time
            raise ValueError("samples.prompts is empty: give at least one (--samples.prompts '[\"ROMEO:\"]'; \"\" "
                             "starts from the end-of-text token), or turn sampling off with --samples.every_n_steps 0")
        surface = SampleText.__init__.options
        options = surface.values(locals())
        # contrastive search takes its own default k (4), not the 200 candidates of samples' sampling
        if strategy != "sample" and top_k == surface.defaults["top_k"]:
            options["top_k"] = None
        self.config = surface.config({**options, "num_beams": num_beams if strategy == "beam" else 1})
        check_speculative(options, surface.spell, draft_ckpt_path)
        if draft_ckpt_path and not Path(draft_ckpt_path).exists():  # now, not at the run's start (a folder made)
            raise FileNotFoundError(f"samples.draft_ckpt_path {draft_ckpt_path!r} not found; pass a .ckpt written by "
                                    "`tinylm fit` with this run's tokenizer, or leave it out")
        self.draft_ckpt_path, self._draft = draft_ckpt_path, None  # the draft model, loaded once at the start
        self._grammar = None
        if regex or json_schema or grammar:
            from tinylm.generate.constrained import grammar_text

            self._grammar = grammar_text(regex, json_schema, grammar)  # a bad one now, before the run starts
        # as generate warns of --top_p with --strategy greedy
        if unused := unused_options(strategy, surface.values(locals()), surface.defaults, surface.spell):
            warnings.warn(unused, UserWarning)
        if idle := idle_draft_tokens(options, surface.spell, draft_ckpt_path):
            warnings.warn(idle, UserWarning)
        self._last_step = -1
        self._path: Path | None = None
        self._saved_bytes: int | None = None  # from the checkpoint resumed

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the step a run starts at was sampled by the run it resumes (or is the untrained step 0, which a run
        # without accumulation never samples either): not again after the next step's first micro-batch
        self._last_step = trainer.global_step
        self._path = Path(trainer.default_root_dir) / "samples.txt"
        if trainer.is_global_zero and self._path.is_symlink():  # a shared run folder's link: cutting it back and
            self._path.unlink()  # appending to it cut and wrote the file it points to, outside the run folder
        if self.every_n_steps and shards_weights(trainer):
            # rank 0 samples alone, and FSDP2's weights are shards of every rank's (a forward gathers them from all):
            # its first sample step ended the run in "got mixed torch.Tensor and DTensor", before that step's save
            if trainer.is_global_zero:
                warnings.warn(f"samples.every_n_steps {self.every_n_steps}: no text is sampled during training under "
                              "--trainer.strategy fsdp (the weights are sharded over the ranks); sample a checkpoint "
                              "with tinylm generate --ckpt_path ..., or pass --samples.every_n_steps 0",
                              UserWarning)
            self.every_n_steps = 0
        if self.every_n_steps:
            tokenizer = run_tokenizer(trainer, pl_module)
            self._check_prompts(tokenizer)
            self._check_decoding(tokenizer, pl_module)
        saved, self._saved_bytes = self._saved_bytes, None
        if trainer.global_step and trainer.is_global_zero and saved is not None:
            _cut_after(self._path, saved)

    def _check_prompts(self, tokenizer) -> None:
        """Refuse, before the first step, a prompt the run's tokenizer cannot encode: found at the first sample step,
        it ended the run there, before that step's checkpoint was saved."""
        if tokenizer is None:
            return
        if self._default_prompts and not _encodes(tokenizer, "\n"):
            # a char model of text without line breaks (DNA, one-line rows): the default was refused, so a run on
            # such a corpus with every option left at its default stopped before its first step
            self.prompts = [""] if tokenizer.eos_id is not None else [tokenizer.decode([0])]
        for prompt in self.prompts:
            try:
                ids = tokenizer.encode(prompt)
            except ValueError as e:
                raise ValueError(f"samples.prompts: {prompt!r} cannot be encoded by the run's tokenizer ({e}); "
                                 "change --samples.prompts") from None
            if not ids and tokenizer.eos_id is None:
                raise ValueError(f"samples.prompts: an empty prompt starts from the end-of-text token, and this "
                                 f"{tokenizer.kind} tokenizer has none; give each prompt some text "
                                 "(--samples.prompts '[\"\\n\"]')")

    def _check_decoding(self, tokenizer, pl_module: L.LightningModule) -> None:
        """Load the draft model once (refused in one line unless trained with the run's tokenizer), and refuse a
        grammar the run's tokenizer cannot write, before the first step."""
        if tokenizer is None:
            return
        if self.draft_ckpt_path and self._draft is None:
            from tinylm.checkpoint import load_draft

            self._draft = load_draft(self.draft_ckpt_path, tokenizer, pl_module.device, "samples.draft_ckpt_path")
        if self._grammar is not None:
            from tinylm.generate.constrained import check_writable, constraint_name

            kind = next(k for k in ("regex", "json_schema", "grammar") if getattr(self.config, k))
            check_writable(self._grammar, tokenizer, pl_module.model.config.vocab_size,
                           constraint_name(kind, getattr(self.config, kind), f"samples.{kind}"))

    def state_dict(self) -> dict:
        # how much of samples.txt the checkpoint's step had written: a run killed after more samples, before its
        # next checkpoint, is cut back to it on resume (as the metrics CSV drops its rows), and writes them again
        if self._path is None:  # not training (nothing to cut back to)
            return {}
        try:
            return {"samples_bytes": self._path.stat().st_size}
        except OSError:  # no sample written yet
            return {"samples_bytes": 0}

    def load_state_dict(self, state_dict: dict) -> None:
        self._saved_bytes = state_dict.get("samples_bytes")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if not self.every_n_steps or step % self.every_n_steps or step == self._last_step or not trainer.is_global_zero:
            return
        self._last_step = step
        tokenizer = run_tokenizer(trainer, pl_module)
        if tokenizer is None or self._weights_broken(step, pl_module):
            return
        speeds = [cb for cb in trainer.callbacks if isinstance(cb, SpeedMonitor)]
        started = work_mark() if speeds else None
        stats: dict[str, int] = {}  # speculative decoding's counts, over the prompts
        rows = [(step, prompt, self._sample(pl_module.model, tokenizer, prompt, i, stats))
                for i, prompt in enumerate(self.prompts)]
        self._publish(trainer, rows, stats)
        for speed in speeds:
            speed.exclude(started)  # sampling is no training: tokens/sec, MFU and the CPU wait leave it out

    @staticmethod
    def _weights_broken(step: int, pl_module: L.LightningModule) -> bool:
        """Whether the weights hold NaN or inf (a step the guard skipped, a callback or a loaded model that broke
        them), said in one line: sampling from them ended the run in torch.multinomial's traceback ("probability
        tensor contains either inf, nan"), and greedy decoding printed garbage. (One check per sample step, none per
        token.)"""
        from tinylm.checkpoint import non_finite

        with torch.no_grad():
            broken = non_finite(pl_module.model.state_dict())
        if broken:
            warnings.warn(f"samples at step {step} skipped: the model's weights hold NaN or inf in {len(broken)} "
                          f"tensors, e.g. {broken[0]!r} (the stability guard, --guard, rolls a diverged run back; "
                          "with it off, resume from an earlier step-*.ckpt with a lower --model.lr)", stacklevel=1)
        return bool(broken)

    def _sample(self, model: torch.nn.Module, tokenizer, prompt: str, index: int = 0,
                stats: dict[str, int] | None = None) -> str:
        """The sample of prompt number ``index`` (its seed: samples.seed + index); speculative decoding adds its
        counts to ``stats``."""
        from dataclasses import replace

        from tinylm.generate.rows import decode_after
        from tinylm.generate.strategies import generate_with

        ids = tokenizer.encode(prompt) or ([tokenizer.eos_id] if tokenizer.eos_id is not None else [])
        if not ids:
            return ""
        config = replace(self.config, eos_id=tokenizer.eos_id, seed=(self.config.seed + index) % 2**63)
        # generate calls model.forward directly: a model compiled in place runs eagerly here, so the varying
        # shapes of incremental decoding cause no recompilation
        out = generate_with(model, [ids], config, tokenizer=tokenizer, draft=self._draft, stats=stats)
        return decode_after(tokenizer.decode, ids, out[0])  # after the prompt: a "▁" piece keeps its space

    def _publish(self, trainer: L.Trainer, rows: list[tuple[int, str, str]], stats: dict[str, int]) -> None:
        import logging

        log = logging.getLogger("tinylm")
        text = "\n".join(f"--- step {s} | {p!r}\n{p}{t}" for s, p, t in rows)
        if stats.get("steps"):  # what the draft buys: tokens per forward pass of the model (plain decoding: 1)
            text += (f"\n--- speculative: {stats['tokens'] / stats['steps']:.2f} tokens per forward pass of the model, "
                     f"{stats['accepted'] / max(stats['drafted'], 1):.0%} of the drafted tokens accepted")
        log.info("\n%s", text)
        path = Path(trainer.default_root_dir) / "samples.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        from tinylm.paths import writing

        with writing(path), open(path, "a", encoding="utf-8") as f:  # (a full disk: the CLI's line names the file)
            f.write(text + "\n")
        from tinylm.train.loggers import wandb_loggers, wandb_write_failed

        for logger in wandb_loggers(trainer.loggers):
            # at Lightning's logging step, where this step's metrics are (its val/loss: steps done - 1, as the CSV's
            # step column); the table's own column says the steps done, as samples.txt does
            try:
                logger.log_text(key="samples", columns=["step", "prompt", "text"], data=[list(r) for r in rows],
                                step=rows[0][0] - 1)
            except OSError as e:  # W&B's copy of the table into its files (a full WANDB_DIR): the run goes on
                wandb_write_failed(e)


def _cut_after(path: Path, size: int) -> None:
    """Cut `path` back to its first `size` bytes (nothing when it is not longer)."""
    try:
        if path.stat().st_size > size:
            with open(path, "r+b") as f:
                f.truncate(size)
    except OSError:
        pass


def _encodes(tokenizer, text: str) -> bool:
    try:
        tokenizer.encode(text)
    except ValueError:
        return False
    return True
