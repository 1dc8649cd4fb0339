"""Runs debugpy's command line (``python -m debugpy ...``) with two fixes: no 40 ms stall per
message, and no half-second wait at the program's end.

Run as a script: ``python _tether_debugpy_boot.py [--tether-debugpy DIR] --listen 127.0.0.1:0
--wait-for-client ... target``, on the program's own interpreter (``DIR`` holds the worker's
debugpy, which that interpreter may not have).

pydevd writes every message as two ``sendall`` calls (header, then body) on a socket without
``TCP_NODELAY``, so Nagle's algorithm holds the body until the header is acknowledged, and the
receiver (debugpy's own adapter process) delays that acknowledgement by about 40 ms on Linux: every
DAP round trip costs ~44 ms before any work (``shared/research/perf-notes.md``). This script sets
``TCP_NODELAY`` on pydevd's socket by wrapping ``start_client``, the one function that creates it
(``PyDB.connect``, debugpy 1.8.22), then hands over to debugpy's own ``cli.main()`` unchanged. The
other direction needs nothing: debugpy's adapter writes each message in one piece.

It is defensive: if debugpy's internals are not what this was written against (debugpy 1.8.22:
``pydevd.start_client`` is ``pydevd_comm.start_client``), nothing is patched, a note goes to
stderr (the run's log), and debugpy runs exactly as ``python -m debugpy`` would. The wrapper
passes every argument through and only adds a socket option, so a changed signature cannot break
debugging either.
``tests/integration/test_debuggee.py`` checks both the fix (pydevd's socket has ``TCP_NODELAY``)
and the fallback against the installed debugpy.

The end of the program: pydevd notices that the program's threads are gone by polling every
``TIMEOUT_SLOW`` (0.2 s), then waits up to 0.5 s for its own threads, among them its reader, which
sits in a read until debugpy's adapter closes the socket, and that happens only once the program
exited: every debugged run ended ~0.7 s after its last line (measured: ~0.65 s with a client
attached). :func:`_quick_exit` polls every :data:`POLL` seconds instead and waits at most
:data:`THREADS_WAIT` for those threads (pydevd's writer, which must flush the last events, is done
by then: it is told to stop after everything queued). ``TIMEOUT_SLOW`` is also how long a thread
paused at a breakpoint may sleep with a command queued for it (a request that arrives while it
handles another can wait that long), so the shorter poll spares those stalls too; the cost is a
few more wake-ups per second of pydevd's own threads.

Child processes that debugpy patches start through stock debugpy (no fix); a Python process that a
non-Python command of the run starts gets it from ``_tether_sitecustomize.py``, which loads this file
for :func:`_patch_pydevd`.

Guarded: before debugpy listens, every listener it creates (here, and in its adapter process)
accepts only connections from the run's own uid and the worker's (``_tether_guard.py``): a local
process of another user that races the worker to a port is refused. If the guard cannot be put in
place, the debugger does not start (the run fails to start, saying why).

The other writer on the path is debugpy's adapter process, which the program's debugpy starts: it
sends a response and then an event (``next``, then ``stopped``) on a socket without
``TCP_NODELAY``, so the event waited for the shim's delayed ACK. With ``--tether-debugpy HOME``
this script points debugpy at ``HOME`` for the adapter (:func:`_adapter_from`), whose
``__main__.py`` is ``_tether_debugpy_adapter.py``: the adapter with ``TCP_NODELAY`` on its sockets.
"""

import functools
import os
import socket
import sys
from typing import Any

#: pydevd's poll (its ``TIMEOUT_SLOW``, 0.2 s): threads gone, commands for a paused thread
POLL = 0.05
#: the longest pydevd waits for its own threads once the program's are gone (its own: 0.5 s)
THREADS_WAIT = 0.05


def _patch_pydevd() -> str | None:
    """Make pydevd's socket TCP_NODELAY; ``None`` when done, else why not. Then
    :func:`_quick_exit` (on its own: a debugpy without it still gets the first fix)."""
    try:
        import pydevd  # put on sys.path by debugpy.server
        from _pydevd_bundle import pydevd_comm
        from _pydevd_bundle.pydevd_dont_trace_files import DONT_TRACE, PYDEV_FILE
    except ImportError as exc:
        return f"cannot import pydevd ({exc})"
    # like debugpy's own files, tether's are the debugger's: never traced, not in stack traces
    DONT_TRACE[os.path.basename(__file__)] = PYDEV_FILE
    DONT_TRACE["_tether_launch.py"] = PYDEV_FILE  # the main process of a non-Python command
    original: Any = getattr(pydevd_comm, "start_client", None)
    used: Any = getattr(pydevd, "start_client", None)  # what PyDB.connect() calls
    if not callable(original) or used is not original:
        return "pydevd.start_client is not pydevd_comm.start_client"

    start_client = nodelay(original)
    pydevd_comm.start_client = start_client
    pydevd.start_client = start_client
    why_not = _quick_exit(pydevd)
    if why_not is not None:
        print(f"tether: pydevd ends the program slowly here ({why_not})", file=sys.stderr)
    return None


