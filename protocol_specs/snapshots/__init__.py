"""Working-directory snapshots: content-addressed manifests, Merkle trees of directories, and checking a submitted tree."""
