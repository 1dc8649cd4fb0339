"""The commands of a run's life beyond its debugging: its outputs (``tether outputs``, ``tether
cp``) and preemption (``tether preempt``, ``pause``, ``resume``), for :mod:`.parser`."""

from __future__ import annotations

import argparse
from typing import Any

from .options import relay_flag
from .outputs import cmd_cp, cmd_outputs
from .runs import cmd_preempt, cmd_resume
from .settings import parse_duration

__all__ = ["lifecycle_commands", "outputs_commands"]


def outputs_commands(sub: argparse._SubParsersAction[Any]) -> None:
    """``tether outputs RUN`` and ``tether cp RUN:PATH [LOCAL]``."""
    s = sub.add_parser("outputs", help="list a run's outputs (--outputs): path, size, attempt")
    relay_flag(s)
    s.add_argument(
        "run", help="the run: its id, a unique prefix of it (4+ characters), or its name"
    )
    s.add_argument("--json", action="store_true", help="one JSON object: the run and its files")
    s.set_defaults(fn=cmd_outputs)

    s = sub.add_parser(
        "cp",
        help="fetch a run's outputs: tether cp RUN:out/model.pt . (a file, a directory of "
        "them, or RUN: for all), from the relay, also after the run's worker is gone",
    )
    relay_flag(s)
    s.add_argument("source", metavar="RUN:PATH", help="the run, a colon, an output's path")
    s.add_argument(
        "local", nargs="?", default=".", metavar="LOCAL", help="where to write (default .)"
    )
    s.add_argument("-q", "--quiet", action="store_true", help="print nothing when done")
    s.set_defaults(fn=cmd_cp)


def lifecycle_commands(sub: argparse._SubParsersAction[Any]) -> None:
    """``tether preempt``, ``pause`` and ``resume``."""
    for name, text in (
        ("preempt", "preempt a run's attempt: the program is warned (tether.should_preempt(), "
         "SIGUSR1) and ended after the grace; the run is queued again without using a retry"),
        ("pause", "preempt a run and hold it suspended (its slot or job freed) until tether resume"),
    ):  # fmt: skip
        s = sub.add_parser(name, help=text)
        relay_flag(s)
        s.add_argument("run", help="the run: its id, a unique prefix of it, or its name")
        s.add_argument(
            "--grace",
            type=parse_duration,
            metavar="DURATION",
            help="how long the program has to checkpoint and exit (default: the run's "
            "--preempt-grace)",
        )
        s.set_defaults(fn=cmd_preempt, suspend=name == "pause")

    s = sub.add_parser(
        "resume", help="queue the next attempt of a paused run, from its latest checkpoint"
    )
    relay_flag(s)
    s.add_argument("run", help="the run: its id, a unique prefix of it, or its name")
    s.add_argument(
        "--from-start",
        action="store_true",
        help="resume a run that has no checkpoint: its program starts again from step 0",
    )
    s.set_defaults(fn=cmd_resume)
