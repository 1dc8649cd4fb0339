"""The protocols as code, sans-I/O: no event loop, socket or Redis (``tests/unit/test_sans_io.py``).

One sub-package per concern, lowest first: ``dap/`` (the Debug Adapter Protocol), ``runs/``,
``snapshots/``, ``access/``, ``sweeps/``, ``wire/`` (the relay wire protocol), ``link/`` (the relay
link's two halves), ``session/`` (the debug session's decisions), ``web/`` (the web view's side).
``docs/architecture.md`` draws the parts and the imports between them."""
