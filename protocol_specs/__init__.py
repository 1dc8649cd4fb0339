"""The protocols as code: DAP framing and models, the relay's wire format, the run and session state
machines, permissions. Sans-I/O: no event loop, socket or Redis (``tests/unit/test_sans_io.py``)."""
