"""tether's relay: the server (``relay.server`` and its rooms) and, in ``relay.client``, the client
the CLI, the adapter, the worker and the benchmarks use. Importing the package imports neither."""
