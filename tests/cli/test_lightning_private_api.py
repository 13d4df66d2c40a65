"""tinylm leans on a few private Lightning APIs where no public route exists. Each test here fails loudly, naming the
API, when a Lightning release renames or reshapes it, instead of tinylm silently misbehaving."""

import inspect

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import (
    _LoggerConnector,
)


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_cli_parse_ckpt_path_hook():
    """tinylm.cli.fit.TinyLMCLI overrides `_parse_ckpt_path` (the one hook between parsing and instantiation) to
    resume from `last` with the checkpoint's hyperparameters (#20801); it must still be called from __init__."""
    assert _params(LightningCLI._parse_ckpt_path) == ["self"]
    assert "self._parse_ckpt_path()" in inspect.getsource(LightningCLI.parse_arguments) + inspect.getsource(
        LightningCLI.__init__)


def test_cli_instantiate_trainer_internals():
    """TinyLMCLI.instantiate_trainer calls `_instantiate_trainer(config, callbacks)` and `_parser(subcommand)`."""
    assert _params(LightningCLI._instantiate_trainer) == ["self", "config", "callbacks"]
    assert _params(LightningCLI._parser) == ["self", "subcommand"]
    assert "self.save_config_callback" in inspect.getsource(LightningCLI._instantiate_trainer)


def test_model_checkpoint_internals_used_by_periodic_checkpoint():
    """PeriodicCheckpoint saves at the final step through ModelCheckpoint's own private save path."""
    assert _params(ModelCheckpoint._save_topk_checkpoint) == ["self", "trainer", "monitor_candidates"]
    assert _params(ModelCheckpoint._save_last_checkpoint) == ["self", "trainer", "monitor_candidates"]
    assert _params(ModelCheckpoint._monitor_candidates) == ["self", "trainer"]
    assert _params(ModelCheckpoint._should_skip_saving_checkpoint) == ["self", "trainer"]


def test_csv_writer_hook():
    """RunCSVLogger's writer overrides `_check_log_dir_exists` (which deletes an existing metrics.csv) to append, and
    `_rewrite_with_new_header` (a new column rewrites metrics.csv in place) to rewrite it by a rename."""
    assert _params(ExperimentWriter._check_log_dir_exists) == ["self"]
    inits = "".join(inspect.getsource(vars(c)["__init__"]) for c in ExperimentWriter.__mro__[:-1]
                    if "__init__" in vars(c))
    assert "self._check_log_dir_exists()" in inits
    assert _params(ExperimentWriter._rewrite_with_new_header) == ["self", "fieldnames"]
    assert "self._rewrite_with_new_header(" in inspect.getsource(ExperimentWriter.save)


def test_logger_connector_should_update_logs():
    """tinylm.train.module.logging_step reads `trainer._logger_connector.should_update_logs` to call self.log only
    on logged steps (~1 ms per call saved); a public equivalent would need the fit loop's private counters too."""
    assert isinstance(inspect.getattr_static(_LoggerConnector, "should_update_logs"), property)


def test_logger_connector_step_row():
    """PeriodicCheckpoint writes a step's CSV row before its checkpoint as Lightning would write it after: the
    connector's `metrics["log"]` under the fit loop's `_batches_that_stepped`, with `epoch` added."""
    assert isinstance(inspect.getattr_static(_LoggerConnector, "metrics"), property)
    assert 'self.log_metrics(self.metrics["log"])' in inspect.getsource(_LoggerConnector.update_train_step_metrics)
    source = inspect.getsource(_LoggerConnector.log_metrics)
    assert "self.trainer.fit_loop.epoch_loop._batches_that_stepped" in source and '"epoch"' in source


def test_internals_used_by_the_interrupt_checkpoint():
    """tinylm.train.interrupt stops at a whole step on SIGTERM/SIGINT: it reads Lightning's SIGTERM flag and the
    handlers it saved, and flushes the step's logged metrics before saving; PeriodicCheckpoint asks the fit loop
    whether validation is due at this step."""
    from lightning.pytorch.loops.fit_loop import _FitLoop
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
    from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

    assert "received_sigterm" in inspect.getsource(_SignalConnector.__init__)
    assert "_original_handlers" in inspect.getsource(_SignalConnector)
    # setup replaces the notifier (it broadcasts inside the signal handler) before Lightning reads it to register it
    assert "[self._sigterm_notifier_fn]" in inspect.getsource(_SignalConnector.register_signal_handlers)
    assert _params(_LoggerConnector.update_train_step_metrics) == ["self"]
    assert _params(_TrainingEpochLoop._should_check_val_fx) == ["self", "data_fetcher"]
    assert "self._data_fetcher" in inspect.getsource(_FitLoop.__init__)