def _quick_exit(pydevd: Any) -> str | None:
    """pydevd's poll every :data:`POLL` s, and its wait for its own threads at the end at most
    :data:`THREADS_WAIT`; ``None`` when done, else why not (then pydevd is left as it is)."""
    import inspect

    dispose = getattr(getattr(pydevd, "PyDB", None), "dispose_and_kill_all_pydevd_threads", None)
    if not isinstance(getattr(pydevd, "TIMEOUT_SLOW", None), float) or not callable(dispose):
        return "no pydevd.TIMEOUT_SLOW or PyDB.dispose_and_kill_all_pydevd_threads"
    if list(inspect.signature(dispose).parameters) != ["self", "wait", "timeout"]:
        return f"PyDB.dispose_and_kill_all_pydevd_threads{inspect.signature(dispose)}"

    @functools.wraps(dispose)
    def quick(self: Any, wait: bool = True, timeout: float = 0.5) -> Any:
        return dispose(self, wait, min(timeout, THREADS_WAIT))

    pydevd.PyDB.dispose_and_kill_all_pydevd_threads = quick
    pydevd.TIMEOUT_SLOW = POLL
    return None


def nodelay(make_socket: Any) -> Any:
    """``make_socket`` (a function returning a socket) with ``TCP_NODELAY`` set on what it
    returns; every argument passes through, so a changed signature cannot break anything."""

    @functools.wraps(make_socket)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        sock = make_socket(*args, **kwargs)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, AttributeError):
            pass
        return sock

    return wrapped


def _guarded(home: str | None) -> str | None:
    """Keep every process but the run's own and its worker's off debugpy's ports (this
    program's listener, and its adapter's, which runs from ``home``: ``_tether_guard.py``);
    ``None`` when done, else why the debugger must not start."""
    if home is not None and os.path.isfile(os.path.join(home, "__main__.py")):
        _adapter_from(home)
    elif os.environ.get("TETHER_DEBUG_PEERS") is not None:  # run by a worker: no stock adapter
        return "tether's adapter wrapper is missing (no --tether-debugpy HOME)"
    try:
        return load_guard().guard_debugpy()  # type: ignore[no-any-return]
    except Exception as exc:
        return f"cannot guard debugpy's ports ({type(exc).__name__}: {exc})"


def load_guard() -> Any:
    """``_tether_guard.py``, loaded from beside this file (it runs as a script, and is loaded by
    path from ``_tether_debugpy_adapter.py`` and ``_tether_sitecustomize.py``)."""
    return _sibling("_tether_guard")


