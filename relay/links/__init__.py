"""Run connections and delivery: a run's links (``ide``, ``worker``, ``tunnel``) and its logs
readers (``logs``), after the gate (``relay/gate.py``) admitted them.

- :mod:`.links`: one run's links, what a peer publishes and what it acknowledges;
- :mod:`.readers`: a ``logs`` connection, delivered a run's logs or metrics stream;
- :mod:`.delivery`: sending a stream to a peer, live or as history;
- :mod:`.fanout`: waking the connections that deliver a stream, one subscription per relay.

Import the modules themselves (``relay.links.links``...): this package's ``__init__`` imports
nothing.
"""
