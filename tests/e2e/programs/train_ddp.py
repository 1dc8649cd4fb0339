"""A tiny DDP training run on the CPU (gloo): 2 ranks, a DataLoader with 2 workers per rank."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        x = torch.tensor([float(i)])
        return x, 2 * x


def train_step(model, optimizer, batch, step, rank):
    x, y = batch
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    if rank == 1 and step == 2:
        print(f"rank 1 at step 2, loss {loss.item():.3f}", flush=True)  # the breakpoint
    return loss.item()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Squares(), batch_size=8, num_workers=2)
    losses = [train_step(model, optimizer, batch, step, rank) for step, batch in enumerate(loader)]
    dist.barrier()
    print(f"rank {rank} done, {len(losses)} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