def _sibling(name: str) -> Any:
    """The module ``name``, loaded from ``name.py`` beside this file, once per process."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    here = os.path.dirname(os.path.realpath(__file__))
    spec = importlib.util.spec_from_file_location(name, os.path.join(here, f"{name}.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"no {name}.py in {here}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydevd's preimport of it (_tether_breakpoint) finds it here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _breakpoints(pause_here: Any = None) -> None:
    """``breakpoint()`` stops in the debugger (``_tether_breakpoint.py``): in a debug run, in
    every debugged process (it installs itself: pydevd is loaded); in a plain one (``pause_here``),
    as ``--debug-when`` pauses, or as plain python where it cannot."""
    try:
        module = _sibling("_tether_breakpoint")
    except Exception as exc:  # said; debugpy's own breakpoint() stays
        print(f"tether: breakpoint() may not stop: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    if pause_here is not None:
        sys.breakpointhook = module.breakpointhook(pause_here, sys.__breakpointhook__)


def _adapter_from(home: str) -> None:
    """debugpy starts its adapter process as ``python <the directory of debugpy.adapter>``
    (``debugpy.server.api.listen``, 1.8.22): make that ``home``, whose ``__main__.py`` runs the
    adapter with ``TCP_NODELAY`` on its sockets (``_tether_debugpy_adapter.py``)."""
    import types

    from debugpy.server import api

    if getattr(getattr(api, "adapter", None), "__name__", "") == "debugpy.adapter":
        api.adapter = types.SimpleNamespace(  # type: ignore[attr-defined,assignment]
            __name__="debugpy.adapter", __file__=os.path.join(home, "__init__.py")
        )


def main() -> None:
    # Python put this script's directory (worker_shim/) first on sys.path, unless -P or -I: take
    # it out, so that the program's sys.path is what plain ``python script.py`` would give it.
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or ".") == here:
        del sys.path[0]
    # --tether-debugpy DIR: a directory holding only the worker's debugpy, for a program run on
    # its own interpreter (a venv, conda, another CPython); at the end of the path, so that the
    # program's own modules come first, and nothing else of the worker's is seen
    home = None
    if sys.argv[1:2] == ["--tether-debugpy"]:
        home = sys.argv[2]
        sys.path.append(home)
        del sys.argv[1:3]
    # --tether-attach PATH [--tether-post-mortem] -- TARGET: run the program now, debugpy only
    # when the worker asks (or an uncaught exception would end the program)
    if sys.argv[1:2] == ["--tether-attach"]:
        post_mortem = sys.argv[3:4] == ["--tether-post-mortem"]
        rest = sys.argv[4 if post_mortem else 3 :]
        if rest[:1] == ["--"]:
            _run_attachable(sys.argv[2], home, rest[1:], post_mortem)
            return
    from debugpy.server import cli  # imports pydevd (vendored) and puts it on sys.path

    refused = _guarded(home)
    if refused is not None:
        print(f"tether: not starting the debugger: {refused}", file=sys.stderr)
        sys.exit(1)
    sys.excepthook = _without_our_frames(sys.excepthook)

    try:
        why_not = _patch_pydevd()
    except Exception as exc:  # anything unexpected: run as stock debugpy
        why_not = f"{type(exc).__name__}: {exc}"
    if why_not is not None:
        import debugpy

        print(
            f"tether: debugpy {debugpy.__version__} is not as tether knows it (1.8.22): {why_not}; "
            "running without the TCP_NODELAY fix (each DAP round trip ~40 ms slower)",
            file=sys.stderr,
        )
    _hooks(_stop_at, _connected)
    _breakpoints()
    try:
        cli.main()  # type: ignore[no-untyped-call]
    except Exception as exc:
        if not _before_user_code(exc):
            raise  # the program's own error: reported as plain python reports it (and pydevd)
        # a script that does not compile, a missing file or module: what plain python would say,
        # without the debugger's own frames above it
        import traceback

        traceback.print_exception(type(exc), exc, None)
        sys.exit(1)


def _run_attachable(path: str, home: str | None, target: list[str], post_mortem: bool) -> None:
    """Run ``target`` (``script args``, ``-m module args`` or ``-c code args``) as plain python
    would, debuggable later without a restart or ptrace: connected to the worker's unix socket
    ``path``, a thread waits, and nothing of debugpy is loaded, let alone tracing, until the
    worker writes ``attach`` there. Then the thread starts debugpy listening (the program goes on
    running) and answers with the port of debugpy's adapter; the worker connects to it as for a
    debug run, and the breakpoints it sends apply to the running program's threads.

    ``post_mortem``: an uncaught exception (of the main thread or another) stops its thread
    before it is reported (:meth:`_Worker.post_mortem`, from the exception hooks); once it is let
    go, the program ends as it would have (the traceback, exit code 1)."""
    import threading

    worker = _Worker(path, home)
    _hooks(worker.pause_here, worker.can_pause)
    _breakpoints(worker.pause_here)
    if worker.conn is not None:
        thread = threading.Thread(target=worker.serve, name="tether.attach", daemon=True)
        thread.is_pydev_daemon_thread = True  # type: ignore[attr-defined]  # not the user's
        thread.start()
    hook = sys.excepthook
    if post_mortem:  # the hooks run once the exception left every frame: pydevd saw it pass
        hook = _stopping_first(hook, worker)
        threading.excepthook = _stopping_first(threading.excepthook, worker, thread=True)
    sys.excepthook = _without_our_frames(hook, debugger=False)
    _run_target(target)


def _run_target(target: list[str]) -> None:
    import runpy

    safe = sys.flags.isolated or getattr(sys.flags, "safe_path", False)  # -I, -P: no path entry
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]  # runpy puts the module's file in sys.argv[0]
        if not safe:
            sys.path.insert(0, os.getcwd())
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    elif target[0] == "-c":
        import types

        sys.argv = ["-c", *target[2:]]
        if not safe:
            sys.path.insert(0, "")
        main = sys.modules["__main__"] = types.ModuleType("__main__")  # not this script's globals
        exec(compile(target[1], "<string>", "exec"), main.__dict__)
    else:
        sys.argv = list(target)
        if not safe:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target[0])))
        runpy.run_path(target[0], run_name="__main__")


#: how long a post-mortem waits for the worker to connect and configure debugpy
CLIENT_TIMEOUT = 60.0


class _Worker:
    """The worker at the other end of the unix socket ``path`` (``None`` without it: a program
    started by hand runs plain). Lines from the worker: ``attach``; to it: the port of debugpy's
    adapter (or ``error: why``) in answer, and ``post-mortem PORT`` when an uncaught exception
    stopped a thread and debugpy waits for the worker at ``PORT``."""

    def __init__(self, path: str, home: str | None) -> None:
        import threading

        self.home = home
        self.pid = os.getpid()  # a forked child inherits the socket, never the worker
        self.port = 0
        self._listening = threading.Lock()
        self._writing = threading.Lock()
        self.conn: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.conn.connect(path)
        except OSError:
            self.conn.close()
            self.conn = None

    def listen(self) -> int:
        """debugpy listening (started the first time), its adapter's port."""
        with self._listening:
            if not self.port:
                hook = sys.breakpointhook
                self.port = _listen(self.home)
                sys.breakpointhook = hook  # not debugpy's, which importing it put in
            return self.port

    def say(self, line: str) -> bool:
        if self.conn is None or os.getpid() != self.pid:
            return False
        try:
            with self._writing:
                self.conn.sendall(f"{line}\n".encode())
        except OSError:
            return False
        return True

    def serve(self) -> None:
        """The attach thread: each ``attach`` line is answered with the port (debugpy starts
        listening the first time) or ``error: why``; the program goes on either way."""
        assert self.conn is not None
        with self.conn.makefile("rb") as requests:
            for line in requests:
                if line.strip() != b"attach":
                    continue
                try:
                    answer = str(self.listen())
                except Exception as exc:  # said to the worker; the program goes on
                    answer = f"error: {type(exc).__name__}: {exc}"
                if not self.say(answer):
                    return

    def can_pause(self) -> bool:
        """Whether :meth:`pause_here` can work in this process (not a forked child: the worker's
        line is its parent's)."""
        return _connected() or (self.conn is not None and os.getpid() == self.pid)

    def pause_here(self, frame: Any) -> bool:
        """Stop this thread in ``frame`` (``--debug-when``): debugpy starts, the worker is told
        (``pause PORT``: it connects and configures debugpy without waiting for an IDE, as for a
        post-mortem), then the thread stops there, as at a breakpoint; False if it cannot."""
        if _stop_at(frame):  # debugpy runs with its client already (an IDE attached)
            return True
        if self.conn is None or os.getpid() != self.pid:
            return False
        try:
            port = self.listen()
        except Exception as exc:
            print(f"tether: cannot pause (debugpy did not start: {exc})", file=sys.stderr)
            return False
        if not self.say(f"pause {port}"):
            return False
        import threading

        import debugpy

        give_up = threading.Timer(CLIENT_TIMEOUT, debugpy.wait_for_client.cancel)
        give_up.daemon = True
        give_up.start()
        debugpy.wait_for_client()
        give_up.cancel()
        return _stop_at(frame)

    def post_mortem(self, excinfo: Any) -> None:
        """Stop this thread on the uncaught exception ``excinfo``, in its raising frame, until
        the worker's client lets it go (an IDE, or the run's unattended-stop policy): debugpy
        starts, the worker is told, connects and configures it (its exception filters decide,
        as debugpy's own stops on uncaught exceptions do), then debugpy stops here. Not for how
        programs end on purpose (``SystemExit``, ``KeyboardInterrupt``), nor once debugpy has a
        client: it stops on uncaught exceptions itself then."""
        if not isinstance(excinfo[1], Exception) or self.conn is None or os.getpid() != self.pid:
            return
        if "debugpy" in sys.modules and sys.modules["debugpy"].is_client_connected():
            return
        try:
            port = self.listen()
        except Exception as exc:
            print(f"tether: no post-mortem (debugpy did not start: {exc})", file=sys.stderr)
            return
        if not self.say(f"post-mortem {port}"):
            return
        import threading

        import debugpy

        give_up = threading.Timer(CLIENT_TIMEOUT, debugpy.wait_for_client.cancel)
        give_up.daemon = True
        give_up.start()
        debugpy.wait_for_client()
        give_up.cancel()
        if debugpy.is_client_connected():
            debugpy.trigger_exception_handler(excinfo)