def test_final_validation():
    """tinylm.train.callbacks.FinalValidation asks the epoch loop whether a batch ends an optimizer step, and relies on
    Lightning's rules for a stop: the batch that sets `trainer.should_stop` is logged and validation follows it."""
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    assert _params(_TrainingEpochLoop._should_accumulate) == ["self"]
    assert "self.trainer.should_stop" in inspect.getsource(_TrainingEpochLoop._should_check_val_fx)
    assert "trainer.should_stop" in inspect.getsource(_LoggerConnector.should_update_logs.fget)


def test_logged_step_counter():
    """tinylm.train.callbacks.LoggedStep sets the fit loop's `_batches_that_stepped` (the step metrics are logged
    under, saved in checkpoints) to global_step at a run's first batch."""
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    assert "self._batches_that_stepped: int = 0" in inspect.getsource(_TrainingEpochLoop.__init__)
    assert "self._batches_that_stepped" in inspect.getsource(_TrainingEpochLoop._save_loggers_on_train_batch_end) + \
        inspect.getsource(_TrainingEpochLoop.on_advance_end)


def test_lr_finder_records_one_lr_per_optimizer_step():
    """tinylm.studies.lr_find pairs the LRs Lightning's range test records with each optimizer step's own loss (the
    module's, not the callback's last micro-batch): one LR per optimizer step, at the accumulation's last batch."""
    from lightning.pytorch.tuner.lr_finder import _LRCallback

    source = inspect.getsource(_LRCallback.on_train_batch_start)
    assert "(trainer.fit_loop.batch_idx + 1) % trainer.accumulate_grad_batches != 0" in source
    assert "self.lrs.append(" in source
    from tinylm.studies.lr_find import SMOOTHING

    assert inspect.signature(_LRCallback.__init__).parameters["beta"].default == SMOOTHING


def test_cuda_flops_table():
    """tinylm.device.peak_flops_by_name reads Lightning's per-chip table for chips tinylm's own table lacks."""
    import torch
    from lightning.fabric.utilities.throughput import _CUDA_FLOPS

    assert _CUDA_FLOPS["a100"][torch.float32] > 1e13 and _CUDA_FLOPS["a100"][torch.bfloat16] > 1e14


def test_torch_worker_loop_done_event():
    """tinylm.data.loader.worker_signals (a worker_init_fn) reads torch's `done_event` from the worker loop that
    calls it, to tell the loader's own SIGTERM from a job's (torch, not Lightning, but as private)."""
    from torch.utils.data._utils.worker import _worker_loop
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    assert "done_event" in _params(_worker_loop) and "init_fn(worker_id)" in inspect.getsource(_worker_loop)
    assert "self._workers_done_event.set()" in inspect.getsource(_MultiProcessingDataLoaderIter._shutdown_workers)


def test_multiprocessing_launcher():
    """ddp_fork hands the weights back as `<tempdir>/.temp.ckpt` through the CheckpointIO (AtomicCheckpointIO loads it
    as a bare state_dict)."""
    from lightning.pytorch.strategies.launchers.multiprocessing import (
        _MultiProcessingLauncher,
    )

    source = inspect.getsource(_MultiProcessingLauncher)
    assert '".temp.ckpt"' in source and "checkpoint_io.load_checkpoint(worker_output.weights_path)" in source


def test_timer_duration_and_saved_training_time():
    """tinylm.cli.resume_changes.check_time_left reads Timer's parsed `_duration` (seconds) and the training time it
    saves in a checkpoint under callbacks["Timer"]["time_elapsed"]["train"]."""
    from lightning.pytorch.callbacks import Timer

    timer = Timer(duration="00:00:01:03")
    assert timer._duration == 63 and Timer(duration={"microseconds": 1})._duration == 1e-6
    assert timer.state_key == "Timer" and "train" in timer.state_dict()["time_elapsed"]


