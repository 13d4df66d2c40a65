"""The reachability probe asked before W&B and the hub: bounded in time, its name lookup included."""

import socket
import threading
import time

from tinylm.net import reachable


def _no_proxy(monkeypatch):
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)


def test_a_hanging_name_lookup_is_bounded_by_the_timeout(monkeypatch):
    """Catches a slow or dead DNS resolver holding the probe for the resolver's own timeouts (socket timeouts do not
    bound getaddrinfo): `tinylm fit` with a W&B key sat there before it said a word."""
    _no_proxy(monkeypatch)
    asked, released = [], threading.Event()

    def hanging(*args, **kwargs):  # a resolver that answers in 10 s
        asked.append(args[0])
        released.wait(10)
        raise socket.gaierror("too late")

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    start = time.monotonic()
    try:
        assert reachable("https://api.example.invalid", timeout=0.3) is False
        assert time.monotonic() - start < 0.3 + 2
        assert asked == ["api.example.invalid"]  # guard: the lookup was the thing that hung
    finally:
        released.set()  # the lookup's thread ends now, not in 10 s (a thread alive across a later test's fork)


def test_a_listening_server_is_reachable_and_a_closed_port_is_not(monkeypatch):
    """Catches the bounded lookup losing the answer: a server that takes the connection must still count."""
    _no_proxy(monkeypatch)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert reachable(f"http://127.0.0.1:{port}", timeout=2) is True
    assert reachable(f"http://127.0.0.1:{port}", timeout=2) is False
