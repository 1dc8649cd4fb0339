"""A tiny training loop: linear regression by gradient descent, standard library only.

`tether demo` sets a breakpoint in `train_step` while this run is still queued.
"""

import random

from data import make_batches


def train_step(weights, bias, batch, lr):
    grad_w, grad_b = 0.0, 0.0
    for x, y in batch:
        error = weights * x + bias - y
        grad_w += 2 * error * x / len(batch)
        grad_b += 2 * error / len(batch)
    loss = sum((weights * x + bias - y) ** 2 for x, y in batch) / len(batch)
    weights -= lr * grad_w  # breakpoint: inspect the gradient before the update
    bias -= lr * grad_b
    return weights, bias, loss


def main():
    random.seed(0)
    weights, bias = 0.0, 0.0
    for epoch in range(3):
        for step, batch in enumerate(make_batches(n=64, batch_size=16)):
            weights, bias, loss = train_step(weights, bias, batch, lr=0.05)
        print(f"epoch {epoch}: loss={loss:.4f} w={weights:.3f} b={bias:.3f}")
    print("done")


if __name__ == "__main__":
    main()
