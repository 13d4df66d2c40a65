"""Crash safety and safe loading: kill -9 mid-write never leaves a file or dataset that looks complete but is not,
and loading never executes code."""

import contextlib
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import forked
import pytest
import torch

from tinylm.checkpoint import CheckpointError, load_checkpoint
from tinylm.train.checkpoint_io import AtomicCheckpointIO

pytestmark = pytest.mark.process  # runs whole `tinylm` processes (tests/process)

def _saving_forever(path: Path) -> int:
    """A child forked from this process (torch imported once) that rewrites checkpoint ``path`` until it is killed,
    each version tagged and ~16 MB so writes take a while; its pid, once it starts its first save."""
    ready, said = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (a child: killed, or leaves at once, never back into pytest)
        try:
            os.close(ready)
            os.write(said, b"ready")
            io, i = AtomicCheckpointIO(), 1
            while True:
                io.save_checkpoint({"state_dict": {"w": torch.full((4_000_000,), float(i))},
                                    "tinylm": {"format": 1, "version": i}}, path)
                i += 1
        finally:
            os._exit(1)
    os.close(said)
    assert os.read(ready, 5) == b"ready"
    os.close(ready)
    return child


def _spawn(args: list[str], cwd: Path, stdin: int | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen(args, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)


def test_kill_during_checkpoint_save_leaves_a_whole_file(tmp_path):
    """Catches a crash mid-save corrupting last.ckpt (Lightning's own writer moves an unsynced temp file). Killed
    0.05, 0.3, 0.7 and 1.2 s into the saves, each a fresh file and writer (forked from this process, which imported
    torch once)."""
    for delay in (0.05, 0.3, 0.7, 1.2):
        path = tmp_path / f"after-{delay}s" / "last.ckpt"
        path.parent.mkdir()
        AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.zeros(4_000_000)},
                                              "tinylm": {"format": 1, "version": 0}}, path)
        pid = _saving_forever(path)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        assert forked.reap(pid, 30) != 0  # killed, and reaped: nothing writes the file any more
        ckpt = load_checkpoint(path)  # whole: old or new, never a mix
        version = ckpt["tinylm"]["version"]
        assert torch.all(ckpt["state_dict"]["w"] == float(version)), f"killed {delay} s into the saves"


def test_truncated_checkpoint_is_reported_clearly(tmp_path):
    """Catches a half-written file surfacing as an obscure zip/pickle traceback."""
    good = tmp_path / "good.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(1000)}, "tinylm": {"format": 1}}, good)
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or not a torch file"):
        load_checkpoint(bad)


def test_garbled_bytes_inside_a_checkpoint_are_reported_clearly(tmp_path):
    """Catches bytes garbled inside the pickle (a bad disk, a bad copy) escaping as a UnicodeDecodeError traceback
    from fit, validate and generate, and `--ckpt_path last` not skipping such a file."""
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {}, "tinylm": {"format": 1}, "name": "x" * 20}, path)
    data = path.read_bytes()
    assert data.count(b"x" * 20) == 1  # torch's zip stores the pickle uncompressed
    path.write_bytes(data.replace(b"x" * 20, b"\xff" * 20))
    with pytest.raises(CheckpointError, match="not a readable checkpoint.*can't decode"):
        load_checkpoint(path)


def test_garbled_pickle_opcodes_are_damage_not_code(tmp_path):
    """Catches a checkpoint whose pickle bytes were garbled (a bad disk, a copy with a hole of NULs), or a sharded
    folder's meta.pt / .metadata of NULs, being refused as "holds objects other than tensors ... (it needs code to
    load)": it is a damaged file, and the fix is another checkpoint, not distrust of its writer."""
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(3)}, "tinylm": {"format": 1}}, path)
    data = bytearray(path.read_bytes())
    start = data.index(b"\x80\x02")  # the pickle's PROTO 2, stored uncompressed in torch's zip
    data[start + 2:start + 12] = b"\xff" * 10
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="not a readable checkpoint.*damaged") as e:
        load_checkpoint(path)
    assert "needs code" not in str(e.value)
    folder = tmp_path / "sharded.ckpt"
    folder.mkdir()
    (folder / "meta.pt").write_bytes(b"\x00" * 64)  # a hole a crash left
    (folder / ".metadata").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="not a readable.*damaged"):
        load_checkpoint(folder)


