"""The main process of a debug run whose command is not Python: a shell script (``./train.sh``,
``bash -c '...'``), ``srun``, ``mpirun``, ``make``. Every Python process that command starts, at
any depth, is debugged as a child of this one.

Run by debugpy as its target: ``python _tether_debugpy_boot.py --listen ... --configure-subProcess
true _tether_launch.py BOOT_DIR -- COMMAND...``, on the worker's interpreter. It reads, from the
pydevd that debugpy started here, how a child process connects to debugpy's adapter (what pydevd
itself puts into the command line of a Python child it patches: the adapter's address, its access
tokens, the parent's pid), exports that as ``TETHER_DEBUGPY_CHILD`` (JSON), puts ``BOOT_DIR`` first
on ``PYTHONPATH`` (it holds ``sitecustomize.py``, a link to ``_tether_sitecustomize.py``), and runs
the command. A Python process the command starts imports that ``sitecustomize`` at start-up and
connects to the adapter before its own code runs, naming this process (or the debugged Python
process that started it through a non-Python program) as its parent: debugpy's adapter then
announces it to the shim like any subprocess (``debugpyAttach``), and the shim configures it at once.

The exit status is the command's: its exit code, or the same signal when it was killed by one.
SIGTERM, SIGINT and SIGHUP are passed on to the command (the shim signals the whole process group
in any case). This file is debugger machinery: never traced, never in a stack trace
(``_tether_debugpy_boot.py`` marks it so).
"""

import json
import os
import signal
import subprocess
import sys

#: the environment variable a Python process of the run reads in ``sitecustomize`` (JSON)
CHILD_ENV = "TETHER_DEBUGPY_CHILD"


def child_config() -> dict:  # type: ignore[type-arg]
    """How a Python process connects to debugpy's adapter as this process's child: what pydevd
    puts into the ``-c`` prefix of a Python child it patches (``pydev_monkey._get_python_c_args``,
    debugpy 1.8.22)."""
    import pydevd
    from _pydev_bundle import pydev_monkey
    from _pydevd_bundle import pydevd_constants
    from _pydevd_bundle.pydevd_defaults import PydevdCustomization

    host, port = pydev_monkey._get_host_port()
    setup = pydev_monkey._get_setup_updated_with_protocol_and_ppid(pydevd.SetupHolder.setup)
    return {
        "pydevd": pydev_monkey.pydev_src_dir,
        "protocol": pydevd_constants.get_protocol(),
        "debug_mode": PydevdCustomization.DEBUG_MODE,
        "host": host,
        "port": port,
        "setup": setup,
        # what pydevd imports first in each process (``_tether_breakpoint.py``: breakpoint())
        "preimport": PydevdCustomization.PREIMPORT,
    }


def main(argv: list[str]) -> int:
    boot_dir, dashes, command = argv[0], argv[1], argv[2:]
    assert dashes == "--" and command, "usage: _tether_launch.py BOOT_DIR -- COMMAND..."
    env = dict(os.environ)
    try:
        env[CHILD_ENV] = json.dumps(child_config())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [boot_dir, env.get("PYTHONPATH")]))
    except Exception as exc:  # a debugpy that is not as this was written against
        print(
            f"tether: cannot debug the Python processes of {command[0]}: debugpy is not as "
            f"tether knows it ({type(exc).__name__}: {exc}); running them without the debugger",
            file=sys.stderr,
        )
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        print(f"tether: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    code = child.wait()
    if code < 0:  # killed by a signal: end the same way, so the exit status says so
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
