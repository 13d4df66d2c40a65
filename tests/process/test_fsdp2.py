"""FSDP2 (`--trainer.strategy fsdp`: Lightning's ModelParallelStrategy, tinylm.train.parallel) on CPU ranks (gloo):
the same training as one device or DDP, sharded checkpoints that resume exactly on FSDP2 (on 2 and 4 ranks, and on
two torchrun "nodes"), DDP and one device, saved atomically, and Muon on whole matrices. The runs are tiny (2
layers, n_embd 32, fp32); the command is forked from a process that has imported tinylm (tests/forked.py), its other
ranks started by Lightning (or torchrun).
"""

import csv
import datetime
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import forked
import lightning as L
import pytest
import torch
from helpers import exchanges

from tinylm.checkpoint import is_sharded_checkpoint, load_checkpoint
from tinylm.cli import main

pytestmark = [pytest.mark.process, pytest.mark.slow]
B, LEG = 4, 3
STEPS = 6 * LEG  # the chain's six legs


class SigtermToRankOne(L.Callback):
    """Rank 1 alone gets SIGTERM at the end of step LEG - 1: the ranks stop together at the end of step LEG and save
    last.ckpt."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == 1 and trainer.global_step == LEG - 1:
            os.kill(os.getpid(), signal.SIGTERM)


class KillInTheSaveOfLast(L.Callback):
    """kill -9 of the whole run (every rank) in its final save of last.ckpt, at the swap: the sharded folder written
    whole as last.ckpt.tmp, about to be exchanged with the previous last.ckpt (where the file system cannot exchange:
    about to be renamed into place, the previous last.ckpt already aside, none by that name)."""

    def setup(self, trainer, pl_module, stage):
        if trainer.global_rank == 0:
            def kill(event, args):
                # (an audit event comes before what it announces)
                if event in ("tinylm.exchange", "os.rename") and str(args[0]).endswith("last.ckpt.tmp") and \
                        trainer.global_step == trainer.max_steps:
                    os.killpg(0, signal.SIGKILL)

            sys.addaudithook(kill)


def _env() -> dict:
    here = Path(__file__).parent
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent),
                                                         os.environ.get("PYTHONPATH", "")])}


def _ranks(config: Path, strategy: str, *args: str, devices: int = 2, code: int = 0) -> str:
    """`tinylm fit` on `devices` CPU ranks with `strategy` (the global batch kept), in a session of its own (a
    kill of its process group ends every rank); what it printed on stderr."""
    cmd = ["fit", "--config", str(config), "--trainer.accelerator", "cpu", "--trainer.devices", str(devices),
           "--trainer.strategy", strategy, "--data.batch_size", str(2 * B // devices), *args]
    done = forked.run(cmd, cwd=config.parent, env=_env(), timeout=300, start_new_session=True)
    assert done.returncode == code, done.stderr[-3000:]
    return done.stderr


def _two_nodes(config: Path, *args: str) -> str:
    """`tinylm fit` as the user starts it on two nodes (one `torchrun --nnodes 2` per node, rendezvous at node 0):
    two loopback nodes of one CPU rank each, FSDP2 across them; what both printed on stderr."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
           "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "nodes", "-m", "tinylm",
           "fit", "--config", str(config), "--trainer.accelerator", "cpu", "--trainer.devices", "1",
           "--trainer.num_nodes", "2", "--trainer.strategy", "fsdp", "--data.batch_size", str(B), *args]
    nodes = [subprocess.Popen(cmd, cwd=config.parent, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        errs = [node.communicate(timeout=300)[1] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:  # a node left waiting for the other at the rendezvous
                node.kill()
    assert [node.returncode for node in nodes] == [0, 0], errs[0][-2000:] + errs[1][-2000:]
    return errs[0] + errs[1]


def _metric(run: Path, key: str) -> dict[int, float]:
    with open(run / "csv" / "metrics.csv") as f:
        return {int(r["step"]): float(r[key]) for r in csv.DictReader(f) if r.get(key)}


def _step(ckpt: Path) -> int:
    return int(load_checkpoint(ckpt, mmap=True)["global_step"])


def _shards(ckpt: Path) -> int:
    assert is_sharded_checkpoint(ckpt), ckpt
    return len(list(ckpt.glob("*.distcp")))


@pytest.fixture
def config(run_config):
    # the schedule's length is fixed (decay_steps), so each leg of a chain of resumes follows the straight run's
    return run_config(chars=40_000, seed_everything=5, run={"name": "straight", "checkpoint_every": LEG},
                      trainer={"max_steps": STEPS, "val_check_interval": 1000, "gradient_clip_val": 1.0},
                      model={"lr": 3e-3, "warmup_steps": 1, "decay_steps": STEPS},
                      data={"block_size": 32, "batch_size": 2 * B})


def test_fsdp2_trains_as_one_device_and_resumes_across_strategies_ranks_and_nodes(config, tmp_path, capsys):
    """One run in six legs against a straight one-device run with the same global batch (what DDP trains: see
    test_elastic): catches FSDP2 training another model (each rank's own shard norm clipped, a decay group chosen
    by a shard's shape, ranks starting from different weights), a sharded checkpoint that does not resume exactly,
    and a multi-node run that does not start or trains each node on its own. Legs, LEG steps each:
    1. FSDP2 on 2 ranks, stopped by SIGTERM to one rank (saved as a sharded folder, 2 shards);
    2. two nodes by torchrun (one rank each), FSDP2 resumed from it (2 ranks -> 2, both nodes' shards saved);
    3. FSDP2 on 4 ranks resumed from that (2 -> 4), killed by SIGKILL in its final save of last.ckpt (at the swap:
       the previous last.ckpt stays, whole);
    4. DDP from what `--ckpt_path last` then finds (the step-N folder of 4 shards, newer than last.ckpt,
       consolidated; FSDP2 -> DDP), clearing the new last.ckpt.tmp the kill left;
    5. FSDP2 on 2 ranks from DDP's file (DDP -> FSDP2), validating 3 batches at its end (2 on one rank);
    6. one device from FSDP2's folder (2 -> 1).
    Then generate, validate, export and init_from read one of FSDP2's folders."""
    main(["fit", "--config", str(config)])
    straight = tmp_path / "runs" / "straight"
    last = tmp_path / "runs" / "legs" / "checkpoints" / "last.ckpt"
    legs = ["--run.name", "legs"]
    err = _ranks(config, "fsdp", *legs, "--trainer.max_steps", "100000",
                 "--trainer.callbacks+=test_fsdp2.SigtermToRankOne", code=128 + signal.SIGTERM)
    assert f"interrupted by SIGTERM (to another rank) at step {LEG}; saved" in err, err[-3000:]
    assert _shards(last) == 2 and _step(last) == LEG
    first = _metric(tmp_path / "runs" / "legs", "train/loss")
    want, norms = _metric(straight, "train/loss"), _metric(straight, "train/grad_norm")
    assert [first[s] for s in range(LEG)] == pytest.approx([want[s] for s in range(LEG)], abs=1e-5)
    got_norms = _metric(tmp_path / "runs" / "legs", "train/grad_norm")
    assert [got_norms[s] for s in range(LEG)] == pytest.approx([norms[s] for s in range(LEG)], rel=1e-5)
    assert max(norms[s] for s in range(LEG)) > 1.0  # clipping acted: a norm per shard would have clipped otherwise
    err = _two_nodes(config, *legs, "--ckpt_path", "last", "--trainer.max_steps", str(2 * LEG))
    assert "x 2 device(s)" in err  # the global batch spans both nodes
    assert _shards(last) == 2 and _step(last) == 2 * LEG
    err = _ranks(config, "fsdp", *legs, "--ckpt_path", "last", "--trainer.max_steps", str(3 * LEG),
                 "--trainer.callbacks+=test_fsdp2.KillInTheSaveOfLast", devices=4, code=-signal.SIGKILL)
    assert _shards(last.parent / f"step-{3 * LEG}.ckpt") == 4 and _shards(last.parent / "last.ckpt.tmp") == 4
    if exchanges(tmp_path):  # killed at the exchange: the previous last.ckpt, whole; else between the renames
        assert _shards(last) == 2 and _step(last) == 2 * LEG
    why = f"is at step {2 * LEG}, behind it (the run stopped between two saves)" if last.exists() else "is missing"
    err = _ranks(config, "ddp", *legs, "--ckpt_path", "last", "--trainer.max_steps", str(4 * LEG))
    assert f"last.ckpt {why}; continuing from the newest readable checkpoint, step-{3 * LEG}.ckpt" in err, \
        err[-3000:]
    assert last.is_file() and _step(last) == 4 * LEG  # DDP writes a file
    # 3 validation batches on 2 ranks: a rank with one fewer left the other waiting in FSDP's all-gather forever
    err = _ranks(config, "fsdp", *legs, "--ckpt_path", "last", "--trainer.max_steps", str(5 * LEG),
                 "--data.val_batches", "3")
    assert _shards(last) == 2 and _step(last) == 5 * LEG
    assert 5 * LEG - 1 in _metric(tmp_path / "runs" / "legs", "val/loss"), err[-3000:]  # its final validation
    main(["fit", "--config", str(config), *legs, "--ckpt_path", "last"])
    got = _metric(tmp_path / "runs" / "legs", "train/loss")
    assert sorted(got) == sorted(want) == list(range(STEPS))
    assert [got[s] for s in range(STEPS)] == pytest.approx([want[s] for s in range(STEPS)], abs=1e-4)
    assert not [p for p in last.parent.iterdir() if p.suffix in (".tmp", ".old")]  # no leftovers
    _every_command_reads_a_sharded_checkpoint(config, last.parent / f"step-{5 * LEG}.ckpt", tmp_path, capsys)


def test_in_loop_samples_under_fsdp2_are_skipped_in_one_warning_not_a_crash(config, tmp_path):
    """Catches `--samples.every_n_steps N` under FSDP2 ending the run at its first sample step ("aten.embedding got
    mixed torch.Tensor and DTensor": rank 0 sampled alone from sharded weights), before that step's checkpoint."""
    err = _ranks(config, "fsdp", "--run.name", "samples", "--trainer.max_steps", "2", "--samples.every_n_steps", "1",
                 devices=1)
    assert "no text is sampled during training under --trainer.strategy fsdp" in err, err[-3000:]
    assert _step(tmp_path / "runs" / "samples" / "checkpoints" / "last.ckpt") == 2


def _every_command_reads_a_sharded_checkpoint(config: Path, folder: Path, tmp_path: Path, capsys) -> None:
    """generate, validate, export and model.init_from take FSDP2's folder as they take a file: its weights,
    consolidated, are the ones each uses."""
    from tinylm.checkpoint import load_model
    from tinylm.hf import import_hf
    from tinylm.train.init_from import load_pretrained

    assert is_sharded_checkpoint(folder)
    model, tokenizer, _ = load_model(folder)
    weights = model.state_dict()
    assert tokenizer is not None and len(weights) > 0
    capsys.readouterr()
    main(["generate", "--ckpt_path", str(folder), "--prompt", "ROMEO:", "--max_new_tokens", "8", "--strategy",
          "greedy"])
    assert capsys.readouterr().out.strip().startswith("ROMEO:")
    main(["validate", "--config", str(config), "--ckpt_path", str(folder)])
    main(["export", "--ckpt_path", str(folder), "--out", str(tmp_path / "hf")])
    exported = import_hf(tmp_path / "hf").state_dict()
    assert all(torch.equal(exported[k], v) for k, v in weights.items())
    _, state, _, _ = load_pretrained(folder, vocab_size=model.config.vocab_size, block_size=model.config.block_size)
    assert all(torch.equal(state[k], v) for k, v in weights.items())


def _muon_rank(rank: int, port: int) -> str:
    """One of two ranks (gloo) comparing FSDP2's Muon with one process's: the largest differences, after 3 steps and
    after a resume, and the shapes Muon's group holds (see the test)."""
    import copy

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from tinylm.model import GPT, GPTConfig
    from tinylm.train.optim import build_optimizer
    from tinylm.train.parallel import shard_gpt

    # a rank that never connects (its port taken meanwhile) fails the other in 2 minutes, not gloo's 30
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    reference = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=True))
    sharded = copy.deepcopy(reference)
    shard_gpt(sharded, init_device_mesh("cpu", (2,)), reshard_after_forward=True, bf16=False)
    kw = dict(optimizer="muon", lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), muon_lr=0.02, muon_momentum=0.95,
              muon_weight_decay=0.01, fused=False)
    opts = [build_optimizer(m, **kw) for m in (reference, sharded)]

    def step() -> float:
        for p, q in zip(reference.parameters(), sharded.parameters(), strict=True):
            p.grad = torch.randn_like(p)  # the same gradients on both ranks and both models
            q.grad = distribute_tensor(p.grad, q.device_mesh, q.placements, src_data_rank=None)
        for o in opts:
            o.ns_dtype = torch.float32
            o.step()
        return max((p - q.full_tensor()).abs().max().item()
                   for p, q in zip(reference.parameters(), sharded.parameters(), strict=True))

    torch.manual_seed(1)
    worst = max(step() for _ in range(3))
    # a resume: the sharded optimizer's state through torch.distributed.checkpoint's state_dict API (what
    # Lightning's ModelParallelStrategy saves and loads) into a new optimizer, then one more step on both sides
    saved = get_optimizer_state_dict(sharded, opts[1])
    opts[1] = build_optimizer(sharded, **kw)
    set_optimizer_state_dict(sharded, opts[1], optim_state_dict=saved)
    resumed = step()
    shapes = sorted(tuple(q.shape) for g in opts[1].param_groups for q in g["params"] if g["optimizer"] == "muon")
    dist.destroy_process_group()
    return f"worst {worst} resumed {resumed} shapes {shapes}"


