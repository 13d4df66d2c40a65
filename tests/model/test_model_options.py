"""The model's options are declared once, in GPTConfig, each tagged with its kind; TinyLM's signature (what
`tinylm fit --help` lists under --model.*), the field lists of checkpoints, init_from and scaling, and the saved
hyperparameters all come from there. And precision -> dtypes is one function."""

import dataclasses
import inspect

import pytest
import torch
from jsonargparse import ArgumentParser

from tinylm.checkpoint import CHECKPOINT_FORMAT
from tinylm.device import peak_flops_by_name, precision_dtypes
from tinylm.model.config import KINDS, GPTConfig, config_fields, option
from tinylm.train.module import TinyLM
from tinylm.train.options import FOLLOWS, OWN_OPTIONS, config_docs

TINY = {"vocab_size": 65, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16}


def _undeclared(config: type) -> list[str]:
    """What a field of ``config`` lacks to become a TinyLM option: a kind, a default, a docstring."""
    docs = config_docs() if config is GPTConfig else {}
    problems = []
    for f in dataclasses.fields(config):
        if f.metadata.get("kind") not in KINDS:
            problems.append(f"{f.name}: no kind")
        if f.default is dataclasses.MISSING:
            problems.append(f"{f.name}: no default")
        if config is GPTConfig and not docs.get(f.name):
            problems.append(f"{f.name}: no docstring")
    return problems


def test_every_gptconfig_field_has_a_kind_a_default_and_a_docstring():
    """Catches a GPTConfig field added without its kind (it would be missing from every derived list: init_from
    would not take it from the weights, a resume would not check it) or without a default (TinyLM's signature, and so
    `tinylm fit`, would require it) or without a docstring (its --help would be empty)."""
    assert _undeclared(GPTConfig) == []
    untagged = dataclasses.make_dataclass("Untagged", [("window", int, dataclasses.field(default=4))],
                                          bases=(GPTConfig,))
    assert _undeclared(untagged) == ["window: no kind"]  # the check is not vacuous
    no_default = dataclasses.field(metadata={"kind": "arch"})
    undefaulted = dataclasses.make_dataclass("Undefaulted", [("window", int, no_default)])
    assert _undeclared(undefaulted) == ["window: no default"]
    with pytest.raises(AssertionError):
        option("shape", 1)  # a kind that does not exist


def test_kinds_give_the_lists_the_code_wrote_out_before():
    """The six hand-written lists (checkpoint.RUN_FIELDS, fit's linked keys, scaling's per-rung keys, ...) are now
    these kinds: the same fields as before the move, worked out by hand."""
    from tinylm.train.init_from import architecture_fields

    assert config_fields("data") == ("vocab_size", "block_size", "eos_id")  # fit's `linked`
    assert config_fields("size") == ("n_layer", "n_head", "n_embd")  # set per rung of a scaling ladder
    run_fields = {"vocab_size", "block_size", "dropout", "attn_mask", "eos_id"}  # checkpoint.RUN_FIELDS
    assert set(config_fields("data", "run")) == run_fields
    assert architecture_fields() == ("n_layer", "n_head", "n_embd", "bias", "pad_vocab_multiple", "positions",
                                     "rope_theta", "norm", "qk_norm", "mlp", "tie_embeddings", "logit_softcap",
                                     "zero_init_proj")


def test_tinylm_signature_is_gptconfig_fields_and_its_own_options():
    """Catches TinyLM's signature drifting from GPTConfig (a field missing, another default or type), or the
    order of --help changing: the fields in GPTConfig's order, prefix_len after attn_mask, then TinyLM's own."""
    params = inspect.signature(TinyLM.__init__).parameters
    own = [n for n in params if n != "self" and n not in {f.name for f in dataclasses.fields(GPTConfig)}]
    assert own[:3] == ["prefix_len", "optimizer", "muon_lr"] and own[-1] == "init_from"
    assert own == list(OWN_OPTIONS)  # what a checkpoint may hold besides the fields (else: a newer tinylm's)
    names = [n for n in params if n != "self"]
    assert names[names.index("attn_mask") + 1] == "prefix_len" and FOLLOWS == {"prefix_len": "attn_mask"}
    assert [n for n in names if n not in own] == [f.name for f in dataclasses.fields(GPTConfig)]
    hints = {"int": int, "float": float, "bool": bool, "str": str, "int | None": int | None,
             "float | None": float | None}
    for f in dataclasses.fields(GPTConfig):
        p = params[f.name]
        assert (p.kind, p.default, p.annotation) == (inspect.Parameter.KEYWORD_ONLY, f.default, hints[f.type]), f.name


def test_help_of_each_model_option_is_its_gptconfig_docstring():
    """Catches --model.* losing its help text (jsonargparse reads TinyLM's docstrings, not GPTConfig's) or its
    default: the parser LightningCLI builds from TinyLM shows GPTConfig's attribute docstrings and defaults."""
    parser = ArgumentParser()
    parser.add_class_arguments(TinyLM, "model")
    actions = {a.dest: a for a in parser._actions}
    docs = config_docs()
    assert docs["n_layer"] == "Number of transformer blocks."
    for f in dataclasses.fields(GPTConfig):
        assert " ".join(actions[f"model.{f.name}"].help.split()) == docs[f.name], f.name  # argparse rewraps it
        assert parser.get_defaults().model[f.name] == f.default
    assert actions["model.lr"].help.startswith("Peak learning rate")  # TinyLM's own keep theirs


