"""Secrets that must never show up in a log line: every token (``TOKEN_PATTERN``) and the secret
values tests hand to runs (they contain :data:`MARKER`).

The suite-wide fixture in ``conftest.py`` scans every log record the test process emitted and every
line the tether processes the end-to-end tests started printed (``stack.Proc`` reports them here).
"""

from __future__ import annotations

import re

from protocol_specs.access.auth import TOKEN_PATTERN

#: put this in any secret value a test uses, so the scan recognises it wherever it leaks
MARKER = "s3cr3t"

#: lines printed by the tether processes of the current test
PROCESS_LINES: list[str] = []

_LEAK = re.compile(f"{TOKEN_PATTERN.pattern}|{MARKER}")


def leaked(lines: list[str]) -> list[str]:
    """The lines that give a secret away. A line that is nothing but a token is `tether token
    create` printing the new token, once, as asked: that is its job, not a leak."""
    return [
        line for line in lines if _LEAK.search(line) and not TOKEN_PATTERN.fullmatch(line.strip())
    ]
