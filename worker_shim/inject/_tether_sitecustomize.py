"""Connects a Python process started by a non-Python program of a debug run to the run's debugger,
before its own code runs. Linked as ``sitecustomize.py`` into a directory that
``_tether_launch.py`` puts first on ``PYTHONPATH``, so every Python process below it imports it at
start-up (unless started with ``-S``, ``-E`` or ``-I``: those run undebugged).

What it does is what pydevd's own patching puts in front of a Python child's code: import the
worker's pydevd and ``settrace`` to debugpy's adapter with the parent's pid; the call returns once
the shim has configured this process (breakpoints replayed), so breakpoints apply before user code.
Then it sets ``TETHER_DEBUGPY_CHILD`` to name this process as the parent of Python processes that
it starts through a non-Python program, and imports the ``sitecustomize`` it shadows, if any.

In every debug run with subprocesses (a Python command too: the worker puts its directory on
``PYTHONPATH`` then) it also raises ``torch.distributed``'s process-group timeouts from their
creation (``_tether_collectives.py``): a paused rank must not end the job.

Nothing here may stop the program: on any failure (an old interpreter, a missing pydevd, a debugger
it cannot reach: a process on another host, as ``srun`` across nodes starts) it says so on stderr
once and the process runs undebugged, and so do the Python processes it starts. A process that debugpy already patched (its
command line runs pydevd) is left to debugpy. Runs on the user's interpreter: any CPython 3.6+ parses it (older
ones than debugpy's 3.10 are told so and run undebugged).
"""

import os
import sys


def _debug_this_process() -> None:
    raw = os.environ.get("TETHER_DEBUGPY_CHILD")
    if not raw:
        return
    argv = getattr(sys, "orig_argv", sys.argv)
    if any(os.path.basename(a) == "pydevd.py" or "pydevd.settrace(" in a for a in argv):
        return  # started by pydevd's own subprocess patching: debugpy connects it
    import json

    config = {}
    try:
        config = json.loads(raw)
        if sys.version_info < (3, 10):  # noqa: UP036 (the user's interpreter, not tether's)
            raise RuntimeError(f"Python {sys.version_info[0]}.{sys.version_info[1]} is too old")
        sys.path.insert(0, config["pydevd"])
        import pydevd

        _nodelay()
        setup = dict(config["setup"])
        # the preimport (``_tether_breakpoint.py``): breakpoint() stops here, and in its children
        pydevd.config(config["protocol"], config["debug_mode"], config.get("preimport", ""))
        pydevd.settrace(
            host=config["host"],
            port=config["port"],
            suspend=False,
            trace_only_current_thread=False,
            patch_multiprocessing=False,  # below, once connected: a failed connect leaves none
            access_token=setup.get("access-token"),
            client_access_token=setup.get("client-access-token"),
            __setup_holder__=setup,
        )
        from _pydev_bundle import pydev_monkey

        pydev_monkey.patch_new_process_functions()  # debugpy follows its Python children
        config["setup"] = {**setup, "ppid": os.getpid()}  # pydevd keeps ``setup`` itself
        os.environ["TETHER_DEBUGPY_CHILD"] = json.dumps(config)
    except Exception as exc:
        os.environ.pop("TETHER_DEBUGPY_CHILD", None)  # its own Python children need not try
        why = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, OSError) and isinstance(config, dict):
            where = f"{config.get('host')}:{config.get('port')}"
            why = f"cannot reach the run's debugger at {where} ({why}; on another host?)"
        command = " ".join(" ".join(argv).split())[:200]  # one line
        sys.stderr.write(
            f"tether: {command} (pid {os.getpid()}) runs without the debugger: {why}\n"
        )


def _nodelay() -> None:
    """``TCP_NODELAY`` on pydevd's socket, as for the main process (``_tether_debugpy_boot.py``,
    loaded from beside the file this one links to)."""
    import importlib.util

    here = os.path.dirname(os.path.realpath(__file__))
    spec = importlib.util.spec_from_file_location(
        "_tether_debugpy_boot", os.path.join(here, "_tether_debugpy_boot.py")
    )
    if spec is None or spec.loader is None:
        return
    boot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(boot)
    boot._patch_pydevd()


def _collectives() -> None:
    """In a debug run (``TETHER_COLLECTIVE_TIMEOUT`` set by the worker), every
    ``torch.distributed`` process group of this process gets a long timeout from its creation, so
    a paused rank does not end the job, and ``torch.distributed.breakpoint()`` stops in the
    debugger (``_tether_collectives.py``, loaded from beside the file this one links to). Never
    stops the program."""
    if not os.environ.get("TETHER_COLLECTIVE_TIMEOUT"):
        return
    try:
        import importlib.util

        here = os.path.dirname(os.path.realpath(__file__))
        spec = importlib.util.spec_from_file_location(
            "_tether_collectives", os.path.join(here, "_tether_collectives.py")
        )
        if spec is None or spec.loader is None:
            raise ImportError(f"no _tether_collectives.py in {here}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.install()
    except Exception as exc:
        sys.stderr.write(
            f"tether: cannot raise torch.distributed's timeouts ({type(exc).__name__}: {exc}): "
            "a rank paused longer than a process group's timeout ends the job\n"
        )


def _chain() -> None:
    """Import the ``sitecustomize`` this one shadows (a distribution's, a venv's), as Python
    would have without it; this directory leaves ``sys.path``."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    ours = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  (the next one on the path, if any)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise  # the shadowed one's own error: Python's site module reports it
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_debug_this_process()
_collectives()
_chain()
