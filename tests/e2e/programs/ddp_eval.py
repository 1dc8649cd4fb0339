"""DDP on the CPU (gloo) for ``tether eval``: every rank computes its loss and its gradients (DDP
averages them across ranks), then waits for the others in a Python loop around a non-blocking
barrier, so a pause lands at once; rank 2 stops at step 1 before it joins the barrier."""

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(2):
        x = torch.full((8, 4), float(rank + step))
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        loss.backward()  # the gradients, averaged over the ranks
        grad = model.module.weight.grad
        if rank == 2 and step == 1:
            print(f"rank 2 at step {step}", flush=True)  # the breakpoint
        done = dist.barrier(async_op=True)
        while not done.is_completed():
            time.sleep(0.01)
        optimizer.step()
    print(f"rank {rank} done, loss {loss.item():.3f}, grad {grad.norm().item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