def test_foreign_files_are_reported_clearly(tmp_path):
    """Catches a YAML, a plain state_dict or another tool's checkpoint being half-loaded."""
    text = tmp_path / "config.yaml"
    text.write_text("model: {}\n")
    with pytest.raises(CheckpointError, match=r"'.*config.yaml' is not a checkpoint \(not a torch file: a .yaml "
                       r"file\?\); pass --ckpt_path PATH to a .ckpt"):  # (not: "use an earlier step-*.ckpt")
        load_checkpoint(text)
    plain = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(3)}, plain)
    with pytest.raises(CheckpointError, match="not a Lightning checkpoint"):
        load_checkpoint(plain)
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"w": torch.ones(3)}}, other)
    with pytest.raises(CheckpointError, match="not written by tinylm"):
        load_checkpoint(other)
    with pytest.raises(FileNotFoundError, match="--ckpt_path"):
        load_checkpoint(tmp_path / "missing.ckpt")


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_pickle_payload_in_checkpoint_is_refused(tmp_path, monkeypatch):
    """Catches checkpoint loading that executes code from the file (torch.load without weights_only)."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "tinylm": {}, "hook": _Payload()}, path)
    with zipfile.ZipFile(path) as z:  # not vacuous: the payload really is in the file
        assert any(b"system" in z.read(n) for n in z.namelist() if n.endswith(".pkl"))
    with pytest.raises(CheckpointError, match="never executes code") as e:
        load_checkpoint(path)
    assert "it needs" in str(e.value) and "weights_only" not in str(e.value)  # not torch's advice to load unsafely
    assert not (tmp_path / "PWNED").exists()
    with pytest.raises(pickle.UnpicklingError):  # and the same file would run code under plain pickle rules
        torch.load(path, weights_only=True)


def test_pickle_payload_in_a_sharded_checkpoints_metadata_is_refused(tmp_path, monkeypatch):
    """Catches reading FSDP2's checkpoint folder (generate, export, a resume on one device) through torch's DCP
    reader, which unpickles the folder's .metadata with a bare pickle.load: code in it would run."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    torch.save({"tinylm": {"format": 1}, "global_step": 1}, folder / "meta.pt")
    (folder / ".metadata").write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(CheckpointError, match="never executes code"):
        load_checkpoint(folder)
    assert not (tmp_path / "PWNED").exists()


_PREPARER = r"""
import os, sys
from tinylm.cli import main
said = os.fdopen(os.dup(1), "w")  # the lines the test reads; prepare's own output (some of it not through
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # sys.stdout) goes nowhere
# one small prepare first: every module prepare needs is imported before the forks
main(["prepare", "--data.corpus", sys.argv[1], "--data.tokenizer", "char", "--data.cache_dir", sys.argv[2]])
import tokenizers  # the bpe tokenizer's (the char one needs none)
for line in sys.stdin:  # a cache folder: a forked child prepares into it until the test kills it
    child = os.fork()
    if child == 0:
        try:
            print("ready", os.getpid(), file=said, flush=True)
            main(["prepare", "--data.corpus", sys.argv[3], "--data.tokenizer", "bpe", "--data.vocab_size", "2048",
                  "--data.cache_dir", line.strip()])
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    print("killed", file=said, flush=True)
"""


