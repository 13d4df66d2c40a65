"""Datasets past 2^31 and 2^32 tokens, made as sparse files: offsets, and memory that does not grow with the file."""
import os
import sys

import numpy as np
import pytest

import tinylm.data.loader as loader
from tinylm.data.loader import TrainBatches, ValBatches


def _rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_training_windows_do_not_keep_the_file_resident(tmp_path, monkeypatch):
    """Prevents the training memmap, held open for the whole run, from keeping every page any batch touched in the
    process's resident memory: a long run over a 20 GB dataset grew each rank and worker to 20 GB of RSS."""
    monkeypatch.setattr(loader, "WINDOWS_PER_MAP", 256, raising=False)
    path = tmp_path / "train.bin"
    n = 64 << 20  # 128 MiB of uint16, sparse
    path.touch()
    os.truncate(path, 2 * n)
    batches = TrainBatches(path, dtype="uint16", n_tokens=n, block_size=32, batch_size=64, seed=0)
    before = _rss_file_kb()
    for k in range(128):  # 8192 random windows
        batches[k]
    assert _rss_file_kb() - before < 48 << 10  # KiB: 256 windows' pages at most, not the 128 MiB file


def test_windows_past_2_to_the_32_are_read_where_they_are(tmp_path):
    """Guards the 64-bit offsets: markers written past 2^31 and 2^32 tokens of a sparse file come back at their
    place, in training and validation windows, and random offsets reach the end of the split."""
    path = tmp_path / "train.bin"
    n = 5 << 30  # a fifth of the offsets are past 2^32
    path.touch()
    os.truncate(path, 2 * n)
    data = np.memmap(path, dtype="<u2", mode="r+")
    for at in ((1 << 31) + 5, (1 << 32) + 7):
        data[at : at + 40] = np.arange(1, 41)
    data.flush()
    del data
    train = TrainBatches(path, dtype="uint16", n_tokens=n, block_size=32, batch_size=8, seed=0)
    x, y = train.windows(np.array([(1 << 32) + 7], dtype=np.int64))
    assert x[0].tolist() == list(range(1, 33)) and y[0].tolist() == list(range(2, 34))
    offsets = np.concatenate([train.offsets(k) for k in range(2000)])
    assert offsets.max() > 1 << 32 and offsets.max() <= n - 33
    val = ValBatches(path, dtype="uint16", n_tokens=n, block_size=32, batch_size=8)
    at = (1 << 31) + 5
    x, _ = val[at // 32 // 8]
    assert x.reshape(-1)[at % 256 : at % 256 + 4].tolist() == [1, 2, 3, 4]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_opening_a_dataset_scans_its_ids_in_bounded_memory(tmp_path):
    """Prevents load_meta's id scan from memory-mapping the whole .bin: every page it read stayed resident until
    it returned, so opening a 5-billion-token dataset peaked at 9.8 GB of RSS (in each rank)."""
    import subprocess

    path = tmp_path / "train.bin"
    path.touch()
    os.truncate(path, 512 << 20)  # 256 M uint16 zeros, sparse
    code = ("import pathlib, sys; from tinylm.data.prepare import _check_ids; "
            "kib = lambda key: next(int(s.split()[1]) for s in open('/proc/self/status') if s.startswith(key)); "
            "before = kib('VmRSS'); _check_ids(pathlib.Path(sys.argv[1]), 'uint16', 65); print(kib('VmHWM') - before)")
    # (VmHWM: this process image's peak, less what its imports hold; ru_maxrss carries the forking parent's over exec)
    grew_kib = int(subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True,
                                  text=True).stdout)
    assert grew_kib < 200 << 10, f"RSS grew {grew_kib >> 10} MiB scanning a 512 MiB file"


def test_val_loss_mean_does_not_drift_over_many_batches():
    """Prevents val/loss's running sums from being float32: over ~1M validation batches (a whole big split, e.g.
    `tinylm validate --data.val_batches null`) the sum of loss x targets stopped adding small batches exactly and
    val/loss came out 3.3085 for 3.3000. Here the first batch is 2^24 targets, so float32 drops what follows."""
    import torch

    from tinylm.train.module import TinyLM

    module = TinyLM(vocab_size=65, block_size=8, n_layer=1, n_head=1, n_embd=8).to("cpu").float()
    module.val_loss.update(torch.tensor(1.0), weight=torch.tensor(float(1 << 24)))
    for _ in range(100):
        module.val_loss.update(torch.tensor(3.0), weight=torch.tensor(1.0))
    exact = ((1 << 24) + 300) / ((1 << 24) + 100)
    assert abs(module.val_loss.compute().item() - exact) < 1e-9


def test_a_remap_reads_the_file_the_run_opened(tmp_path, monkeypatch):
    """Catches the re-map (every WINDOWS_PER_MAP windows) opening the dataset's path again: a run whose dataset
    folder was deleted under it (a cache cleaned, `rm -rf` as a damaged-dataset message says) ended ~4096 windows
    later in a FileNotFoundError traceback, where the memmap kept open read on. A worker's pickled copy opens its
    own."""
    import pickle

    monkeypatch.setattr(loader, "WINDOWS_PER_MAP", 4, raising=False)
    path = tmp_path / "train.bin"
    np.arange(1000, dtype="<u2").tofile(path)
    batches = TrainBatches(path, dtype="uint16", n_tokens=1000, block_size=8, batch_size=4, seed=0)
    first = batches[0][0]
    worker = pickle.loads(pickle.dumps(batches))  # (as DataLoader workers get it, after a map)
    assert (worker[0][0] == first).all()
    path.unlink()
    for k in range(1, 6):  # a re-map before each
        x, y = batches[k]
        assert (y[:, :-1] == x[:, 1:]).all()
    assert (batches[0][0] == first).all()


def test_reading_a_big_corpus_or_dataset_whole_at_the_start_is_said_first(tmp_path, monkeypatch, caplog):
    """Catches a command sitting silent while it hashes a big text corpus (~100 s for 45 GB) and checks every token id
    of its dataset (~20 s for 10 billion tokens) at each start: one line says what it reads, above LONG_READ bytes."""
    import logging

    import tinylm.data.corpus as corpus_mod
    import tinylm.data.prepare as prepare_mod
    from tinylm.data.corpus import open_corpus

    text = tmp_path / "big.txt"
    text.write_text("To be, or not to be.\n" * 100)
    ids = tmp_path / "train.bin"
    np.arange(50, dtype="<u2").tofile(ids)
    with caplog.at_level(logging.INFO, logger="tinylm"):
        assert open_corpus(str(text), cache_dir=tmp_path / "cache").fingerprint
        prepare_mod._check_ids(ids, "uint16", 65)
        assert not caplog.records  # below LONG_READ: nothing said
        monkeypatch.setattr(corpus_mod, "LONG_READ", 1000)
        monkeypatch.setattr(prepare_mod, "LONG_READ", 100)
        assert open_corpus(str(text), cache_dir=tmp_path / "cache").fingerprint
        prepare_mod._check_ids(ids, "uint16", 65)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and said[0].startswith(f"reading corpus {str(text)!r} (0.0 GB)") and \
        said[1].startswith(f"checking the token ids of {ids} (0.0 GB)"), said
