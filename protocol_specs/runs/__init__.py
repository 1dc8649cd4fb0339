"""Runs: the spec as submitted, the record and its lifecycle table, claims, submits, resources, metrics, and how a run and its output read."""
