"""Shared fixtures: the real corpora in ../shared/data, tiny sizes, and determinism."""

import os
from pathlib import Path

import pytest
import torch
import yaml

# Two test workers share two cores (make test runs pytest -n 2): one thread each avoids oversubscription, which
# made tiny-model tests 3-30x slower on a busy machine.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("TINYLM_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of real corpora and tokenizer files. Skips outside CI when absent; fails in CI."""
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


@pytest.fixture
def run_config(tmp_path, shared_data, monkeypatch):
    """Factory for a tiny `tinylm fit` config in tmp_path (which becomes the working directory, so runs/ lands there).

    The corpus is the first ``chars`` characters of tinyshakespeare; ``sections`` update the defaults below
    section by section (``trainer={"max_steps": 6}`` changes only max_steps).
    """

    def make(*, chars: int = 20_000, name: str = "tiny.yaml", **sections) -> Path:
        corpus = tmp_path / "shakespeare_small.txt"
        corpus.write_text((shared_data / "tinyshakespeare.txt").read_text()[:chars])
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
