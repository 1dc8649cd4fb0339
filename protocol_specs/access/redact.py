"""Blanking secret values out of a program's output before it leaves the worker.

A run's secret environment values (``RunSpec.secret_env``) reach the program, which may print them;
its output goes to the run's logs stream, which ``tether logs`` shows. :class:`Redactor` replaces
every occurrence of a secret in a byte stream with ``<secret>``, also when the program's writes (or
the pipe) split a secret across chunks: the end of a chunk that could be the start of a secret is
held back until the next chunk (or :meth:`Redactor.flush`) says whether it is.
"""

from __future__ import annotations

from ..runs.spec import REDACTED

__all__ = ["Redactor"]

_MARK = REDACTED.encode()


class Redactor:
    """Feed chunks of one stream in order; each call returns what may be passed on."""

    def __init__(self, secrets: list[str]) -> None:
        # longest first, so a secret that contains another is blanked whole
        self.secrets = sorted({s.encode() for s in secrets if s}, key=len, reverse=True)
        self._held = b""

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def feed(self, chunk: bytes) -> bytes:
        if not self.secrets:
            return chunk
        data = self._blank(self._held + chunk)
        keep = self._partial(data)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        """What is held back (the stream ended: it is no secret's start after all)."""
        out, self._held = self._held, b""
        return out

    def text(self, text: str) -> str:
        """A whole string with its secrets blanked."""
        for secret in self.secrets:
            text = text.replace(secret.decode(), REDACTED)
        return text

    def _blank(self, data: bytes) -> bytes:
        for secret in self.secrets:
            data = data.replace(secret, _MARK)
        return data

    def _partial(self, data: bytes) -> int:
        """The length of the longest end of ``data`` that some secret starts with."""
        longest = 0
        for secret in self.secrets:
            for n in range(min(len(secret) - 1, len(data)), longest, -1):
                if data.endswith(secret[:n]):
                    longest = n
                    break
        return longest
