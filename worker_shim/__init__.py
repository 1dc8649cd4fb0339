"""The GPU node's side: the worker pool, and the shim that runs the program under debugpy as its
one long-lived client and relays its traffic."""
