"""The embedded default store server for one machine (``tether up``, the tests): a
Redis-compatible binary (:mod:`.server`), run under a guard process (:mod:`.guard`) that stops it
with tether however tether ends.

Import the modules themselves (``relay.embedded.server``...): this package's ``__init__`` imports
nothing, so that ``python -m relay.embedded.guard`` loads nothing it does not need.
"""
