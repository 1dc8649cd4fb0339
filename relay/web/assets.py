"""The web view's one stylesheet and one script (``static/``), read once, and their version: the
pages name them with ``?v=VERSION``, so a browser may cache them (for an hour) and still never runs
an older script against a newer relay's pages."""

from __future__ import annotations

import hashlib
from importlib import resources

__all__ = ["FILES", "TYPES", "VERSION"]

FILES: dict[str, bytes] = {
    name: (resources.files(__package__) / "static" / name).read_bytes()
    for name in ("app.css", "app.js")
}
TYPES = {"css": "text/css; charset=utf-8", "js": "text/javascript; charset=utf-8"}
VERSION = hashlib.sha256(b"".join(FILES.values())).hexdigest()[:12]
