"""The user's side: the ``tether`` command and the local DAP adapter an IDE attaches to
(127.0.0.1 only)."""
