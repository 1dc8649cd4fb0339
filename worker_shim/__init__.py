"""The GPU node's side: the worker pool, and the shim that runs the program under debugpy as its
one long-lived client and relays its traffic.

The shim (``worker_shim.shim``) runs one claimed attempt: its debug session
(``worker_shim.session``: the sans-I/O cores and their trio driver) over the program and its
processes (``worker_shim.program``). The pool and the scheduler backends (``worker_shim.backends``)
take runs from the relay and run their attempts. ``worker_shim.inject`` holds the scripts that run
inside the user's program, by path.
"""