def test_muon_on_sharded_parameters_steps_as_one_process(tmp_path):
    """Catches Muon orthogonalising each rank's shard of a matrix (another update: Newton-Schulz of some rows is
    not the rows of Newton-Schulz) or grouping matrices by a shard's shape: given the same gradients, FSDP2's Muon
    on 2 ranks must leave the very weights one process's Muon does (fp32 Newton-Schulz), also after its state went
    through torch.distributed.checkpoint's state_dict API (a sharded checkpoint) into a new optimizer. The ranks are
    processes forked from this one (torch and tinylm imported once)."""
    import torch.distributed.checkpoint.state_dict  # noqa: F401 (imported once, here, not by each rank)
    import torch.distributed.fsdp  # noqa: F401

    import tinylm.train.optim  # noqa: F401
    import tinylm.train.parallel  # noqa: F401

    line = forked.two_ranks(_muon_rank, tmp_path, timeout=300)[0]
    worst, resumed = float(line.split()[1]), float(line.split()[3])
    assert worst == 0.0 and resumed == 0.0, line
    assert "(96, 32)" in line and "(128, 32)" in line  # whole matrices: c_attn (3C, C), mlp.c_fc (4C, C)


# audit events that change a folder (tinylm.exchange: tinylm.paths.exchange, a system call through ctypes)
_CHANGES = ("os.rename", "os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree", "tinylm.exchange")


