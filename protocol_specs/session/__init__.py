"""A debug session's decisions: the fold of a run's two streams, stop-time prefetch, the processes of a run, and what an unattended stop does."""
