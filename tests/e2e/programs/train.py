"""A tiny "training run" for the end-to-end tests (debugpy direct and through tether).

``python train.py [ok|crash|spin]``: ``ok`` trains and exits 0; ``crash`` ends in an uncaught
ZeroDivisionError (exit 1); ``spin`` then loops until a debugger sets ``keep_going`` to False.
The tests assert line numbers, function names and values here: append, never insert.
"""

import sys

from mathutils import checked_ratio, scale

HISTORY = []


def train_step(batch, lr):
    loss = 0.0
    for step, x in enumerate(batch):
        loss += scale(x, lr)
        HISTORY.append(step)
    stats = {"loss": loss, "steps": len(batch)}
    return stats


def evaluate(stats):
    try:
        return checked_ratio(stats["loss"], 0)
    except ZeroDivisionError as exc:
        return str(exc)


def spin():
    keep_going = True
    n = 0
    print("spinning", flush=True)
    while keep_going:
        n += 1
    return n


def main(argv):
    mode = argv[1] if len(argv) > 1 else "ok"
    batch = [1, 2, 3, 4]
    stats = train_step(batch, lr=0.5)
    print("loss", stats["loss"], flush=True)
    print("eval", evaluate(stats), flush=True)
    if mode == "spin":
        print("spun", spin() > 0, flush=True)
    if mode == "crash":
        checked_ratio(stats["steps"], 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
