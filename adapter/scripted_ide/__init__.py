"""An IDE played by a script: tether's small DAP client and the demo's attach sequence.

- :mod:`.dap_client`: a trio DAP client (the demo's IDE, the tests' and the benchmark's client);
- :mod:`.demo`: the scripted IDE of ``tether demo``.

Import the modules themselves (``adapter.scripted_ide.dap_client``...): this package's
``__init__`` imports nothing.
"""
