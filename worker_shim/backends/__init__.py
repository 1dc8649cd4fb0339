"""Where runs come from and where attempts run: the local pool and the scheduler backends.

- :mod:`.pool`: the pool of ``tether up`` / ``tether worker``, and the one-run worker a scheduler
  job starts; :mod:`.confirm`: a claim confirmed before it is run; :mod:`.afterlife`: an ended
  attempt's directory kept, its tunnels served; :mod:`.housekeeping`: a worker's disk in bounds;
- :mod:`.scheduler`: what every scheduler backend does; :mod:`.job_watch`: its decisions about
  each job; :mod:`.slurm`, :mod:`.ray_jobs`: Slurm and Ray.

Import the modules themselves (``worker_shim.backends.pool``...): this package's ``__init__``
imports nothing.
"""