def test_ddp_launcher_starts_its_watch_by_module_name():
    """tinylm.cli.fit puts its own watch over the ranks DDP's launcher starts (Lightning's SIGKILLed rank 0 without a
    word when one ended) by replacing `_launch_process_observer` in the launcher's module, which it calls there with
    the Popen list of the ranks."""
    from lightning.pytorch.strategies.launchers import subprocess_script

    assert "_launch_process_observer(self.procs)" in inspect.getsource(
        subprocess_script._SubprocessScriptLauncher.launch)


def test_wandb_logger_internals_used_by_tinylms_loggers():
    """tinylm.train.loggers points W&B's files at $WANDB_DIR through WandbLogger's `_wandb_init["dir"]` (the
    arguments its `experiment` passes to wandb.init: save_dir there overrode WANDB_DIR) and reads the project a
    logger logs to from `_experiment` / `_project`."""
    from lightning.pytorch.loggers import WandbLogger

    logger = WandbLogger(project="p", save_dir="x", offline=True)  # nothing started: wandb.init runs on `experiment`
    assert logger._wandb_init["dir"] == "x" and logger._project == "p" and logger._experiment is None
    assert "self._wandb_init" in inspect.getsource(WandbLogger.experiment.fget)


def test_lr_finder_draws_its_bar_through_its_modules_tqdm():
    """tinylm.studies.lr_find swaps `lightning.pytorch.tuner.lr_finder.tqdm` for tinylm's bar (plain lines in a log):
    the sweep must still make its bar through that module-level name."""
    from lightning.pytorch.tuner import lr_finder

    assert callable(lr_finder.tqdm) and "tqdm(" in inspect.getsource(lr_finder._LRCallback)


def test_callback_states_fall_back_to_the_legacy_state_key():
    """tinylm.train.callbacks.BestCheckpoint keys its state apart from a user's ModelCheckpoint and reads a checkpoint
    written before it through `_legacy_state_key`, which Lightning must still look up when `state_key` is missing."""
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.trainer import call

    assert isinstance(inspect.getattr_static(Callback, "_legacy_state_key"), property)
    assert "callback_states.get(callback._legacy_state_key)" in inspect.getsource(call._call_callbacks_load_state_dict)


def test_jsonargparse_print_config_internals():
    """TinyLMCLI puts off `--print_config` of a command from a checkpoint until the checkpoint's options apply, with
    jsonargparse's private `_ActionPrintConfig`: its skip context, its check and its print (which exits)."""
    from jsonargparse._actions import _ActionPrintConfig

    assert _params(_ActionPrintConfig.print_config_if_requested) == ["parser", "cfg"]
    assert _params(_ActionPrintConfig.is_print_config_requested) == ["parser"]
    assert "print_config_skip" in inspect.getsource(_ActionPrintConfig.skip_print_config)
    assert "parser.exit()" in inspect.getsource(_ActionPrintConfig.print_config_if_requested)


def test_on_exception_checkpoint_turns_no_ckpt_path_into_last():
    """tinylm.cli.trainer_checks.check_exception_checkpoints refuses what Lightning's rule would resume a fresh run
    from (an OnExceptionCheckpoint turns ``fit(ckpt_path=None)`` into "last", the newest of its file and the
    ModelCheckpoints' last files), and tinylm.cli.fit silences the two warnings of that rule by their text."""
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    source = inspect.getsource(_CheckpointConnector._parse_ckpt_path)
    assert 'ckpt_path = "last"' in source and "ft_checkpoints" in source and "_find_last_checkpoints" in source
    assert "was called without a model" in source and "is set, but there is no last checkpoint" in source


def test_cli_dump_config():
    """TinyLMCLI overrides `_dump_config` (the config dumped and read back into `config_dump`, whose model and data
    sections the instantiators give the model and data module as their hyperparameters) to read it with libyaml."""
    from lightning.pytorch.cli import _InstantiatorFn

    assert _params(LightningCLI._dump_config) == ["self"]
    source = inspect.getsource(LightningCLI._dump_config)
    assert "self.config_dump = yaml.safe_load(" in source and "skip_link_targets=False, skip_none=False" in source
    assert "self.cli._dump_config()" in inspect.getsource(_InstantiatorFn.__call__)
