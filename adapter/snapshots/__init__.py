"""Snapshots of the submitted working directory: which files, their digests and trees, and the
upload of what the relay lacks.

- :mod:`.snapshot`: the files chosen, hashed (with a cache) into a Merkle tree of
  content-addressed trees;
- :mod:`.snapshot_upload`: uploading a snapshot and submitting a run on it.

Import the modules themselves (``adapter.snapshots.snapshot``...): this package's ``__init__``
imports nothing.
"""
