"""tinylm: train small GPT language models end to end on PyTorch Lightning."""

__version__ = "0.1.0"
