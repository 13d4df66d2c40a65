"""Shared fixtures: the small corpora in tests/fixtures, a BPE trained on them, the large corpora in ../shared/data,
tiny sizes, and determinism."""

import base64
import os
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pytest
import torch
import yaml
from hypothesis import settings

# Property tests draw the same examples on every run (a run of the suite is the same test everywhere: CI, a clone) and
# keep no example database in the tree; `--hypothesis-seed` or another profile explores further by hand.
settings.register_profile("tinylm", derandomize=True, database=None)
# (and its cache of the constants in the tested modules' source, which it keeps whatever the profile, outside the tree:
# it wrote .hypothesis/constants/ into the folder pytest ran in, a clone's or a user's)
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "tinylm-tests-hypothesis"))
settings.load_profile("tinylm")

if TYPE_CHECKING:
    from tinylm.tokenize.bpe import ByteLevelBPE

# tqdm's own switch, set on some CI machines and shells, silenced the bars, lines and heartbeats that tests read
# (tests/test_progress.py's heartbeat test waited for lines that never came, until pytest-timeout's 10 minutes). It is
# dropped for every run the tests start, and from the defaults tqdm took from it at its import (pytest imports
# Lightning, and so torch and tqdm, before this file, for pyproject's filterwarnings); tests of the switch set it.
if os.environ.pop("TQDM_DISABLE", None) is not None:
    import tqdm.std

    getattr(tqdm.std.tqdm.__dict__["__init__"], "keywords", {}).pop("disable", None)  # (envwrap's partialmethod)

# Two test workers share two cores (make test runs pytest -n 2): one thread each avoids oversubscription, which
# made tiny-model tests 3-30x slower on a busy machine.
torch.set_num_threads(1)

# A suite started with Ctrl+C ignored (`make test &` in a script: a shell starts background jobs so) passed that on to
# every run it started, which then ignored the Ctrl+C the signal tests send, as tinylm does for a user's such run: the
# tests hung, and one left a run training (and saving) forever. The tests are of a run started from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:  # (under nohup: the runs the tests start would ignore it too,
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a run started under nohup does, and train on)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("TINYLM_SHARED_DATA", REPO.parent / "shared" / "data"))
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def small_data() -> Path:
    """The folder of small texts shipped in the repo (tests/fixtures; origins in its README.md): the first 100,000
    characters of tinyshakespeare, TinyStories-style stories separated by <|endoftext|>, and German UTF-8 text."""
    return FIXTURES


class BPEFiles(NamedTuple):
    """One real byte-level BPE (512 ids, <|endoftext|> = 511) written in GPT-2's two file formats."""

    bpe: "ByteLevelBPE"  # the tokenizer the files were written from
    vocab: Path  # vocab.json: byte-to-unicode token -> id, <|endoftext|> included
    merges: Path  # merges.txt, GPT-2's "#version: 0.2" form
    tiktoken: Path  # "base64(token) rank" lines; `tiktoken:PATH` gives <|endoftext|> the next id, 511, as GPT-2 does


@pytest.fixture(scope="session")
def small_bpe(small_data, tmp_path_factory) -> BPEFiles:
    """A BPE trained by tinylm's own ByteLevelBPE on the fixture texts (~0.2 s), for tests that need *a* real
    vocab.json + merges.txt or .tiktoken file; GPT-2's own 50k-id files stay in shared_data."""
    from tinylm.tokenize.bpe import ByteLevelBPE
    from tinylm.tokenize.patterns import EOT

    docs = [(small_data / n).read_text(encoding="utf-8") for n in ("tinyshakespeare_100k.txt", "german.txt")]
    bpe = ByteLevelBPE.train(docs, vocab_size=512, special_tokens=[EOT], progress=False)
    folder = bpe.save(tmp_path_factory.mktemp("small_bpe"))
    ranks = sorted(bpe.ranks.items(), key=lambda kv: kv[1])
    tiktoken = folder / "small.tiktoken"
    tiktoken.write_text("".join(f"{base64.b64encode(t).decode('ascii')} {r}\n" for t, r in ranks), encoding="ascii")
    return BPEFiles(bpe, folder / "vocab.json", folder / "merges.txt", tiktoken)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of large corpora and GPT-2's tokenizer files, for the few tests that need them (GPT-2 parity,
    the full tinyshakespeare). Skips outside CI when absent; fails in CI."""
    if not SHARED_DATA.is_dir():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"shared test data not found at {SHARED_DATA} (CI must provide it)")
        pytest.skip(f"shared test data not found at {SHARED_DATA}; set TINYLM_SHARED_DATA to its folder")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _isolate(monkeypatch, tmp_path):
    """Keep every test off the network and out of the user's caches and W&B account."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TINYLM_CACHE_DIR", str(tmp_path / "tinylm_cache"))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken_cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg_cache"))  # the commands' kept --help (tinylm.cli.early)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Every test ends with torch on one thread again, as this worker started: left at 2 (a run's choice, a thread
    test's restore), the next multi-thread operator starts OpenMP's thread pool, and a child a later test forks from
    this process hangs for good in its first parallel operator (GNU OpenMP's pool does not survive fork; measured in
    tests/test_harness.py). tinylm.device's record of torch's own count (taken at a process's first run) is put back
    at this worker's 1 too: taken in a test that had set 2 first, every later run in the worker took 2 threads, and a
    child it forked raised them over OpenMP's copied pool."""
    from tinylm import device

    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    device._TORCH_DEFAULT[:] = [1]


@pytest.fixture
def run_config(tmp_path, small_data, monkeypatch):
    """Factory for a tiny `tinylm fit` config in tmp_path (which becomes the working directory, so runs/ lands there).

    The corpus is the first ``chars`` (at most 100,000, the fixture's length) characters of tinyshakespeare;
    ``sections`` update the defaults below section by section (``trainer={"max_steps": 6}`` changes only max_steps).
    """

    def make(*, chars: int = 20_000, name: str = "tiny.yaml", **sections) -> Path:
        corpus = tmp_path / "shakespeare_small.txt"
        assert chars <= 100_000, "tests/fixtures holds 100,000 characters of tinyshakespeare"
        corpus.write_text((small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")[:chars])
        cfg = {
            "seed_everything": 7,
            "run": {"name": "tiny", "wandb_project": None},
            "samples": {"every_n_steps": 0},
            "trainer": {"max_steps": 2, "val_check_interval": 2, "log_every_n_steps": 1, "precision": "32-true",
                        "enable_model_summary": False, "enable_progress_bar": False, "num_sanity_val_steps": 0},
            "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "warmup_steps": 1, "pad_vocab_multiple": 1},
            "data": {"corpus": str(corpus), "tokenizer": "char", "block_size": 16, "batch_size": 2, "val_batches": 1,
                     "cache_dir": str(tmp_path / "cache")},
        }
        for key, value in sections.items():
            cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
        path = tmp_path / name
        path.write_text(yaml.safe_dump(cfg))
        monkeypatch.chdir(tmp_path)
        return path

    return make


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need a CUDA device: skipped where there is none (CI, laptops); `pytest -m gpu` on a GPU
    machine runs them (benchmarks/gpu/run.sh does). The collection's order is kept: putting every process or slow
    module first gave one `-n 2 --dist worksteal` worker all the runs of ranks and the other every unit test beside
    them: the suite took 13:01 against 11:44 in this order (a 3 s unit test took 60 s beside the FSDP2 chain)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run `pytest -m gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