def _wait_for_work(cache: Path, timeout: float = 60) -> None:
    """Until prepare's first temp folder shows in ``cache`` (it has begun writing), or a finished dataset does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(cache.rglob("*.tmp-*")) or any(cache.glob("datasets/*/meta.json")):
            return
        time.sleep(0.002)
    raise AssertionError(f"prepare wrote nothing into {cache} in {timeout} s")


def test_kill_during_prepare_never_leaves_a_dataset_that_looks_complete(tmp_path, small_data):
    """Catches a crashed `tinylm prepare` leaving a folder that a later run takes for a finished dataset. Killed
    0, 0.1, 0.3 and 0.8 s after its first temp folder shows (training the BPE, then packing), each into a fresh
    cache, by a process forked from one that imported what prepare needs: a kill timed from the start of `python -m
    tinylm` landed in its 5-10 s of imports, and one timed from the fork landed before or after the work on a
    machine faster or slower than the one it was tuned on (CI's trained the BPE in 0.5 s: no kill landed)."""
    corpus = tmp_path / "corpus.txt"
    # 1.1 MB like all of tinyshakespeare, so prepare works for seconds (~2 s on 2 cores) and the kills land mid-way
    corpus.write_text((small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8") * 11, encoding="utf-8")
    small = tmp_path / "small.txt"
    small.write_text("warm up " * 500, encoding="utf-8")
    proc = _spawn([sys.executable, "-c", _PREPARER, str(small), str(tmp_path / "warm-up"), str(corpus)], tmp_path,
                  stdin=subprocess.PIPE)
    try:
        cut = 0  # kills that left a build unfinished
        for delay in (0.0, 0.1, 0.3, 0.8):
            cache = tmp_path / f"after-{delay}s"
            proc.stdin.write(f"{cache}\n")
            proc.stdin.flush()
            said, pid = proc.stdout.readline().split()
            assert said == "ready"
            _wait_for_work(cache)
            time.sleep(delay)
            with contextlib.suppress(ProcessLookupError):  # (a fast machine: it finished)
                os.kill(int(pid), signal.SIGKILL)
            assert proc.stdout.readline().strip() == "killed"
            cut += any(cache.rglob("*.tmp-*"))
            for meta in cache.rglob("meta.json"):  # whatever claims to be complete must be complete
                folder = meta.parent
                for split in ("train", "val"):
                    assert (folder / f"{split}.bin").stat().st_size > 0, f"killed {delay} s into prepare"
            from tinylm.data import TinyLMDataModule

            dm = TinyLMDataModule(corpus=str(corpus), tokenizer="bpe", vocab_size=2048, cache_dir=str(cache),
                                  block_size=64)
            dm.prepare_data()  # rebuilds whatever the crash left half-done
            meta = dm.meta
            for split in ("train", "val"):
                size = (dm.dataset_dir / f"{split}.bin").stat().st_size
                assert size == meta["splits"][split]["tokens"] * 2 > 0  # uint16: 2 bytes a token, every token there
        assert cut, "no kill landed while prepare worked: the test proved nothing"
    finally:
        proc.kill()
        proc.wait()


def test_failed_save_leaves_no_temp_file_for_long(tmp_path):
    """Prevents a save killed mid-write (step-100.ckpt.tmp, the size of a checkpoint) from staying on disk for
    good: later saves write other names, so nothing ever overwrote it."""
    from tinylm.checkpoint import atomic_write_bytes

    io = AtomicCheckpointIO()
    stale = tmp_path / "step-100.ckpt.tmp"
    stale.write_bytes(b"half a checkpoint")  # what kill -9 during the save of step-100.ckpt leaves
    (tmp_path / "notes.tmp").write_text("not ours")
    io.save_checkpoint({"state_dict": {}, "tinylm": {}}, tmp_path / "step-200.ckpt")
    assert not stale.exists() and (tmp_path / "notes.tmp").exists()
    assert torch.load(tmp_path / "step-200.ckpt", weights_only=True)["tinylm"] == {}
    with pytest.raises(TypeError):  # a write that fails in-process removes its own temp file at once
        atomic_write_bytes(tmp_path / "step-300.ckpt", None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.tmp", "step-200.ckpt"]


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="file size limits are POSIX's")
def test_a_save_failing_mid_write_keeps_the_previous_checkpoint_and_names_the_file(tmp_path):
    """Catches a save streamed into its .tmp that fails part-way (a full disk; here a file size limit, the same
    OSError from the same write) leaving the .tmp behind, touching the previous checkpoint, or surfacing as torch's
    "unexpected pos" RuntimeError (its zip writer's, as it closes the archive after the failed write) instead of the
    write's own error naming the checkpoint."""
    import errno
    import resource

    path, io = tmp_path / "last.ckpt", AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.zeros(10)}, "tinylm": {"format": 1, "version": 0}}, path)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    ignored = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, not a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, hard))
    try:
        with pytest.raises(OSError) as e:  # 4 MB: the limit falls inside the tensor's bytes
            io.save_checkpoint({"state_dict": {"w": torch.ones(1_000_000)}, "tinylm": {"format": 1, "version": 1}},
                               path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, ignored)
    assert e.value.errno == errno.EFBIG and e.value.filename == str(path)
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert load_checkpoint(path)["tinylm"]["version"] == 0


