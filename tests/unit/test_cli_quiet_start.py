"""A Ctrl-C while ``tether`` still loads its modules ends it with 130 and no traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# the console script's own two lines, with a Ctrl-C delivered in the middle of the imports
# (as trio loads), where a hand on the keyboard lands as often as not
_CONSOLE_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys

    class CtrlC:
        def find_spec(self, name, path=None, target=None):
            if name == "trio":
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.argv = [ARGV0, "ls"]
    sys.meta_path.insert(0, CtrlC())
    from adapter.cli import main
    sys.exit(main())
    """
)


def _start(argv0: str) -> subprocess.CompletedProcess[str]:
    code = _CONSOLE_SCRIPT.replace("ARGV0", repr(argv0))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_ctrl_c_while_tether_loads_is_quiet() -> None:
    done = _start("/usr/local/bin/tether")
    assert done.returncode == 130
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr


def test_a_program_that_imports_the_cli_keeps_its_ctrl_c() -> None:
    # a test run (or any program) importing adapter.cli keeps Python's KeyboardInterrupt (which,
    # uncaught, ends the process by SIGINT)
    done = _start("/usr/bin/some-program")
    assert done.returncode == -2
    assert "KeyboardInterrupt" in done.stderr