def _hooks(pause_here: Any, can_pause: Any) -> None:
    """What ``tether.py`` finds in ``sys.modules["_tether_hooks"]``: ``pause_here(frame)``, which
    stops the calling thread in ``frame`` under the debugger (``--debug-when``; False if it
    cannot), and ``can_pause()``, whether it could in this process (asked first: a sweep's one
    pause is not spent on a process that cannot take it)."""
    import types

    hooks = types.ModuleType("_tether_hooks")
    hooks.pause_here = pause_here  # type: ignore[attr-defined]
    hooks.can_pause = can_pause  # type: ignore[attr-defined]
    sys.modules["_tether_hooks"] = hooks


def _connected() -> bool:
    debugpy = sys.modules.get("debugpy")
    return debugpy is not None and bool(debugpy.is_client_connected())


def _stop_at(frame: Any) -> bool:
    """Stop this thread in ``frame`` as a breakpoint there would (debugpy has its client: a
    debug run, or a plain one the worker attached to); False if debugpy has none."""
    debugpy = sys.modules.get("debugpy")
    if debugpy is None or not debugpy.is_client_connected():
        return False
    try:
        from debugpy.server import api

        api._settrace(  # type: ignore[no-untyped-call]
            suspend=True,
            trace_only_current_thread=True,
            patch_multiprocessing=False,
            stop_at_frame=frame,
        )
    except Exception:  # not the debugpy this was written against: stop where debugpy says
        debugpy.breakpoint()
    return True


