"""The run page's "Outputs" section and the download of one output (``RunSpec.outputs``).

The outputs are the file set the run's workers recorded (``put_outputs``; ``tether outputs RUN``
lists the same); each file is a list of chunks in the relay's blob store. A download,
``GET /ui/runs/RUN/outputs/PATH``, is authorised as the run's page is (``get_run``) and reads the
file's chunks one by one, each checked against its digest (a chunk the store lost or holds
corrupt ends it with a 410, never with other bytes). The relay answers HTTP through its WebSocket
server, whose responses carry their whole body: a file over :data:`MAX_DOWNLOAD` is refused with
the ``tether cp`` command that fetches it instead.
"""

from __future__ import annotations

import hashlib
import time
from urllib.parse import quote

from websockets.http11 import Response

from protocol_specs.checkpoints.files import CHUNK, FileSet
from protocol_specs.runs.runs import RunRecord
from protocol_specs.web.web import output_path

from ..snapshots.blobs import BlobError, BlobStore
from .pages import h
from .responses import http_response

__all__ = ["MAX_DOWNLOAD", "OUTPUTS_SHOWN", "output_body", "output_response", "outputs_section"]

#: the largest output the web view downloads (the body is held whole; ``tether cp`` has no limit)
MAX_DOWNLOAD = 256 * 1024 * 1024
#: outputs the run page lists (``tether outputs RUN`` lists them all)
OUTPUTS_SHOWN = 500


def outputs_section(record: RunRecord, files: FileSet | None) -> str:
    """The run page's list of outputs, each a download link; nothing for a run without any."""
    if files is None or not files.files:
        return ""
    rows = "".join(
        f'<tr><td><a href="{h(output_path(record.id, f.path))}" download>{h(f.path)}</a></td>'
        f"<td>{f.size}</td><td>{f.attempt or '-'}</td><td>{h(_when(f.mtime))}</td></tr>"
        for f in files.files[:OUTPUTS_SHOWN]
    )
    more = len(files.files) - OUTPUTS_SHOWN
    note = f"<p>and {more} more: <code>tether outputs {h(record.id)}</code></p>" if more > 0 else ""
    return (
        f'<section class="outputs"><h2>Outputs <small>{len(files.files)} files, {files.size} '
        f"bytes · <code>tether cp {h(record.id)}: DIR</code></small></h2>"
        '<table class="files"><thead><tr><th>Path</th><th>Size</th><th>Attempt</th>'
        f"<th>Modified</th></tr></thead><tbody>{rows}</tbody></table>{note}</section>"
    )


async def output_body(
    blobs: BlobStore, run: str, files: FileSet, path: str
) -> bytes | tuple[int, str]:
    """The bytes of output ``path``, read chunk by chunk and each checked, or the HTTP status
    and text refusing it."""
    stored = files.get(path)
    if stored is None:
        return 404, f"run {run} has no output {path}"
    if stored.size > MAX_DOWNLOAD:
        return (
            413,
            f"{path} is {stored.size} bytes, more than the web view sends: tether cp {run}:{path}",
        )
    parts: list[bytes] = []
    for digest in stored.chunks:
        try:
            size, data = await blobs.read(digest, 0, CHUNK)
        except BlobError:
            return 410, f"the relay lost a chunk of {path}"
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            return 410, f"a chunk of {path} is corrupt in the relay's store"
        parts.append(data)
    body = b"".join(parts)
    if len(body) != stored.size:
        return 410, f"the stored chunks of {path} do not add up to its size"
    return body


async def output_response(
    blobs: BlobStore, run: str, files: FileSet, path: str
) -> Response | tuple[int, str]:
    """The download of ``path`` (an attachment named by its last name), or why not."""
    body = await output_body(blobs, run, files, path)
    if isinstance(body, tuple):
        return body
    response = http_response(200, body, "application/octet-stream")
    name = path.rpartition("/")[2]
    response.headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(name)}"
    response.headers["Cache-Control"] = "private, no-store"
    return response


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) + " UTC" if at else "-"
