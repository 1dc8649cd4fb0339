"""The program and its processes on the worker: where and as whom they run, how they start, what
they are called, their files, metrics and tunnels, and their end.

- :mod:`.quarters`: an attempt's directories, uid and environment; :mod:`.identity`: who a
  program runs as; :mod:`.uid_leases`: uids leased host-wide; :mod:`.reaper`: a run's processes
  end with its worker (``python -m worker_shim.program.reaper``);
- :mod:`.python_command`: the user's Python command in debug mode; :mod:`.debuggee`: the program
  started under debugpy; :mod:`.process_names`: what a debugged process is called;
- :mod:`.files`: a run's snapshot materialised; :mod:`.metrics`: the program's metrics;
- :mod:`.tunnels`, :mod:`.terminal`: commands and shells run for the user; :mod:`.loopback`:
  loopback connections only to the run's own listeners.

Import the modules themselves (``worker_shim.program.debuggee``...): this package's ``__init__``
imports nothing.
"""
