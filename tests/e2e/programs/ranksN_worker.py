"""One rank of `ranks_launcher.py N ranksN_worker.py` (N >= 6): a star rendezvous at rank 0, then
every rank waits in a Python loop (a socket poll with a short timeout, so a pause lands at once)
while rank 5 runs the lines only it runs; rank 5 then tells rank 0, which tells the others."""

import os
import socket
import time

SPECIAL = 5


def wait_for(sock):
    sock.settimeout(0.05)
    while True:
        try:
            return sock.recv(1)
        except TimeoutError:
            pass


def rendezvous(rank, world_size, port):
    if rank == 0:
        server = socket.create_server(("127.0.0.1", port), backlog=world_size)
        peers = {}
        while len(peers) < world_size - 1:
            conn = server.accept()[0]
            peers[int(conn.recv(4))] = conn
        server.close()
        return peers
    deadline = time.monotonic() + 300
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port))
            conn.sendall(b"%04d" % rank)
            return {0: conn}
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main():
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    peers = rendezvous(rank, world_size, int(os.environ["MASTER_PORT"]))
    if rank == 0:
        for peer in peers.values():
            peer.sendall(b"g")  # everyone is up: go
        wait_for(peers[SPECIAL])
        for r, peer in peers.items():
            if r != SPECIAL:
                peer.sendall(b"d")
    elif rank == SPECIAL:
        wait_for(peers[0])
        marker = rank * 10  # line 55: rank 5 only (a breakpoint)
        marker += 1
        peers[0].sendall(b"d")
    else:
        wait_for(peers[0])
        wait_for(peers[0])
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
