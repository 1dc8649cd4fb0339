"""One rank of `ranks_launcher.py 4 ranks4_worker.py`: a star rendezvous at rank 0, then every
rank waits in a Python loop (a socket poll with a short timeout, so a pause lands at once) while
rank 2 runs the lines only it runs; rank 2 then tells rank 0, which tells the others."""

import os
import socket
import time


def wait_for(sock):
    sock.settimeout(0.05)
    while True:
        try:
            return sock.recv(1)
        except TimeoutError:
            pass


def rendezvous(rank, port):
    if rank == 0:
        server = socket.create_server(("127.0.0.1", port))
        peers = {}
        while len(peers) < int(os.environ["WORLD_SIZE"]) - 1:
            conn = server.accept()[0]
            peers[int(conn.recv(1))] = conn
        server.close()
        return peers
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port))
            conn.sendall(str(rank).encode())
            return {0: conn}
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main():
    rank = int(os.environ["RANK"])
    peers = rendezvous(rank, int(os.environ["MASTER_PORT"]))
    if rank == 0:
        for peer in peers.values():
            peer.sendall(b"g")  # everyone is up: go
        wait_for(peers[2])
        for peer in (peers[1], peers[3]):
            peer.sendall(b"d")
    elif rank == 2:
        wait_for(peers[0])
        marker = rank * 10  # line 51: rank 2 only (a breakpoint)
        marker += 1  # line 52
        peers[0].sendall(b"d")
    else:
        wait_for(peers[0])
        wait_for(peers[0])
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
