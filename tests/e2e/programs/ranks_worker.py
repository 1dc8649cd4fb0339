"""One rank of ranks_launcher.py: a TCP rendezvous (rank 0 listens, the others connect), then every
rank sends its partial sum to rank 0, which answers with the total (an all_reduce by hand)."""

import os
import socket
import time


def rendezvous(rank, world_size, port):
    if rank == 0:
        server = socket.create_server(("127.0.0.1", port))
        peers = [server.accept()[0] for _ in range(world_size - 1)]
        server.close()
        return peers
    deadline = time.monotonic() + 60
    while True:
        try:
            return [socket.create_connection(("127.0.0.1", port))]
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main():
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    peers = rendezvous(rank, world_size, int(os.environ["MASTER_PORT"]))
    partial = (rank + 1) * 10
    print(f"rank {rank} partial {partial}", flush=True)
    if rank == 0:
        total = partial + sum(int(p.recv(64)) for p in peers)
        for p in peers:
            p.sendall(str(total).encode())
    else:
        peers[0].sendall(str(partial).encode())  # line 36: rank 1 only (a breakpoint)
        total = int(peers[0].recv(64))
    print(f"rank {rank} total {total}", flush=True)
    if os.environ.get("BREAK_IN_RANK") == str(rank):
        breakpoint()  # line 40: the rank BREAK_IN_RANK names stops here
        print(f"rank {rank} let go", flush=True)


if __name__ == "__main__":
    main()