def test_hyperparameters_are_saved_as_with_a_written_out_signature(tmp_path):
    """Catches the saved hyperparameters changing with the derived signature: every option, in the signature's
    order, under the name "kwargs" (Lightning's, for arguments of __init__), loadable with load_from_checkpoint; an
    unknown option is a TypeError as before; and under LightningCLI the CLI's copy (with `_instantiator`) is kept."""
    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters_context

    model = TinyLM(**TINY, qk_norm=True, lr=1e-3)
    assert list(model.hparams) == [n for n in inspect.signature(TinyLM.__init__).parameters if n != "self"]
    assert model.hparams.qk_norm is True and model.hparams.lr == 1e-3 and model.hparams.mlp == "gelu"
    assert model._hparams_name == "kwargs" and model.model.config.qk_norm is True
    with pytest.raises(TypeError, match="'n_layers'"):
        TinyLM(**TINY, n_layers=3)
    given = {**model.hparams, "mlp": "swiglu"}  # the CLI's copy holds the whole section
    with _given_hyperparameters_context(hparams=given, instantiator="lightning.pytorch.cli.instantiate_module"):
        cli_made = TinyLM(**given)
    assert dict(cli_made.hparams) == {**given, "_instantiator": "lightning.pytorch.cli.instantiate_module"}

    class Seeded(TinyLM):  # a subclass's own arguments are saved beside TinyLM's, as Lightning does
        def __init__(self, data_seed: int = 3, **options):
            super().__init__(**options)

    assert dict(Seeded(**TINY, data_seed=5).hparams) == {**model.hparams, "qk_norm": False, "lr": 6e-4, "data_seed": 5}
    path = tmp_path / "m.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                "hparams_name": model._hparams_name, "pytorch-lightning_version": "2.6.0",
                "tinylm": {"format": CHECKPOINT_FORMAT, "tokenizer": None}}, path)
    loaded = TinyLM.load_from_checkpoint(path, weights_only=False)
    assert dict(loaded.hparams) == dict(model.hparams)


def test_lightning_given_hyperparameters_context_var():
    """tinylm.train.options.save_hyperparameters hands Lightning the hyperparameters through the context variable
    LightningCLI uses (`_given_hyperparameters`, private); LightningModule.save_hyperparameters must still read it."""
    from contextvars import ContextVar

    from lightning.pytorch.core.mixins import hparams_mixin

    assert isinstance(hparams_mixin._given_hyperparameters, ContextVar)
    assert "_given_hyperparameters.get()" in inspect.getsource(hparams_mixin.HyperparametersMixin.save_hyperparameters)


def test_resume_into_another_architecture_is_refused_naming_the_field():
    """Catches a checkpoint loading into a model of another "arch" field that has no weights of its own (qk_norm:
    the tensors fit, the function differs): the shape check covers every data, size and arch field."""
    from tinylm.checkpoint import CheckpointError

    saved = TinyLM(**TINY)
    ckpt = {"state_dict": saved.state_dict(), "hyper_parameters": dict(saved.hparams),
            "tinylm": {"format": CHECKPOINT_FORMAT, "tokenizer": None}}
    with pytest.raises(CheckpointError, match="qk_norm: checkpoint False, this run True"):
        TinyLM(**TINY, qk_norm=True).on_load_checkpoint(ckpt)
    TinyLM(**TINY, lr=1.0).on_load_checkpoint(ckpt)  # a training option is not the model's shape


@pytest.mark.parametrize("precision, weights, compute", [
    ("bf16-mixed", torch.float32, torch.bfloat16), ("16-mixed", torch.float32, torch.float16),
    ("bf16", torch.float32, torch.bfloat16), (16, torch.float32, torch.float16),
    ("bf16-true", torch.bfloat16, torch.bfloat16), ("16-true", torch.float16, torch.float16),
    ("32-true", torch.float32, torch.float32), (32, torch.float32, torch.float32),
    ("64-true", torch.float64, torch.float64), ("64", torch.float64, torch.float64),
])
def test_precision_dtypes(precision, weights, compute):
    """One mapping from Lightning's precision to (weights, matmuls) dtypes, for the memory plan, MFU's peak FLOP/s
    and the health monitor's fp16 hint: mixed keeps fp32 weights, true holds them in its own dtype."""
    assert precision_dtypes(precision) == (weights, compute)


def test_plan_and_peak_flops_read_the_one_mapping():
    """The memory plan's bytes per value and the GPU peak lookup, through precision_dtypes: known answers."""
    from tinylm.studies.plan import element_sizes

    assert [element_sizes(p) for p in ("bf16-mixed", "bf16-true", "32-true", "64-true")] == [(4, 2), (2, 2), (4, 4),
                                                                                             (8, 8)]
    assert peak_flops_by_name("NVIDIA H100 80GB HBM3", "bf16-mixed") == peak_flops_by_name("h100", "16-true") > 5e14
    assert peak_flops_by_name("h100", "64-true") < peak_flops_by_name("h100", "bf16-mixed")
