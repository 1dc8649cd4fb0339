"""Diagrams generated from the state tables: ``python -m protocol_specs.runs.diagrams [--check]``.

Writes ``docs/run-states.md`` (a Mermaid state diagram of :data:`protocol_specs.runs.runs.TRANSITIONS`);
with ``--check`` it only verifies that the file is current (a test runs that).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .runs import TERMINAL_STATES, TRANSITIONS, RunState

__all__ = ["run_states_markdown"]

TARGET = Path(__file__).resolve().parents[2] / "docs" / "run-states.md"


def run_states_markdown() -> str:
    lines = [
        "# Run states",
        "",
        "Generated from `protocol_specs/runs/runs.py` by `python -m protocol_specs.runs.diagrams`; do not edit.",
        "",
        "```mermaid",
        "stateDiagram-v2",
        f"    [*] --> {RunState.QUEUED.value}: submit",
    ]
    for (state, event), target in TRANSITIONS.items():
        lines.append(f"    {state.value} --> {target.value}: {event.value}")
    for state in sorted(TERMINAL_STATES):
        lines.append(f"    {state.value} --> [*]")
    lines += ["```", ""]
    lines.append("| state | meaning |")
    lines.append("|---|---|")
    doc = {
        RunState.QUEUED: "submitted (or retried after a failed, lost or preempted attempt), waiting for a worker",
        RunState.STARTING: "claimed by a worker: fetching files, starting the program",
        RunState.RUNNING: "the program's process is running (under debugpy in debug mode)",
        RunState.PAUSED: "debug mode: the program is stopped at a breakpoint, a step or an exception",
        RunState.SUCCEEDED: "exited with status 0",
        RunState.FAILED: "exited non-zero, or could not start",
        RunState.CANCELLED: "cancelled by the user",
        RunState.LOST: "the worker's lease expired or its scheduler job was lost (no retries left)",
        RunState.SUSPENDED: "paused by its user (`tether pause`): nothing runs until `tether resume`",
    }
    for state in RunState:
        lines.append(f"| `{state.value}` | {doc[state]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = run_states_markdown()
    if "--check" in argv:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET} is stale: run python -m protocol_specs.runs.diagrams", file=sys.stderr)
            return 1
        return 0
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
