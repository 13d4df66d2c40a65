"""Shared fixtures: the real corpora in ../shared/data, tiny sizes, and determinism."""

import os
from pathlib import Path

import pytest
import torch

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
