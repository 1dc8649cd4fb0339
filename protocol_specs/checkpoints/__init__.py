"""Checkpoints that follow a run and the outputs it brings home: file sets stored as chunks."""