def _checkpoint(version: int, *, form: str = "folder") -> dict:
    """A checkpoint of step ``version`` whose weights and optimizer state all equal ``version``, as FSDP2 saves it
    (optimizer state keyed by parameter name) or (``form`` "file") as one device or DDP does (by index)."""
    from tinylm.checkpoint import CHECKPOINT_FORMAT

    moment = {"exp_avg": torch.full((20_000,), float(version))}
    optimizer = {"state": {"model.w": moment}, "param_groups": [{"params": ["model.w"], "lr": 0.1}]} \
        if form == "folder" else {"state": {0: moment}, "param_groups": [{"params": [0], "lr": 0.1}]}
    return {"state_dict": {"model.w": torch.full((20_000,), float(version))}, "optimizer_states": [optimizer],
            "global_step": version, "tinylm": {"format": CHECKPOINT_FORMAT}}


def _version_saved(strategy, folder: Path, version: int, *, form: str = "folder") -> None:
    """What a run's save at step ``version`` does (PeriodicCheckpoint._save_now, keep_checkpoints 2): the oldest
    step-N removed, step-<version>.ckpt written, then last.ckpt; by FSDP2 (DCP folders) or (``form`` "file") one
    device or DDP."""
    from tinylm.train.checkpoint_io import AtomicCheckpointIO

    for old in sorted(folder.glob("step-*.ckpt"), key=lambda p: int(p.stem[5:]))[:-1]:
        strategy.remove_checkpoint(old)
    for name in (f"step-{version}.ckpt", "last.ckpt"):
        if form == "file":
            AtomicCheckpointIO().save_checkpoint(_checkpoint(version, form=form), folder / name)
        else:
            strategy.save_checkpoint(_checkpoint(version), folder / name)


