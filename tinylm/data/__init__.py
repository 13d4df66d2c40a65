"""The data side: corpora -> prepared (tokenized, packed) datasets -> batches for training."""

__all__ = ["TinyLMDataModule"]


def __getattr__(name: str):
    # imported on first use: the data module needs Lightning (~7 s to import on a busy 2-core machine), which the
    # corpus readers, the tokenizer-side preparation and the loaders never do
    if name == "TinyLMDataModule":
        from tinylm.data.datamodule import TinyLMDataModule

        return TinyLMDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
