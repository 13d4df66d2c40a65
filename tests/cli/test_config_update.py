"""tinylm.cli.config_update: a checkpoint's settings applied to a parsed command without jsonargparse's whole parse
give the config (and the error) that parse gives."""

import jsonargparse
import pytest

from tinylm.cli.config_update import with_checkpoint_settings
from tinylm.cli.fit import TinyLMCLI, lightning_main


class _Parsed(Exception):
    pass


class _ParseOnlyCLI(TinyLMCLI):
    def _parse_ckpt_path(self) -> None:  # the command as parsed, before tinylm applies a checkpoint to it
        raise _Parsed(self)


def _parsed(sub: str, config) -> TinyLMCLI:
    with pytest.raises(_Parsed) as caught:
        lightning_main([sub, "--config", str(config)], cli_class=_ParseOnlyCLI)
    return caught.value.args[0]


def _both(cli, sub: str, update: dict):
    """(the whole parse's result or error, with_checkpoint_settings' result or error)"""
    out = []
    for fn in (lambda: cli.parser.parse_object({sub: update}, cli.config),
               lambda: with_checkpoint_settings(cli.parser, cli._parser(sub), sub, cli.config, update)):
        try:
            out.append(fn())
        except Exception as e:  # noqa: BLE001 (compared below: the same error)
            out.append(e)
    return out


@pytest.mark.parametrize("sub", ["fit", "validate"])
def test_checkpoint_settings_as_a_whole_parse(run_config, sub):
    """Catches a resume or validate that runs (or refuses) with other settings than the checkpoint's parsed into the
    command gave: the same values, types (an int lr made a float), links (data.block_size sets model.block_size),
    nested options (data.clean), a -0.0 where the config holds 0.0, and the same error for a bad value, as
    jsonargparse's parse_object of the whole config, which applying them cheaply replaced."""
    cli = _parsed(sub, run_config(trainer={"callbacks": [{"class_path": "lightning.pytorch.callbacks.EarlyStopping",
                                                          "init_args": {"monitor": "val/loss"}}]}))
    model = {k: cli.config[sub].model[k] for k in ("n_layer", "n_head", "n_embd", "lr", "warmup_steps", "init_from")}
    cases = [
        {"model": model},  # the run's own config: nothing changes
        {"model": {**model, "lr": 1e-3, "n_layer": 3}},
        {"model": {**model, "lr": 1}},  # an int for a float
        {"model": {**model, "dropout": -0.0}},  # equal to the config's 0.0, yet the run's own (its records keep it)
        {"model": model, "data": {"tokenizer": "/some/where", "block_size": 32, "clean": {"exact": True}}},
        {"model": {**model, "decay_steps": "12"}},  # a string for an int
        {"model": {**model, "lr": "abc"}},
        {"model": model, "data": {"clean": {"exact": "maybe"}}},
        {"model": {**model, "nope": 1}},
    ]
    for update in cases:
        whole, applied = _both(cli, sub, update)
        if isinstance(whole, Exception):
            assert type(applied) is type(whole) and str(applied) == str(whole), update
        else:
            assert applied == whole, update
            assert cli.parser.dump(applied) == cli.parser.dump(whole), update
    assert isinstance(_both(cli, sub, cases[-1])[0], jsonargparse.ArgumentError)  # (the bad cases do fail)
    assert with_checkpoint_settings(cli.parser, cli._parser(sub), sub, cli.config, cases[0]) is cli.config


@pytest.mark.parametrize("sub", ["fit", "validate"])
def test_config_dump_as_lightnings(run_config, sub):
    """Catches the model's and data module's hyperparameters (what their checkpoints keep) read back from the
    config's dump other than PyYAML's safe_load read them in LightningCLI._dump_config: libyaml refused a lone
    surrogate escaped in double quotes ("\\uDCFF", how PyYAML writes one: `validate --data.text_column` of a name in
    Latin-1 bytes) that PyYAML reads."""
    import yaml

    from tinylm.cli.callback_checks import dumped
    from tinylm.cli.config_update import config_dump

    cli = _parsed(sub, run_config())
    cli.config[sub].samples.prompts = ["multi\nline: x", "ünï ✓ 日本", "1e5", "~", "\u2028\x85", "a b " * 40,
                                       "'q'", "#"]
    cli.config[sub].data.text_column = "x\udcff"
    cli.config[sub].run.name = "3e-4"
    lightnings = yaml.safe_load(cli.parser.dump(cli.config, skip_link_targets=False, skip_none=False, format="yaml"))
    assert config_dump(cli.parser, cli.config, cli._parser(sub)) == lightnings[sub]
    assert lightnings[sub]["data"]["text_column"] == "x\udcff"
    dumped(cli._parser(sub), cli.config[sub])  # (a fit's check_recordable: checked, then not validated again)
    assert config_dump(cli.parser, cli.config, cli._parser(sub)) == lightnings[sub]
    cli.config[sub].model.lr = "abc"  # changed since: checked again, as Lightning's dump checks it
    with pytest.raises(TypeError, match="lr"):
        config_dump(cli.parser, cli.config, cli._parser(sub))
