"""A compiled `tinylm fit` (--model.compile_model true) compiles once and then runs its graphs: no recompile after its
first steps, through validations and checkpoint saves. A recompile on every step (or an eager fallback once dynamo's
cache is full) would cost a GPU run its speed without a word (issue 34: `TORCH_LOGS=recompiles`)."""

import functools
import json
import os
import traceback

import forked
import lightning as L
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from tinylm.cli import main

COMPILED: list[tuple[str, int, int]] = []  # (event, optimizer steps done, frames compiled so far)
COUNTER: list[CompileCounterWithBackend] = []


class _Frames(L.Callback):
    """Records how many frames dynamo has compiled after each training batch and each validation."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        COMPILED.append(("train", trainer.global_step, COUNTER[0].frame_count))

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            COMPILED.append(("val", trainer.global_step, COUNTER[0].frame_count))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:this recipe is sized for a GPU:UserWarning")  # compile_model on a CPU, on purpose
def test_compiled_fit_makes_no_recompile_after_its_first_steps(run_config, tmp_path):
    """Catches a recompile (a guard that fails again: a shape, the train/eval mode, a Python value that changes
    per step) after the first steps. dynamo compiles the training step (model and loss as one graph) at the first
    batch and the evaluation forward at the first validation; from then on, with more steps, validations and
    checkpoint saves, nothing. aot_eager runs dynamo and AOT autograd without generating kernels (inductor's
    code generation adds nothing to what recompiles).

    The run is a child forked from the test's process: a compiled backward starts autograd's device threads (torch's
    CUDA builds), and a process that has them forks no DDP rank that can train (a later ddp_fork test in the same
    worker failed with "Unable to handle autograd's threading in combination with fork-based multiprocessing")."""
    config = run_config(run={"checkpoint_every": 2}, model={"compile_model": True},
                        trainer={"max_steps": 8, "val_check_interval": 2,
                                 "callbacks": [{"class_path": "test_compile._Frames"}]})
    child = os.fork()
    if child == 0:  # pragma: no cover (a child: leaves at once)
        code = 1
        try:
            counter = CompileCounterWithBackend("aot_eager")
            torch.compile = functools.partial(torch.compile, backend=counter)
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            COMPILED.clear()
            COUNTER[:] = [counter]
            main(["fit", "--config", str(config), "--run.threads", "1"])
            (tmp_path / "compiled.json").write_text(json.dumps(
                {"compiled": COMPILED, "graph_breaks": dict(torch._dynamo.utils.counters["graph_break"])}))
            code = 0
        except BaseException:
            (tmp_path / "error.txt").write_text(traceback.format_exc())
        finally:
            os._exit(code)
    status = forked.reap(child, 300)
    assert status == 0, (tmp_path / "error.txt").read_text() if (tmp_path / "error.txt").exists() else status
    ran = json.loads((tmp_path / "compiled.json").read_text())
    compiled = [tuple(row) for row in ran["compiled"]]
    assert sorted((tmp_path / "runs" / "tiny" / "checkpoints").glob("step-*.ckpt")), "no checkpoint was saved"
    events = [(kind, step) for kind, step, _ in compiled]
    assert events.count(("val", 2)) == 1 and events[-1] == ("val", 8), events  # validations in between and at the end
    first_val = events.index(("val", 2))
    settled = compiled[first_val][2]  # the training graph and the evaluation graph
    assert compiled[0][2] >= 1, "the training step was not compiled"
    assert [n for _, _, n in compiled[first_val:]] == [settled] * (len(compiled) - first_val), compiled
    assert not ran["graph_breaks"], ran["graph_breaks"]
