"""``torch.distributed.breakpoint(rank=1)`` in a debug run (gloo on the CPU): every rank calls it,
rank 1 stops in the debugger at the line after it, and the job ends once continued."""

import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    value = 10 * (rank + 1)
    dist.breakpoint(rank=1)
    value += 1  # after torch.distributed.breakpoint()
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    print(f"rank {rank} done, values {values}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
