"""Issue 42's job, on the CPU (gloo): DDP over the ranks torchrun starts, a DataLoader with 2
workers per rank, a process group timeout of 10 s. Each training step ends waiting for every rank
in a Python loop around a non-blocking barrier (a rank blocked in a native collective pauses only
once it is back in Python), so a group pause lands at once; rank 2 stops in its step 2, after its
backward (the gradients are all-reduced: the same in every rank; each rank's loss is its own)."""

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Rows(Dataset):
    def __len__(self):
        return 128

    def __getitem__(self, i):
        x = torch.full((4,), float(i % 16))
        return x, x.sum(dim=0, keepdim=True)


def train_step(model, optimizer, batch, step, rank):
    x, y = batch
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()  # DDP all-reduces the gradients
    if rank == 2 and step == 2:
        print(f"rank 2 at step {step}, loss {loss.item():.3f}", flush=True)  # the breakpoint
    done = dist.barrier(async_op=True)  # every rank waits for the others here, in Python
    while not done.is_completed():
        time.sleep(0.01)
    done.wait()  # raises if the barrier failed (its timeout)
    optimizer.step()
    return loss.item()


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=10))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    data = Rows()
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2)
    losses = []
    for step, batch in enumerate(loader):
        losses.append(train_step(model, optimizer, batch, step, rank))
    dist.barrier()
    print(f"rank {rank} done, {len(losses)} steps, loss {losses[-1]:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
