"""The one decision before a dataset loader downloads: allowed, and possible right now?

Loaders call ``check_download`` only when their files are missing. Downloads are on by default (a
user with a network expects ``data=arxiv`` to just work); ``download=False`` forbids them, and a
host that cannot be reached gives the same clear one-line ``FileNotFoundError`` as a forbidden
download, within ``timeout`` seconds, instead of a long stall inside the downloader.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from urllib.parse import urlparse


def host_reachable(url: str, timeout: float = 5.0) -> str | None:
    """``None`` when a TCP connection to ``url``'s host opens within ``timeout`` seconds, else why
    not. Name resolution runs in a daemon thread too, so a dead resolver cannot stall the caller."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            socket.create_connection((parsed.hostname, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(str(err) or type(err).__name__)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


def check_download(dataset: str, url: str, where: Path, download: bool, manual: str) -> None:
    """Return when ``dataset`` (missing under ``where``) may be downloaded from ``url`` now; else
    raise ``FileNotFoundError`` saying what is missing and ``manual``: how to put it there by hand."""
    if not download:
        raise FileNotFoundError(
            f"{dataset}: not found under {where} and downloads are off (download=false); {manual}"
        )
    why = host_reachable(url)
    if why is not None:
        raise FileNotFoundError(
            f"{dataset}: not found under {where} and {url} cannot be reached ({why}); {manual}"
        )
