"""DDP on the CPU (gloo) with a short process-group timeout (10 s): rank 1 stops in its step 2,
and rank 0 waits for it in the gradients' all_reduce, a collective already in flight when rank 1
pauses."""

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def step(model, optimizer, i, rank):
    x = torch.tensor([[float(i + rank)]])
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), 2 * x)
    if rank == 1 and i == 2:
        print(f"rank 1 pauses at step {i}", flush=True)  # the breakpoint
    loss.backward()  # DDP's all_reduce of the gradients: rank 0 waits here for rank 1
    optimizer.step()
    return loss.item()


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=10))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = [step(model, optimizer, i, rank) for i in range(4)]
    dist.barrier()
    print(f"rank {rank} done, {len(losses)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