@pytest.mark.parametrize("can_exchange", [True, False], ids=["exchange", "two renames"])
def test_a_file_saved_over_a_sharded_checkpoint_never_leaves_its_name_empty(tmp_path, monkeypatch, can_exchange):
    """Catches a save by one device or DDP over FSDP2's last.ckpt folder (a resume on another strategy) renaming the
    folder aside before the file took its place: a kill in between left no last.ckpt, and `--ckpt_path last` went
    back to an older step-N. Before each change the save makes to the folder (Python's audit events, the exchange
    among them) last.ckpt is whole, the folder or the file; a folder a killed sharded save left at last.ckpt.tmp
    does not stop the save (open() cannot replace a folder); where the file system cannot exchange (two renames)
    the save still succeeds, leaving nothing beside it."""
    from helpers import exchanges

    import tinylm.paths
    from tinylm.checkpoint import atomic_write_bytes

    if can_exchange and not exchanges(tmp_path):
        pytest.skip("this file system cannot exchange two paths (renameat2 RENAME_EXCHANGE)")
    if not can_exchange:
        monkeypatch.setattr(tinylm.paths, "exchange", lambda a, b: False)
    last = tmp_path / "last.ckpt"
    for folder in (last, tmp_path / "last.ckpt.tmp"):  # FSDP2's checkpoint, and a killed save's
        folder.mkdir()
        (folder / "meta.pt").write_bytes(b"earlier")
    seen, watching = [], [True]

    def hook(event, args):  # (an audit hook stays for the process's life: it watches during the save only)
        if watching[0] and event in ("os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "tinylm.exchange"):
            seen.append((event, last.is_file() or (last / "meta.pt").is_file()))

    sys.addaudithook(hook)
    try:
        atomic_write_bytes(last, b"new")
    finally:
        watching[0] = False
    assert last.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert ("tinylm.exchange", True) in seen if can_exchange else ("os.rename", True) in seen
    if can_exchange:
        assert all(whole for _, whole in seen), seen


def test_checkpoint_with_unreadable_tokenizer_names_the_checkpoint(tmp_path):
    """Prevents a checkpoint whose tokenizer state this tinylm cannot rebuild (another version, an edit) from
    failing with "tokenizer state has version 99" and no word of which file."""
    from tinylm.checkpoint import CHECKPOINT_FORMAT, load_model
    from tinylm.model import GPT, GPTConfig

    hparams = {"vocab_size": 16, "block_size": 8, "n_layer": 1, "n_head": 1, "n_embd": 8, "pad_vocab_multiple": 1}
    state = {f"model.{k}": v for k, v in GPT(GPTConfig(**hparams)).state_dict().items()}
    tok = {"version": 99, "kind": "char", "state": {}}
    torch.save({"state_dict": state, "hyper_parameters": hparams,
                "tinylm": {"format": CHECKPOINT_FORMAT, "tokenizer": tok}}, tmp_path / "old.ckpt")
    with pytest.raises(CheckpointError, match=r"old\.ckpt' holds a tokenizer this tinylm cannot rebuild.*version 99"):
        load_model(tmp_path / "old.ckpt")


def test_prepared_dataset_appears_by_one_rename_of_a_complete_folder(tmp_path, small_data, monkeypatch):
    """Catches a prepared dataset published by copying its temp folder into place (or built in place): a crash
    mid-copy leaves a folder whose meta.json says "complete" beside a short or missing train.bin/val.bin. The
    folder must take its name by one rename (os.replace, atomic) of a sibling temp folder that is already a whole
    dataset; and when that rename fails, no folder with meta.json may be left under the name."""
    from tinylm.data.corpus import open_corpus
    from tinylm.data.prepare import dataset_dir_for, load_meta, prepare_dataset
    from tinylm.tokenize.tokenizer import build_tokenizer

    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:5000]
    (tmp_path / "c.txt").write_text(text, encoding="utf-8")
    corpus = open_corpus(str(tmp_path / "c.txt"), cache_dir=tmp_path)
    tok = build_tokenizer("char", documents=lambda: iter([text]))
    real_replace, renames, fail = os.replace, [], [False]

    def replace(src, dst, *args, **kwargs):  # the real rename, watched (and made to fail on request)
        if Path(dst).name.startswith("c.txt-") and Path(dst).parent.name == "datasets":
            assert not (Path(dst) / "meta.json").exists()
            load_meta(src, tok)  # the folder being published is already a whole dataset
            renames.append((Path(src), Path(dst)))
            if fail[0]:
                raise OSError("simulated failure of the publishing rename")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    final = dataset_dir_for(corpus, tok, val_fraction=0.1, cache_dir=tmp_path / "cache")
    assert prepare_dataset(corpus, tok, val_fraction=0.1, cache_dir=tmp_path / "cache") == final
    assert [dst for _, dst in renames] == [final] and renames[0][0].parent == final.parent
    assert load_meta(final, tok)["splits"]["train"]["tokens"] == 4500

    fail[0], renames[:] = True, []
    broken = dataset_dir_for(corpus, tok, val_fraction=0.1, cache_dir=tmp_path / "cache2")
    with pytest.raises(OSError, match="simulated failure"):
        prepare_dataset(corpus, tok, val_fraction=0.1, cache_dir=tmp_path / "cache2")
    assert [dst for _, dst in renames] == [broken]
    assert not (broken / "meta.json").exists()
    assert not [p for p in broken.parent.iterdir() if (p / "meta.json").exists()]  # no temp folder left either


