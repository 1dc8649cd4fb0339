"""Runs, their queue and their leases: the run records in the store and everything that moves them.

- :mod:`.registry`: the run registry, the one writer of run records (compare-and-set);
- :mod:`.submitting`, :mod:`.claiming`, :mod:`.claims`: a run submitted once, claimed by a
  worker, and the pools waiting for a backend's queue; :mod:`.queue_wait`: why a run waits;
- :mod:`.worker_status`: what a worker's status entries do to its run; :mod:`.webhook`: the
  notice of an unattended stop;
- :mod:`.run_names`: which run a request means; :mod:`.audit`: each run's audit trail;
- :mod:`.metrics`: a run's metrics read back; :mod:`.tunnels`: tunnels into a run's worker.

Import the modules themselves (``relay.runs.registry``...): this package's ``__init__`` imports
nothing.
"""