def _whole_version(path: Path) -> int:
    """The step of checkpoint ``path``, after checking every tensor in it is of that step's save (not a mix)."""
    ckpt = load_checkpoint(path)
    version = ckpt["global_step"]
    tensors = [ckpt["state_dict"]["model.w"], *ckpt["optimizer_states"][0]["state"][0].values()]
    assert all(torch.equal(t, torch.full((20_000,), float(version))) for t in tensors), path
    return version


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_sharded_checkpoints_step_is_read_from_its_meta_pt_alone(tmp_path, monkeypatch):
    """Catches `--ckpt_path last` (and every listing of a checkpoints folder: a cut save's repair, a rollback, a
    second Ctrl+C) reading each FSDP2 folder's weights whole to learn its step: ~3 s a GB and the weights' memory,
    ~90 s per resume of a 1.5B run keeping 3 steps. Its meta.pt says it."""
    import tinylm.checkpoint as checkpoint
    from tinylm.checkpoint_steps import checkpoints_by_step
    from tinylm.train.parallel import FSDP2Strategy

    strategy = FSDP2Strategy()
    for version in (1, 2):
        _version_saved(strategy, tmp_path, version)
    read = []
    monkeypatch.setattr(checkpoint, "_read_dcp", lambda path, *a, real=checkpoint._read_dcp: read.append(path.name)
                        or real(path, *a))
    found, broken = checkpoints_by_step(tmp_path)
    assert sorted(found) == [(1, False, tmp_path / "step-1.ckpt"), (2, False, tmp_path / "step-2.ckpt"),
                             (2, True, tmp_path / "last.ckpt")] and broken == []
    assert read == []
    assert _whole_version(tmp_path / "last.ckpt") == 2 and read == ["last.ckpt"]  # (the spy sees a whole read)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_kill_at_any_point_of_a_sharded_save_leaves_last_whole_or_absent(tmp_path):
    """Catches a kill -9 during FSDP2's save (a DCP folder: shards, .metadata, meta.pt, then the swap) leaving a
    last.ckpt that loads half, or none (killed between two renames: `--ckpt_path last` then went back to an older
    step-N), or leftovers that make the next save fail (a `.old` folder that the rename aside cannot replace) or stay
    forever (another name's `.tmp`). A process forked from this one (the whole import once) does what a run's save
    does (FSDP2 resumed from DDP's files): the removal of the oldest step-N (a folder), the saves of step-N and
    last.ckpt (over a file), and SIGKILLs itself at its K-th change to the folder (the exchange among them), K = 1,
    2, ... until it finishes; after each kill last.ckpt is the previous checkpoint or the new one, whole (or, where
    the file system cannot exchange, absent), `--ckpt_path last` picks a whole checkpoint, and the next save (the
    resumed run's) succeeds and leaves nothing beside the checkpoints (over a folder)."""
    from tinylm.cli.resume import latest_checkpoint
    from tinylm.train.parallel import FSDP2Strategy

    strategy, run, before = FSDP2Strategy(), tmp_path / "run", tmp_path / "before"
    always = exchanges(tmp_path)  # last.ckpt is never absent
    folder = run / "checkpoints"
    before.mkdir()
    _version_saved(strategy, before, 1)
    _version_saved(strategy, before, 2, form="file")  # a resume on FSDP2 from DDP's files
    for k in range(1, 200):
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(before, folder)
        child = os.fork()
        if child == 0:  # pragma: no cover (a child: dies by SIGKILL or leaves at once)
            try:
                seen = [0]

                def kill_at_k(event, args, k=k, seen=seen):
                    if event in _CHANGES or event == "open" and str(args[0]).startswith(str(folder)) \
                            and "w" in str(args[1]):
                        seen[0] += 1
                        if seen[0] == k:
                            os.kill(os.getpid(), signal.SIGKILL)

                sys.addaudithook(kill_at_k)
                _version_saved(strategy, folder, 3)
            finally:
                os._exit(0)
        killed = os.WIFSIGNALED(forked.reap(child))
        last = folder / "last.ckpt"
        assert last.exists() or not always, f"killed at change {k}: no last.ckpt"
        assert not last.exists() or _whole_version(last) in (2, 3), f"killed at change {k}"
        assert _whole_version(Path(latest_checkpoint(run))) >= 2, f"killed at change {k}"
        assert all(_whole_version(p) for p in folder.glob("*.ckpt")), f"killed at change {k}"  # none half removed
        strategy.save_checkpoint(_checkpoint(4), last)  # the resumed run's next save
        assert _whole_version(last) == 4
        assert not [p.name for p in folder.iterdir() if p.suffix in (".tmp", ".old")], f"killed at change {k}"
        if not killed:
            break
    assert k > 10  # not vacuous: killed at each of many changes