_HPARAMS = {"vocab_size": 16, "block_size": 8, "n_layer": 1, "n_head": 1, "n_embd": 8, "pad_vocab_multiple": 1}


def _model_checkpoint(path: Path, *, hparams=None, fmt=1, edit=lambda state: None) -> Path:
    """A checkpoint as `tinylm fit` writes it (a 1-layer, 8-wide GPT under "model."), its state edited by `edit`."""
    from tinylm.model import GPT, GPTConfig

    torch.manual_seed(0)
    state = {f"model.{k}": v for k, v in GPT(GPTConfig(**_HPARAMS)).state_dict().items()}
    edit(state)
    torch.save({"state_dict": state, "hyper_parameters": hparams or _HPARAMS, "tinylm": {"format": fmt}}, path)
    return path


@pytest.mark.parametrize("fmt", [2, None])
def test_checkpoint_of_another_format_is_refused(tmp_path, fmt):
    """Catches a checkpoint whose "tinylm" section has another format version (a later tinylm's, or none) being
    read as this version's: it is refused naming both versions; format 1 loads (not vacuous)."""
    from tinylm.checkpoint import load_model

    load_model(_model_checkpoint(tmp_path / "ok.ckpt"))
    path = _model_checkpoint(tmp_path / "other.ckpt", fmt=fmt)
    with pytest.raises(CheckpointError, match=re.escape(
            f"'{path}' has tinylm checkpoint format {fmt!r}, this tinylm reads 1; "
            "use the tinylm version that wrote it")):
        load_checkpoint(path)


def _drop_ln_f(state):
    del state["model.transformer.ln_f.weight"]


def _add_extra(state):
    state["model.transformer.extra.weight"] = torch.ones(2)
    state["loss_fn.weight"] = torch.ones(2)  # outside "model.": not the GPT's, ignored


def _nan(state):
    state["model.transformer.h.0.mlp.c_fc.bias"][3] = float("nan")


@pytest.mark.parametrize("edit, message", [
    (_drop_ln_f, "does not match its hyperparameters: missing weights ['transformer.ln_f.weight'], "
                 "unexpected weights []"),
    (_add_extra, "does not match its hyperparameters: missing weights [], "
                 "unexpected weights ['transformer.extra.weight']"),
    (_nan, "holds non-finite weights (NaN or inf) in 1 tensors, e.g. 'transformer.h.0.mlp.c_fc.bias': "
           "the run diverged"),
], ids=["missing", "unexpected", "nan"])
def test_checkpoint_weights_that_are_not_the_model_are_named(tmp_path, edit, message):
    """Catches load_model building a model from weights its hyperparameters do not describe (a dropped tensor left
    at its random init, an extra one silently ignored) or from a diverged run's NaN weights (every token NaN): each
    is refused naming the tensors; the unedited file loads (not vacuous)."""
    from tinylm.checkpoint import load_model

    model, _, _ = load_model(_model_checkpoint(tmp_path / "ok.ckpt"))
    assert model.transformer.ln_f.weight.shape == (8,)
    path = _model_checkpoint(tmp_path / "edited.ckpt", edit=edit)
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint '{path}' {message}")):
        load_model(path)


def test_checkpoint_hyperparameters_that_build_no_model_are_named(tmp_path):
    """Catches hyperparameters no GPT can have (n_head 3 for n_embd 8, an edited file) escaping as GPTConfig's bare
    ValueError, without the checkpoint's name."""
    from tinylm.checkpoint import load_model

    path = _model_checkpoint(tmp_path / "edited.ckpt", hparams={**_HPARAMS, "n_head": 3})
    with pytest.raises(CheckpointError, match=re.escape(
            f"checkpoint '{path}' has hyperparameters that build no GPT (n_embd (8) must be divisible by n_head (3)")):
        load_model(path)


