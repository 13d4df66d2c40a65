"""One step's checkpoint files (best, step-N, last) share their bytes only where no write into one can change
another (tinylm.checkpoint_share)."""

import os
import shutil
from pathlib import Path

import pytest
import torch

import tinylm.checkpoint_share as share
from tinylm.checkpoint import CHECKPOINT_FORMAT, load_checkpoint
from tinylm.train.checkpoint_io import AtomicCheckpointIO


def _ckpt(step: int, weight: float, saved: list[str]) -> dict:
    """A checkpoint as Lightning's Trainer hands it to the CheckpointIO: ``saved``, the ModelCheckpoint's bookkeeping,
    changes from one file of a step to the next; the rest (a NaN too: the guard's history) does not."""
    return {"state_dict": {"w": torch.full((4,), weight)}, "global_step": step, "loops": {"batches": step},
            "callbacks": {"ModelCheckpoint{'monitor': 'step'}": {"best_model_path": saved[-1], "last_model_path": "",
                                                                "best_k_models": {p: torch.tensor(1.0) for p in saved}},
                          "StabilityGuard": {"history": torch.tensor([1.0, float("nan")])}},
            "tinylm": {"format": CHECKPOINT_FORMAT}}


def _save_a_step(folder, io=None, weight=1.0):
    io = io or AtomicCheckpointIO()
    for i, name in enumerate(["best.ckpt", "step-4.ckpt", "last.ckpt"]):
        io.save_checkpoint(_ckpt(4, weight, [name] * (i + 1)), folder / name)
    return [folder / name for name in ("best.ckpt", "step-4.ckpt", "last.ckpt")]


@pytest.fixture
def non_root(monkeypatch):
    """The hard-link fallback, taken by a user who is not root (on a filesystem without reflinks, as here)."""
    monkeypatch.setattr(share, "hard_links_are_safe", lambda: True)
    monkeypatch.setattr(share, "clone_file", lambda src, dst: False)


def test_one_steps_files_share_their_bytes_and_each_holds_the_newest_bookkeeping(tmp_path, non_root):
    """Catches best/step-N/last written as three full copies of one state (371 MB for a 5-step GPU-recipe run), and
    a shared file holding an earlier save's bookkeeping (a resume from it would forget step-4.ckpt, never trimming
    it): all three names are the last save's file, read-only, each loadable."""
    files = _save_a_step(tmp_path)
    inodes = {f.stat().st_ino for f in files}
    assert len(inodes) == 1 and files[0].stat().st_nlink == 3
    assert not files[0].stat().st_mode & 0o222
    for f in files:
        assert load_checkpoint(f)["callbacks"]["ModelCheckpoint{'monitor': 'step'}"]["best_model_path"] == "last.ckpt"
    # a later step's save replaces last.ckpt alone (a rename): step-4 and best keep the step-4 state
    AtomicCheckpointIO().save_checkpoint(_ckpt(6, 2.0, ["last.ckpt"]), tmp_path / "last.ckpt")
    assert load_checkpoint(files[1])["global_step"] == 4 and load_checkpoint(files[2])["global_step"] == 6


def test_different_states_at_one_step_are_not_shared(tmp_path, non_root):
    """Catches sharing decided by the step alone: a save at the same step whose weights differ (a validation or a
    rollback in between) keeps its own file, and the earlier ones theirs."""
    io = AtomicCheckpointIO()
    io.save_checkpoint(_ckpt(4, 1.0, ["step-4.ckpt"]), tmp_path / "step-4.ckpt")
    io.save_checkpoint(_ckpt(4, 1.5, ["best.ckpt"]), tmp_path / "best.ckpt")
    assert (tmp_path / "step-4.ckpt").stat().st_ino != (tmp_path / "best.ckpt").stat().st_ino
    assert load_checkpoint(tmp_path / "step-4.ckpt")["state_dict"]["w"][0] == 1.0


