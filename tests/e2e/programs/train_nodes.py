"""A tiny DDP training run over two nodes on the CPU (gloo): ``torchrun --nnodes 2
--nproc-per-node 2`` on each node, four ranks in all. Node 1's ranks (``TETHER_NODE``, which
tether sets on each node's program) has its first rank check its step in a function no other rank
calls."""

import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def node_one_check(loss, step, rank):
    where = f"{socket.gethostname()}:{os.environ.get('MASTER_ADDR')}"
    text = f"rank {rank} on node 1 checks step {step}, loss {loss:.3f} ({where})"
    print(text, flush=True)  # the breakpoint
    return loss


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    node = int(os.environ["TETHER_NODE"])
    first_here = os.environ["LOCAL_RANK"] == "0"
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(4):
        x = torch.tensor([[float(step + rank)]])
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), 2 * x)
        loss.backward()
        optimizer.step()
        if node == 1 and first_here and step == 2:
            node_one_check(loss.item(), step, rank)
    dist.barrier()
    print(f"rank {rank} of {dist.get_world_size()} on node {node} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
