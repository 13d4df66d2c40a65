"""Whether a server can be reached, asked once and quickly before a library that would retry it for a minute."""

from __future__ import annotations

import os


def reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether the server of ``url`` takes a TCP connection within ``timeout`` seconds (through a proxy: trusted to).
    W&B with a key and no network retried for ~95 s; `datasets` asking the hub, ~26 s of warnings."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "", parsed.port or
                                       (80 if parsed.scheme == "http" else 443)), timeout=timeout):
            return True
    except OSError:
        return False
