"""Whether a server can be reached, asked once and quickly before a library that would retry it for a minute."""

from __future__ import annotations

import os
import time


def reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether the server of ``url`` takes a TCP connection within ``timeout`` seconds (through a proxy: trusted to).
    W&B with a key and no network retried for ~95 s; `datasets` asking the hub, ~26 s of warnings.

    The name lookup counts in ``timeout`` too: a socket's timeout does not bound ``getaddrinfo``, which waits on the
    resolver's own timeouts and retries (glibc's defaults: 5 s a try, 2 tries per name server), so it runs in a daemon
    thread that is left behind when it is late."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(url)
    port = parsed.port or (80 if parsed.scheme == "http" else 443)
    deadline = time.monotonic() + timeout
    addresses = _lookup(parsed.hostname or "", port, timeout)
    for family, kind, proto, _, address in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(left)
                sock.connect(address)
                return True
        except OSError:
            continue
    return False


def _lookup(host: str, port: int, timeout: float) -> list:
    """``socket.getaddrinfo(host, port)`` for TCP, or [] when it fails or takes more than ``timeout`` seconds."""
    import socket
    import threading

    found: list = []

    def lookup() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError:  # (socket.gaierror: no such name, no resolver)
            pass

    thread = threading.Thread(target=lookup, name="tinylm-dns", daemon=True)  # daemon: a late one never holds exit
    thread.start()
    thread.join(timeout)
    return list(found) if not thread.is_alive() else []
