"""Whether a server can be reached, asked once and quickly before a library that would retry it for a minute; and
the Hugging Face hub's offline mode for one call when it cannot be."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

HUB = "https://huggingface.co"  # HF_ENDPOINT's default


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


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", HUB).rstrip("/")


def hub_offline_asked() -> bool:
    """Whether the user has told Hugging Face to stay offline (then `datasets` reads only its cache, at once and
    quietly), as huggingface_hub and datasets read these variables."""
    return any(os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE")
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_unreachable() -> str | None:
    """Why a dataset is read in offline mode (`hub_offline`), where it is not set already: the hub (HF_ENDPOINT)
    takes no connection within `reachable`'s 3 s (`datasets` then retried for ~26 s, with a log line each time,
    before it failed or read its cache), said as the reason a load that then fails gives; else None."""
    if hub_offline_asked() or reachable(endpoint := hub_endpoint()):
        return None
    return f"the hub, {endpoint}, cannot be reached and the Hugging Face cache holds no copy"


@contextlib.contextmanager
def hub_offline(on: bool) -> Iterator[None]:
    """Hugging Face's offline mode for one call, as HF_HUB_OFFLINE=1 sets it (read at import, so set on the
    modules that hold it): `datasets` reads its cache and asks no server."""
    if not on:
        yield
        return
    import datasets.config
    import huggingface_hub.constants

    held = [(m, getattr(m, k)) for m in (datasets.config, huggingface_hub.constants) for k in ("HF_HUB_OFFLINE",)]
    try:
        for m, _ in held:
            m.HF_HUB_OFFLINE = True
        yield
    finally:
        for m, v in held:
            m.HF_HUB_OFFLINE = v