def _stopping_first(hook: Any, worker: _Worker, *, thread: bool = False) -> Any:
    """``sys.excepthook`` (``thread``: ``threading.excepthook``) stopping the thread post-mortem
    before ``hook`` reports the exception."""

    @functools.wraps(hook)
    def excepthook(*args: Any) -> Any:
        if thread:
            worker.post_mortem((args[0].exc_type, args[0].exc_value, args[0].exc_traceback))
        else:
            worker.post_mortem(args)
        return hook(*args)

    return excepthook


def _listen(home: str | None) -> int:
    """Start debugpy as the boot script would have at the start (its fixes, the worker's
    adapter), listening for the worker on loopback, the program's children not followed."""
    import debugpy

    refused = _guarded(home)
    if refused is not None:
        raise RuntimeError(refused)
    why_not = _patch_pydevd()
    if why_not is not None:
        print(f"tether: debugging without the TCP_NODELAY fix: {why_not}", file=sys.stderr)
    debugpy.configure(subProcess=False)
    _host, port = debugpy.listen(("127.0.0.1", 0))
    os.environ["DEBUGPY_RUNNING"] = "true"  # what debugpy's own start sets
    return int(port)


def _without_our_frames(hook: Any, *, debugger: bool = True) -> Any:
    """``sys.excepthook`` showing an uncaught exception as plain python would: without the frames
    of this script, ``runpy`` and (``debugger``) debugpy's command line above the program's own."""
    import runpy

    ours: tuple[str, ...] = (os.path.realpath(__file__), os.path.realpath(runpy.__file__))
    if debugger:
        import debugpy

        ours += (os.path.dirname(os.path.realpath(debugpy.__file__)),)

    @functools.wraps(hook)
    def excepthook(kind: Any, value: Any, tb: Any) -> Any:
        while tb is not None and os.path.realpath(tb.tb_frame.f_code.co_filename).startswith(ours):
            tb = tb.tb_next
        if isinstance(value, BaseException):
            value.__traceback__ = tb  # what the default hook prints, whatever ``tb`` says
        return hook(kind, value, tb)

    return excepthook


def _before_user_code(exc: BaseException) -> bool:
    """Whether every frame of ``exc``'s traceback is the debugger's (this script, debugpy)."""
    import debugpy

    ours = (os.path.dirname(os.path.realpath(debugpy.__file__)), os.path.realpath(__file__))
    tb = exc.__traceback__
    while tb is not None:
        name = os.path.realpath(tb.tb_frame.f_code.co_filename)
        if not name.startswith(ours):
            return False
        tb = tb.tb_next
    return True


if __name__ == "__main__":
    main()
