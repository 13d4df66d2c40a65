"""Studies that run around training, not inside it: plan a run before it (size, FLOPs, memory, time), find its
learning rate (LR range test), fit scaling laws over a compute-matched ladder, and plot runs' curves after them.
Each is a library function that returns values; its `tinylm` command prints and draws them (tinylm.cli)."""