_SWAP_EVENTS = ("os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "tinylm.export.swap")


def _export_killed_at(k: int, ckpt: Path, out: Path) -> bool:
    """`tinylm export --ckpt_path CKPT --out OUT` in a child forked from this process (tinylm, transformers and
    tokenizers already imported: what each export imports, imported once, before the kills, not in them), SIGKILLed
    at its K-th change to OUT's parent (Python's own audit events, and the swap); whether the kill came."""
    from tinylm.cli import main

    child = os.fork()
    if child == 0:  # pragma: no cover (a child: dies by SIGKILL or leaves at once, never back into pytest)
        try:
            seen, parent = [0], os.path.dirname(out)

            def hook(event, args):
                if event in _SWAP_EVENTS and any(isinstance(a, str) and a.startswith(parent) for a in args):
                    seen[0] += 1
                    if seen[0] == k:
                        os.kill(os.getpid(), signal.SIGKILL)

            sys.addaudithook(hook)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # what export prints
            main(["export", "--ckpt_path", str(ckpt), "--out", str(out)])
        finally:
            os._exit(0)
    return os.WIFSIGNALED(forked.reap(child))


@pytest.mark.slow
def test_a_kill_at_any_point_of_an_export_leaves_one_whole_export(tmp_path):
    """Catches an export into a folder holding an earlier one deleting the old files before moving the new ones in:
    a kill in between left neither whole (no weights, or the old weights with the new tokenizer). The export is
    killed at each of its changes to the folder in turn (the swap among them), and after each the folder loads in
    transformers as the earlier export or the new one, whole; the next export leaves nothing behind beside it."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast  # noqa: F401 (before the forks)

    import tinylm.cli.commands  # noqa: F401 (what each export imports: before the forks, not in each)
    from tinylm.hf import export_hf
    from tinylm.tokenize.tokenizer import Tokenizer, build_tokenizer

    ckpts = {}
    for name, text in (("old", "First Citizen:\nBefore we proceed"), ("new", "All: Speak, speak! Äpfel? 3.5")):
        tokenizer = build_tokenizer("char", documents=lambda text=text: [text, text[::-1]])
        module = _tiny_module(tokenizer)
        ckpts[name] = tmp_path / f"{name}.ckpt"
        _save(module, ckpts[name])
    want = {}
    for name, ckpt in ckpts.items():
        ref = export_hf(ckpt, tmp_path / "ref" / name)
        want[name] = (sorted(p.name for p in ref.iterdir()), load_file(ref / "model.safetensors"),
                      Tokenizer.load(ref / "tinylm_tokenizer").fingerprint)
    out = tmp_path / "exports" / "hf"
    for k in range(1, 40):
        shutil.rmtree(out.parent, ignore_errors=True)
        export_hf(ckpts["old"], out)
        killed = _export_killed_at(k, ckpts["new"], out)
        names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))  # hidden: not loaded
        which = [name for name, (files, weights, fingerprint) in want.items() if names == files
                 and _same(load_file(out / "model.safetensors"), weights)
                 and Tokenizer.load(out / "tinylm_tokenizer").fingerprint == fingerprint]
        assert which, f"killed at change {k}: {names}"
        transformers.AutoModelForCausalLM.from_pretrained(out)  # loads
        if not killed:
            assert which == ["new"] and os.listdir(out.parent) == ["hf"]  # nothing left beside it
            break
        export_hf(ckpts["new"], out)  # the next export cleans up what the killed one left
        assert os.listdir(out.parent) == ["hf"] and _same(load_file(out / "model.safetensors"), want["new"][1])
    assert k > 1  # not vacuous: it was killed at least once


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def _tiny_module(tokenizer):
    from tinylm.train.module import TinyLM

    torch.manual_seed(len(tokenizer.state_dict()["vocab"]) if "vocab" in tokenizer.state_dict() else 0)
    module = TinyLM(vocab_size=tokenizer.vocab_size, block_size=16, eos_id=tokenizer.eos_id, n_layer=1, n_head=2,
                    n_embd=16, pad_vocab_multiple=1, warmup_steps=0)
    module.tokenizer_state = tokenizer.state_dict()
    return module


def _save(module, path: Path) -> None:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    data = torch.randint(0, module.model.config.vocab_size, (2, 17))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=2))
    trainer.save_checkpoint(path)


def test_a_checkpoint_replaced_as_it_loads_is_read_whole(tmp_path, monkeypatch):
    """Catches `tinylm generate`/`eval`/`export` on a running fit's last.ckpt loading weights no checkpoint holds
    (or NaN, or a "truncated" refusal): with mmap torch opens the path twice, the zip index and then the mapping,
    and a save renamed over it in between had the old file's index read the new file's bytes. The rename lands
    there (when torch maps the file) exactly; the load is the new file's, whole."""
    path, older, newer = tmp_path / "last.ckpt", tmp_path / "step-1.ckpt", tmp_path / "step-2.ckpt"
    torch.save({"state_dict": {"w": torch.arange(1000.0)}, "tinylm": {"format": 1, "note": "1"}}, older)
    # another length before the tensor's bytes: every offset of the index is off in the newer file
    torch.save({"state_dict": {"w": -torch.arange(1000.0)}, "tinylm": {"format": 1, "note": "2" * 300}}, newer)
    shutil.copyfile(older, path)
    real, saves = torch.UntypedStorage.from_file, []

    def the_fit_saves_first(*args, **kwargs):
        if not saves:  # the running fit's atomic save: a whole new file renamed over the path
            shutil.copyfile(newer, tmp_path / "last.ckpt.tmp")
            os.replace(tmp_path / "last.ckpt.tmp", path)
            saves.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.UntypedStorage, "from_file", the_fit_saves_first)
    ckpt = load_checkpoint(path, mmap=True)
    assert saves and ckpt["tinylm"]["note"] == "2" * 300
    assert torch.equal(ckpt["state_dict"]["w"], -torch.arange(1000.0))


