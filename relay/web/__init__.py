"""The web view: the relay's runs and debug sessions as pages, on the relay's own port.

- ``protocol_specs/web/web.py``: routes, cookies, CSRF and origin checks, list queries (sans-I/O);
- :mod:`.server`: the HTTP answers (``websockets``' ``process_request``);
- :mod:`.live`: the live WebSocket pushing changes to open pages;
- :mod:`.pages`: the HTML; :mod:`.listing`: a page of runs; :mod:`.sessions`: sessions, codes;
- ``static/``: the one stylesheet and the one script the pages load.

Import the modules themselves (``relay.web.server``...): this package's ``__init__`` imports
nothing, so that ``relay/control/`` can use :mod:`.sessions` without a cycle.
"""
