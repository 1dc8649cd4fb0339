"""tether's relay: the server and, in ``relay.client``, the client the CLI, the adapter, the worker
and the benchmarks use. Importing the package imports neither.

The server (``relay.server``) admits a connection at its door (``relay.gate``), then serves it by
its role: a run's links and logs readers (``relay.links``), control requests (``relay.control``),
or the web view (``relay.web``). Beneath them: runs, their queue and leases (``relay.runs``),
sweeps (``relay.sweeps``), snapshots (``relay.snapshots``), tokens (``relay.auth``), and the
store with its keys (``relay.store``). ``relay.embedded`` runs the default store server;
``relay.config`` is what an operator tunes; ``relay.gc_policy`` is the relay's garbage collection.
"""
