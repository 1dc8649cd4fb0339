"""``breakpoint()`` stops in the debugger in every process of a debug run, children included.

debugpy makes ``sys.breakpointhook`` call ``debugpy.breakpoint()``, which stops at the first
frame below it that pydevd counts as the debugger's own, and only debugpy's ``listen`` (the main
process) tells pydevd that debugpy's files are. A Python child started by pydevd's subprocess
patching (``subprocess``, ``multiprocessing``, ``os.exec*``, a fork) or by tether's
``sitecustomize`` runs pydevd without that: the hook picks a frame of debugpy's own, one that
returns at once, and the process runs on or stops somewhere else, by chance (debugpy 1.8.22).
Here the stop is the frame that called ``breakpoint()``, found without asking pydevd, and the
process stops at the next line there, as in the main process (and pdb before Python 3.13).

How it reaches every debugged process: pydevd imports ``PydevdCustomization.PREIMPORT``
(``"path;module"``) in each process it starts in, and hands it to the children it patches, for
debugpy its ``force_pydevd``. :func:`install` makes that this module (which imports
``force_pydevd`` first, so debugpy is there as before), and also for the children that pydevd
starts with ``python -c`` (it leaves the preimport out of their ``pydevd.config``: the wrapper
below puts it in). A forked child keeps the hook it inherited.

``PYTHONBREAKPOINT`` set by the user wins, as in plain python (``0`` turns ``breakpoint()`` off).
A process without a configured debugger ignores ``breakpoint()``, as ``debugpy.breakpoint()``
does. Loaded by path on the program's interpreter: standalone, stdlib and pydevd only.
"""

import functools
import os
import sys
from typing import Any

#: how a run's processes name this module to pydevd (``sys.modules`` and the preimport)
NAME = "_tether_breakpoint"


def breakpointhook(stop: Any, otherwise: Any = None) -> Any:
    """A ``sys.breakpointhook`` that stops the caller's frame with ``stop(frame)`` (False: it
    could not, then ``otherwise(*args, **kwargs)`` if given); ``PYTHONBREAKPOINT`` first."""

    def hook(*args: Any, **kwargs: Any) -> Any:
        if os.environ.get("PYTHONBREAKPOINT"):  # the user's choice: "0", "pdb.set_trace", ...
            return sys.__breakpointhook__(*args, **kwargs)
        if stop(sys._getframe(1)):  # the frame that called breakpoint()
            return None
        return otherwise(*args, **kwargs) if otherwise is not None else None

    hook.tether = True  # type: ignore[attr-defined]  # tests and install() know it by this
    return hook


def stop_here(frame: Any) -> bool:
    """Stop this thread in ``frame`` at its next line, as a breakpoint there would; False if
    pydevd has no configured client in this process."""
    pydevd = sys.modules.get("pydevd")
    if pydevd is None or not pydevd._is_attached():
        return False
    pydevd.settrace(
        suspend=True,
        trace_only_current_thread=True,
        patch_multiprocessing=False,
        stop_at_frame=frame,
        notify_stdin=False,
    )
    return True


def install() -> str | None:
    """In a process pydevd debugs: the hook, and this module preimported in the Python children
    pydevd starts; ``None`` when done, else why not (then nothing is changed)."""
    try:
        from _pydev_bundle import pydev_monkey
        from _pydevd_bundle import pydevd_constants
        from _pydevd_bundle.pydevd_defaults import PydevdCustomization
        from _pydevd_bundle.pydevd_dont_trace_files import DONT_TRACE, PYDEV_FILE
    except ImportError as exc:
        return f"cannot import pydevd ({exc})"
    make_c_args: Any = getattr(pydev_monkey, "_get_python_c_args", None)
    if not callable(make_c_args):
        return "no pydev_monkey._get_python_c_args"
    _debugpy_as_before()
    DONT_TRACE[os.path.basename(__file__)] = PYDEV_FILE  # the debugger's, never a user frame
    here = os.path.dirname(os.path.realpath(__file__))
    preimport = f"{here};{NAME}"
    PydevdCustomization.PREIMPORT = preimport
    if not getattr(make_c_args, "tether", False):
        pydev_monkey._get_python_c_args = _with_preimport(make_c_args, pydevd_constants)
    sys.breakpointhook = breakpointhook(stop_here)
    return None


def rank_value(source: str, globals_: Any, locals_: Any) -> str:
    """``tether eval`` / ``@all``: ``source`` evaluated in a paused frame's namespaces and
    described as a short JSON text (``_tether_values.py``, loaded from beside this module the
    first time: every debugged process has this one, preimported)."""
    values = sys.modules.get("_tether_values")
    if values is None:
        import importlib.util

        here = os.path.dirname(os.path.realpath(__file__))
        path = os.path.join(here, "_tether_values.py")
        spec = importlib.util.spec_from_file_location("_tether_values", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"no _tether_values.py in {here}")
        values = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(values)
        sys.modules["_tether_values"] = values
        try:  # the debugger's, never a user frame (as this module)
            from _pydevd_bundle.pydevd_dont_trace_files import DONT_TRACE, PYDEV_FILE

            DONT_TRACE["_tether_values.py"] = PYDEV_FILE
        except ImportError:
            pass
    return values.describe(source, globals_, locals_)  # type: ignore[no-any-return]


def _debugpy_as_before() -> None:
    """What debugpy's own preimport does in a child (its ``breakpoint()``, its API), from where
    pydevd is: ``<debugpy's parent>/debugpy/_vendored/pydevd/pydevd.py``."""
    where = getattr(sys.modules.get("pydevd"), "__file__", None)
    if where is None or "debugpy._vendored.force_pydevd" in sys.modules:
        return
    top = os.path.dirname(os.path.realpath(where))
    for _ in range(3):
        top = os.path.dirname(top)
    sys.path.insert(0, top)
    try:
        import debugpy._vendored.force_pydevd  # noqa: F401
    except ImportError:
        pass  # a pydevd without debugpy around it: nothing to put back
    finally:
        sys.path.remove(top)


def _with_preimport(make_c_args: Any, constants: Any) -> Any:
    """pydevd's ``-c`` prefix for a child (``pydev_monkey._get_python_c_args``, debugpy 1.8.22)
    with the preimport in its ``pydevd.config(...)``; unchanged if that is not in it."""

    @functools.wraps(make_c_args)
    def c_args(*args: Any, **kwargs: Any) -> Any:
        code = make_c_args(*args, **kwargs)
        from _pydevd_bundle.pydevd_defaults import PydevdCustomization

        mode = PydevdCustomization.DEBUG_MODE
        old = f"pydevd.config({constants.get_protocol()!r}, {mode!r}); "
        new = f"pydevd.config({constants.get_protocol()!r}, {mode!r}, "
        new += f"{PydevdCustomization.PREIMPORT!r}); "
        if isinstance(code, bytes):
            return code.replace(old.encode(), new.encode(), 1)
        return code.replace(old, new, 1)

    c_args.tether = True  # type: ignore[attr-defined]
    return c_args


if __name__ != "__main__" and "pydevd" in sys.modules:  # preimported by pydevd in a child
    why_not = install()
    if why_not is not None:
        sys.stderr.write(f"tether: breakpoint() may not stop this process: {why_not}\n")
