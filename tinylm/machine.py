"""Facts about the machine that need no torch, for commands that never import it (`tinylm prepare`)."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. under taskset or a container's cpuset): a job
    given 2 of a node's 64 cores has 2, whatever `os.cpu_count()` says."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1