def test_a_checkpoint_removed_as_it_loads_is_said_so(tmp_path, monkeypatch):
    """Catches `--ckpt_path last` on a running fit with run.keep_checkpoints failing on a step-N.ckpt it had just
    listed and the fit then rotated out: the listing skips it, and a load of it says it was removed."""
    from tinylm.checkpoint_steps import checkpoints_by_step

    for step in (1, 2):
        torch.save({"state_dict": {}, "global_step": step, "tinylm": {"format": 1}}, tmp_path / f"step-{step}.ckpt")
    real = zipfile.is_zipfile

    def rotated_out(name, *args, **kwargs):  # (a step-N.ckpt is looked at, not read: tinylm.checkpoint)
        if Path(name).name == "step-1.ckpt" and Path(name).exists():
            os.remove(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(zipfile, "is_zipfile", rotated_out)
    found, broken = checkpoints_by_step(tmp_path)
    assert [(s, p.name) for s, _, p in found] == [(2, "step-2.ckpt")] and broken == []


def test_a_folder_of_many_step_checkpoints_is_listed_without_reading_each(tmp_path, monkeypatch):
    """Catches `--ckpt_path last` reading every step-N.ckpt of a run keeping all of them (run.keep_checkpoints -1),
    twice per resume: ~80 ms a file, 100 s before a resume of 600 files started. A step-N.ckpt cut short is still
    found unreadable, and last.ckpt is still read (its step is inside)."""
    import tinylm.checkpoint_steps as checkpoint

    for step in range(1, 41):
        torch.save({"state_dict": {}, "global_step": step, "tinylm": {"format": 1}}, tmp_path / f"step-{step}.ckpt")
    shutil.copy(tmp_path / "step-40.ckpt", tmp_path / "last.ckpt")
    (tmp_path / "step-41.ckpt").write_bytes((tmp_path / "step-40.ckpt").read_bytes()[:100])  # cut short
    reads = []
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda path, *a, real=checkpoint.load_checkpoint, **k:
                        reads.append(Path(path).name) or real(path, *a, **k))
    found, broken = checkpoint.checkpoints_by_step(tmp_path)
    assert max(found) == (40, True, tmp_path / "last.ckpt") and len(found) == 41 and broken == ["step-41.ckpt"]
    assert sorted(reads) == ["last.ckpt", "step-41.ckpt"]


