"""A torchrun-style launcher in plain Python: starts WORLD_SIZE ranks of ranks_worker.py (or
the worker program named second), each with
RANK / LOCAL_RANK / WORLD_SIZE / MASTER_PORT in its environment, and waits for them all."""

import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    world_size = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    name = sys.argv[2] if len(sys.argv) > 2 else "ranks_worker.py"  # or ranks4_worker.py
    worker = str(Path(__file__).with_name(name))
    port = str(free_port())
    ranks = []
    for rank in range(world_size):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        ranks.append(subprocess.Popen([sys.executable, worker], env=env))
    codes = [p.wait() for p in ranks]
    print(f"launcher done, rank exit codes {codes}", flush=True)
    sys.exit(max(codes))


if __name__ == "__main__":
    main()
