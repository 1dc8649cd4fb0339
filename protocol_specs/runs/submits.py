"""Submitting a run exactly once, across lost answers and relay deaths.

Theory of operation
-------------------
A ``submit``'s answer can be lost: the link is cut, or the relay dies, after the relay wrote the
run's record and before the answer arrived; a relay can even die between writing the record and
putting the run in its queue. The submitter cannot tell that from a request that never arrived.

- *Named by the submitter.* A ``submit`` may carry a ``key`` the submitter chose at random
  (``protocol_specs/wire/tunnel_open.py``'s :func:`new_key`, 128 bits) and sends unchanged when it
  asks again. The relay names the run after the user and the key (:func:`run_id_for`): asked
  again, the same run is found and answered, never a second one made; another user's key never
  names it.
- *Finished by whoever comes next.* Before it writes anything of a new run, the relay notes the
  run in ``tether:submitting`` with a deadline (:data:`FINISH_AFTER`); after the run is in its
  queue, it takes the note off. A submit asked again for a run that is there finishes the steps
  (each is idempotent: indexes, the queue entry, which a claim skips if it is one too many); a
  note past its deadline is finished by any relay's sweep, whether or not anyone asks again:
  the run is queued, or, if its snapshot's manifest was never kept, ended ``failed`` saying so.
  A run is never left ``queued`` with nothing in its queue.
"""

from __future__ import annotations

import hashlib

__all__ = ["FINISH_AFTER", "run_id_for"]

#: how long a relay has to finish a submit before any relay's sweep finishes it (seconds)
FINISH_AFTER = 30.0


def run_id_for(user: str, key: str) -> str:
    """The id of the run ``user``'s submit ``key`` makes (the same for every retry of it)."""
    return hashlib.sha256(f"{user}\0submit\0{key}".encode()).hexdigest()[:14]
