"""The debug session: what the shim, debugpy's one client, sends debugpy and publishes, decided
without I/O, and the trio driver that performs it.

- :mod:`.core`: the main process's session (:class:`ShimCore`); :mod:`.child`: each child
  process's; :mod:`.channel`: what both share; :mod:`.processes`: which session a message is for;
- :mod:`.replay`: the IDE side's configuration replayed into debugpy; :mod:`.watch`: unattended
  stops and pause reports; :mod:`.actions`: what the sans-I/O parts ask the loop to do;
- :mod:`.driver`: performing it (the debugpy connections, the run link, the program);
- :mod:`.output`: the program's output published in order with the debugger's messages;
- :mod:`.debuggable`: a plain run, until an IDE or a stop makes it a debug session.

Import the modules themselves (``worker_shim.session.core``...): this package's ``__init__``
imports nothing.
"""
