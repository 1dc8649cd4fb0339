"""The local DAP adapter an IDE attaches to: what the IDE is answered and what is published,
decided without I/O, and the trio server that performs it.

- :mod:`.core`: the main process's IDE session (:class:`AdapterCore`); :mod:`.children`: each
  child process's; :mod:`.processes`: which session an entry or a connection is for;
- :mod:`.forwarding`: the hop to the worker and back (the entry carrying a request, the requests
  waiting for an answer, what the worker's messages become for the IDE);
- :mod:`.checks`: the IDE's requests checked where they enter; :mod:`.status`: what the IDE is
  told about the run itself; :mod:`.stop_answers`: the stop-time prefetch; :mod:`.actions`: what
  the cores ask the server to do;
- :mod:`.server`: performing it (the IDE connections, the run's relay link); :mod:`.outbox`: what
  one IDE connection has yet to read; :mod:`.link_news`: what the relay link tells it from its own
  tasks; :mod:`.peer`: only the adapter's own OS user connects.

Import the modules themselves (``adapter.dap.core``...): this package's ``__init__`` imports
nothing.
"""
