"""The data side: corpora -> prepared (tokenized, packed) datasets -> batches for training."""

from tinylm.data.datamodule import TinyLMDataModule

__all__ = ["TinyLMDataModule"]
