"""Snapshots of the submitted working directory: which files, their digests and trees, and the
upload of what the relay lacks.

- :mod:`.selection`: which files a snapshot holds (git's, or all but the ignored ones);
- :mod:`.snapshot`: those files hashed into a Merkle tree of content-addressed trees;
  :mod:`.hash_cache`: what the last snapshot learnt, so unchanged files are not read again;
- :mod:`.snapshot_upload`: uploading a snapshot and submitting a run on it.

Import the modules themselves (``adapter.snapshots.snapshot``...): this package's ``__init__``
imports nothing.
"""
