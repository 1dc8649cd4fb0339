"""Synthetic data for train.py: y = 3x + 1 with a little noise."""

import random


def make_batches(n, batch_size):
    points = []
    for _ in range(n):
        x = random.uniform(-1, 1)
        points.append((x, 3 * x + 1 + random.gauss(0, 0.1)))
    return [points[i : i + batch_size] for i in range(0, n, batch_size)]
