"""Desktop notifications for "the program is paused and no IDE is attached".

``notify-send`` on Linux desktops, ``osascript`` on macOS; elsewhere (or on a headless machine)
nothing. A notification is a courtesy: it never raises and never holds anything up for long.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from collections.abc import Callable

import trio

__all__ = ["desktop_notification_command", "notify_desktop"]

log = logging.getLogger("tether.notify")

TIMEOUT = 5.0


def _applescript_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def desktop_notification_command(
    title: str,
    body: str,
    *,
    platform: str = sys.platform,
    which: Callable[[str], str | None] = shutil.which,
) -> list[str] | None:
    """The command that shows a notification on this platform, or ``None``."""
    if platform.startswith("linux"):
        binary = which("notify-send")
        return [binary, "--app-name=tether", title, body] if binary else None
    if platform == "darwin":
        binary = which("osascript")
        script = (
            f"display notification {_applescript_string(body)} "
            f"with title {_applescript_string(title)}"
        )
        return [binary, "-e", script] if binary else None
    return None


async def notify_desktop(title: str, body: str) -> bool:
    """Show a desktop notification if the platform has a way; True if it was shown."""
    command = desktop_notification_command(title, body)
    if command is None:
        return False
    try:
        with trio.move_on_after(TIMEOUT):
            result = await trio.run_process(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
            )
            return result.returncode == 0
    except OSError as exc:
        log.debug("desktop notification failed: %s", exc)
    return False
