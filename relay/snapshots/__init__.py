"""Snapshots on the relay: the blobs that hold their files (:mod:`.blobs`) and the trees that list
them (:mod:`.trees`). The formats are ``protocol_specs/snapshots/snapshots.py`` and ``protocol_specs/snapshots/trees.py``.

Import the modules themselves (``relay.snapshots.blobs``...): this package's ``__init__`` imports
nothing.
"""
