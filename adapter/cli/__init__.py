"""The ``tether`` command line, and the composition root: the one place that starts the relay, the
worker pool and the adapter together (the rest of ``adapter`` is a client of the relay).

Rooms, from the entry point down (each imports only the ones after it):

- ``main``: ``main()``: runs a command, turns how it ended into an exit code and one line;
- ``parser``: the command tree; ``options``: the option groups commands share;
- ``service``: ``up``, ``relay``, ``worker``, ``backend``; ``runs``: ``run``, ``debug``,
  ``attach``, ``logs``, ``rerun``, ``cancel``, ``ls``, ``status``; ``admin``: ``token``,
  ``audit``; ``demo``: ``demo``;
- ``local_stack``: the embedded stack (bundled server, relay, worker pool) of ``up`` and ``demo``;
- ``submission``: the run spec from the arguments, the snapshot upload and the submission;
- ``settings``: the tether home, the relay endpoint, value parsers, TLS; ``errors``: a relay's
  refusal as one line.

What is shown is text from :mod:`adapter.show.render`.

Commands import the relay server, the worker pool, the adapter and the snapshot builder inside
their functions, not at the top: every ``tether`` invocation imports every command module (the
parser names them), and ``tether ls`` should not pay for what ``tether up`` runs. (The parser
itself reads ``relay.config.RelayConfig``, a dataclass, for the relay options' defaults.)
"""

from .quiet_start import hold

hold()  # a Ctrl-C while what follows loads ends tether quietly (main() releases it)

from .main import main  # noqa: E402

__all__ = ["main"]