@pytest.mark.parametrize("mode", ["this machine", "non-root"])
def test_overwriting_last_in_place_changes_no_other_checkpoint(tmp_path, monkeypatch, mode):
    """Catches the hard-link hazard: `cp other.ckpt last.ckpt` (a write into last.ckpt's file) also overwrote
    step-N.ckpt and best.ckpt. Here the write either fails loudly (a read-only file, for a user who is not root) or
    goes into last.ckpt's own file (a reflink's copy-on-write, or a copy: as root, whom modes do not stop)."""
    if mode == "non-root":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only files: the hard-link fallback is not taken as root")
        monkeypatch.setattr(share, "clone_file", lambda src, dst: False)
    files = _save_a_step(tmp_path)
    other = tmp_path / "elsewhere" / "other.ckpt"
    AtomicCheckpointIO().save_checkpoint(_ckpt(9, 9.0, ["other.ckpt"]), other)
    before = [f.read_bytes() for f in files[:2]]
    try:
        shutil.copyfile(other, files[2])  # what cp does: open the target, truncate, write
    except PermissionError:
        assert files[0].stat().st_nlink == 3  # the read-only hard links
    else:
        assert load_checkpoint(files[2])["global_step"] == 9
    assert [f.read_bytes() for f in files[:2]] == before


def test_deleting_one_of_a_steps_files_leaves_the_others_loadable(tmp_path, non_root):
    """Catches a shared file removed with one of its names (keep_checkpoints trimming step-4.ckpt, a user's rm):
    best.ckpt and last.ckpt still load, whole."""
    files = _save_a_step(tmp_path)
    files[1].unlink()
    for f in (files[0], files[2]):
        assert torch.equal(load_checkpoint(f)["state_dict"]["w"], torch.ones(4))


def test_root_without_reflinks_writes_separate_copies(tmp_path, monkeypatch):
    """Catches hard links made for root (a container's usual user), whom a read-only mode does not stop from
    writing into every name of the step at once: without reflinks each name is its own file, and the states are not
    even compared after the first try."""
    monkeypatch.setattr(share, "hard_links_are_safe", lambda: False)
    monkeypatch.setattr(share, "clone_file", lambda src, dst: False)
    io = AtomicCheckpointIO()
    files = _save_a_step(tmp_path, io)
    assert len({f.stat().st_ino for f in files}) == 3
    monkeypatch.setattr(share, "same_state", lambda new, old: pytest.fail("compared on a folder that never shares"))
    _save_a_step(tmp_path, io, weight=2.0)


def test_on_a_filesystem_with_reflinks_each_name_is_a_writable_file_of_its_own(tmp_path):
    """Catches the reflink path (btrfs, XFS, ZFS 2.2+) making links or leaving files read-only: each name is its own
    file (copy-on-write), holding the step's newest state; writing into one leaves the others as they were."""
    probe = tmp_path / "probe"
    probe.write_bytes(b"x")
    if not share.clone_file(probe, tmp_path / "probe.clone"):
        pytest.skip(f"{tmp_path} has no reflinks (ext4, tmpfs; XFS and btrfs have)")
    files = _save_a_step(tmp_path)
    assert len({f.stat().st_ino for f in files}) == 3 and all(f.stat().st_mode & 0o200 for f in files)
    assert all(f.read_bytes() == files[2].read_bytes() for f in files)
    files[2].write_bytes(b"not a checkpoint")
    assert load_checkpoint(files[0])["global_step"] == 4


@pytest.mark.parametrize("memcmp", ["C library", "none"])
def test_states_are_compared_bit_for_bit(monkeypatch, memcmp):
    """Catches the comparison that decides sharing (a memcmp of the tensors' bytes) calling different states the same
    (0.0 and -0.0, a difference in the last bf16 element only, a slice read from the start of its storage) or the
    same state different (NaNs, a strided view of the same values), with or without the C library's memcmp."""
    if memcmp == "none":
        monkeypatch.setattr(share, "_MEMCMP", None)
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    nan = torch.tensor([float("nan"), 1.0])
    bf16 = torch.ones(1000, dtype=torch.bfloat16)
    changed = bf16.clone()
    changed[-1] = 2.0
    assert share.same_bits(nan, nan.clone()) and share.same_bits(t.t(), t.t().contiguous())
    assert share.same_bits(t[1:], t.clone()[1:]) and share.same_bits(torch.empty(0), torch.empty(0))
    assert not share.same_bits(torch.tensor(0.0), torch.tensor(-0.0))
    assert not share.same_bits(bf16, changed) and not share.same_bits(t[1:], t[:2])


