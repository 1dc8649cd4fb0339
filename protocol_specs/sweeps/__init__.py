"""Sweeps: many runs of one command over a search space, and the search and early stopping that pick and prune their trials."""
