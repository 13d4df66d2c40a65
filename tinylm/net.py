"""Whether a server can be reached, asked once and quickly before a library that would retry it for a minute; the
Hugging Face hub's offline mode for one call when it cannot be; and a Hub model's name as its folder in the cache."""

from __future__ import annotations

import contextlib
import os
import re
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


# what a Hub model's folder needs here (import_hf's files): not the repository's other formats (GPT-2's holds TF,
# Flax, ONNX and Rust copies of its weights, ~3 GB)
HUB_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
             "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")
HUB_BIN_FILES = ("pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json")  # (no safetensors)
_FILE_SUFFIXES = {".ckpt", ".pt", ".pth", ".bin", ".safetensors", ".json", ".txt", ".yaml", ".yml", ".py"}
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?(@[\w.-]+(/[\w.-]+)*)?")  # (@ a revision)


def hub_name(given: str) -> bool:
    """Whether ``given``, naming no file here, reads as a Hugging Face Hub model's name (``gpt2``, ``org/name``), or
    one at a revision (``gpt2@main``, ``org/name@v1.0``, ``org/name@COMMIT``).
    A name under a folder here (runs/NAME, a run's name mistyped), and fit's and validate's `last` and `best`, are
    paths that are missing, said so by the reader: not asked of the Hub (3 s offline; a message about the Hub and
    its cache; the local path sent to huggingface.co)."""
    from pathlib import Path

    under_here = given in ("last", "best") or "/" in given and os.path.isdir(given.split("/", 1)[0])
    file_like = {Path(given).suffix, Path(given.split("@")[0]).suffix} & _FILE_SUFFIXES  # (run@2.ckpt: a file)
    return bool(_HUB_NAME.fullmatch(given)) and not file_like and not under_here


def model_source(source: str | os.PathLike, option: str) -> str:
    """Weights given as ``option`` (``model.init_from``, ``--ckpt_path``) as a local path: a file or folder here as
    given (or a missing one under a folder here: ``runs/x``); else a Hugging Face Hub model's name (``gpt2``,
    ``openai-community/gpt2``, ``org/name``) is its snapshot folder in the Hugging Face cache, downloaded there once
    (its config, safetensors weights, else pytorch_model.bin, and tokenizer files), as nanoGPT's ``init_from='gpt2'``
    takes it through transformers' from_pretrained; ``NAME@REVISION`` (a branch, tag or commit) is that revision's
    (it was "not found": the whole text taken for a path). HF_HUB_OFFLINE=1 and HF_HUB_CACHE / HF_HOME work as for
    transformers."""
    import logging
    from pathlib import Path

    given = str(source)
    path = os.path.expanduser(given)
    if os.path.exists(path) or not hub_name(given):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    logging.getLogger("tinylm").info("%s %r is no file here: reading the Hugging Face Hub model of that name (its "
                                     "cached copy, or downloaded once into the Hugging Face cache)", option, given)
    unreachable = hub_unreachable()  # (asked in 3 s: huggingface_hub retries a dead network for longer)
    try:
        with hub_offline(hub_offline_asked() or unreachable is not None):
            repo, _, revision = given.partition("@")
            at = {"revision": revision} if revision else {}
            folder = snapshot_download(repo, allow_patterns=list(HUB_FILES), **at)
            if not any(Path(folder).glob("*.safetensors")):  # a repository from before safetensors: its PyTorch
                # weights (it read "no weights in <the cache's folder>; pass a directory written by `tinylm export`")
                folder = snapshot_download(repo, allow_patterns=list(HUB_BIN_FILES), **at)
            return folder
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        why = unreachable or ("the Hub has no model of that name, or a private or gated one: `hf auth login` for "
                              "those" if isinstance(e, RepositoryNotFoundError)  # (its line: "401 Client Error.")
                              else (str(e).strip().splitlines() or [type(e).__name__])[0])
        raise FileNotFoundError(
            f"{option} {given!r} is no file or folder here, and no Hugging Face Hub model of that name could be read "
            f"({why}); pass a tinylm .ckpt, a Hugging Face GPT-2/Llama directory (e.g. one written by `tinylm "
            "export`), or a Hub model's name with the network up (or one in the Hugging Face cache)") from None