def test_states_that_differ_in_the_length_of_a_list_are_not_the_same():
    """Catches lists compared element by element over the shorter one: a state with one more saved entry (an RNG
    state per loader worker, a scheduler's list of LRs) was called the same, and the older file shared its bytes."""
    state = {"state_dict": {"w": torch.ones(2)}, "callbacks": {}, "lrs": [1e-3, 1e-4]}
    assert share.same_state(state, {**state, "lrs": [1e-3, 1e-4]})
    assert not share.same_state(state, {**state, "lrs": [1e-3, 1e-4, 1e-5]})
    assert not share.same_state({**state, "lrs": (1e-3,)}, {**state, "lrs": (1e-3, 1e-4)})


def test_a_shared_file_left_with_one_name_by_tinylm_is_writable_again(tmp_path, non_root):
    """Catches a checkpoint staying read-only once it shares its bytes with no other name (`rm best.ckpt` then asks
    "remove write-protected regular file?", a user's own torch.save into it fails): a later save over last.ckpt
    leaves step-4 and best shared (still read-only); keep_checkpoints trimming step-4 leaves best alone, writable."""
    from tinylm.checkpoint import remove_checkpoint

    best, step, last = _save_a_step(tmp_path)
    AtomicCheckpointIO().save_checkpoint(_ckpt(6, 2.0, ["last.ckpt"]), last)
    assert best.stat().st_nlink == 2 and not best.stat().st_mode & 0o222
    remove_checkpoint(step)
    assert best.stat().st_nlink == 1 and best.stat().st_mode & 0o200
    assert load_checkpoint(best)["global_step"] == 4 and last.stat().st_mode & 0o200


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a checkpoint that another user owns")
def test_another_users_checkpoint_is_copied_where_it_cannot_be_made_read_only(tmp_path, monkeypatch):
    """Catches `--ckpt_path last` in a run folder a group shares failing with "PermissionError: Operation not
    permitted" when it completed a cut save from a checkpoint another user wrote (only a file's owner may make it
    read-only for a hard link, and undoing the failed chmod failed again): such a file is copied instead."""
    import forked

    from tinylm.cli.resume import _copy_checkpoint

    torch.save({"global_step": 4}, tmp_path / "step-4.ckpt")
    tmp_path.chmod(0o777)
    monkeypatch.chdir(tmp_path)  # (the child, once nobody, reaches it by relative names: the folders above are 0o700)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a user who is neither root nor the file's owner, in a folder it may write to
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            _copy_checkpoint(Path("step-4.ckpt"), Path("last.ckpt"))
            said = "ok"
        except BaseException as e:  # noqa: BLE001 (reported to the test)
            said = f"{type(e).__name__}: {e}"
        os.write(write, said.encode())
        os._exit(0)
    os.close(write)
    assert forked.reap(pid, 60) == 0
    with os.fdopen(read) as f:
        assert f.read() == "ok"
    assert torch.load(tmp_path / "last.ckpt", weights_only=True) == {"global_step": 4}
    assert (tmp_path / "last.ckpt").stat().st_uid == 65534 and (tmp_path / "step-4.ckpt").stat().st_mode & 0o200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step-4.ckpt"]  # no .tmp left


def test_a_sharded_checkpoints_metadata_pickled_by_python_313_reads_its_paths():
    """Catches a sharded (FSDP2) checkpoint saved on Python 3.13, whose DCP .metadata pickles paths as
    pathlib._local.PosixPath, refused as "holds objects other than tensors ... needs pathlib._local.PosixPath"
    (every FSDP2 resume, generate and validate on 3.13), and one from 3.11 read on 3.13 or the reverse."""
    import io
    import pathlib
    import pickle

    from tinylm.checkpoint import _DCPUnpickler

    data = pickle.dumps(pathlib.PurePosixPath("a/b"), protocol=2)
    for module in (b"pathlib", b"pathlib._local"):
        named = data.replace(b"cpathlib._local\n", b"cpathlib\n").replace(b"cpathlib\n", b"c" + module + b"\n")
        assert _DCPUnpickler(io.BytesIO(named)).load() == pathlib.PurePosixPath("a/b")
