"""The relay wire protocol: msgpack frames, the control requests and answers, the entries of a run's streams, and tunnels."""