def test_a_checkpoints_step_is_read_once_until_the_file_is_replaced(tmp_path, monkeypatch):
    """Catches a resume reading last.ckpt's and best.ckpt's step three times each (its --ckpt_path, the run folder's
    checks, a cut save's repair: 10 loads of ~0.1 s where 6 do), and a step kept for a file saved over since."""
    import tinylm.checkpoint_steps as checkpoint

    def save(step: int) -> None:  # as the fits save: a new file renamed over the old one
        torch.save({"state_dict": {}, "global_step": step, "tinylm": {"format": 1}}, tmp_path / "new")
        os.replace(tmp_path / "new", tmp_path / "last.ckpt")

    save(3)
    reads = []
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda path, *a, real=checkpoint.load_checkpoint, **k:
                        reads.append(Path(path).name) or real(path, *a, **k))
    assert [checkpoint.checkpoints_by_step(tmp_path)[0][0][0] for _ in range(3)] == [3, 3, 3] and len(reads) == 1
    save(4)
    assert checkpoint.checkpoints_by_step(tmp_path)[0] == [(4, True, tmp_path / "last.ckpt")] and len(reads) == 2


def test_load_model_leaves_the_callers_random_state_alone_and_names_a_device_it_cannot_use(tmp_path):
    """Catches load_model advancing torch's global RNG (the GPT's random init, then overwritten: a seeded script
    sampled differently after it) and map_location="cuda" on a machine without CUDA ending in torch's
    AssertionError "Torch not compiled with CUDA enabled"."""
    from tinylm.checkpoint import load_model

    path = _model_checkpoint(tmp_path / "ok.ckpt")
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    load_model(path)
    assert torch.equal(torch.rand(3), expected)
    with pytest.raises(ValueError, match=r"unknown device 'gpu'; use auto, cpu, cuda or cuda:N"):
        load_model(path, map_location="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device 'cuda' asked for, but this machine has no CUDA device"):
            load_model(path, map_location="cuda")
    assert load_model(path, map_location=torch.device("cpu"))[0].lm_head.weight.device.type == "cpu"


def test_load_model_names_map_location_not_the_commands_device_flag(tmp_path, monkeypatch):
    """Catches load_model(path, map_location="cuda") on a machine without CUDA telling a script to "use --device
    cpu", a flag of the commands that a Python caller has none of (docs/python.md): it names map_location."""
    from tinylm.checkpoint import load_model

    path = _model_checkpoint(tmp_path / "ok.ckpt")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^device 'cuda' asked for, but this machine has no CUDA device; "
                                         r"use map_location='cpu'$"):
        load_model(path, map_location="cuda")

def test_a_checkpoint_is_on_the_disk_before_its_name_is(tmp_path, monkeypatch):
    """Catches atomic_write swapping the new file in before it is fsynced (a crash right after could leave the name
    pointing at a file whose data never reached the disk: the point of writing it beside and renaming)."""
    from tinylm import checkpoint

    events = []
    real_fsync, real_swap = os.fsync, checkpoint.swap_in

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))  # (Linux: the path the descriptor names)
        real_fsync(fd)

    def swap_in(tmp, path, **kwargs):
        events.append(("swap", str(tmp)))
        real_swap(tmp, path, **kwargs)

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    monkeypatch.setattr(checkpoint, "swap_in", swap_in)
    checkpoint.atomic_write_bytes(tmp_path / "a.ckpt", b"data")
    swapped = events.index(("swap", str(tmp_path / "a.ckpt.tmp")))
    assert ("fsync", str(tmp_path / "a.ckpt.tmp")) in events[:swapped], events  # the temp file, before its swap
    assert (tmp_path / "a.ckpt").read_bytes() == b"data"


@pytest.mark.filterwarnings("error")  # torch's own warning about the protocol is not said beside tinylm's line
def test_a_checkpoint_pickled_with_protocol_5_is_not_called_damaged(tmp_path):
    """Catches a sound checkpoint that another tool saved with `torch.save(..., pickle_protocol=5)` (its FRAME
    opcode, which torch's weights-only loader does not read) being refused as "damaged: Unsupported operand 149;
    use an earlier step-*.ckpt" (before: "holds objects ... needs code to load"): the fix is saving it again."""
    path = tmp_path / "p5.ckpt"
    torch.save({"state_dict": {"w": torch.ones(3)}, "tinylm": {"format": 1}}, path, pickle_protocol=5)
    with pytest.raises(CheckpointError, match="pickle protocol 4's opcode 149.*default pickle_protocol") as e:
        load_checkpoint(path)
    assert "needs code" not in str(e.value)
