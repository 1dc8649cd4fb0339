"""The relay client is a client: importing it loads none of the relay server's modules."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_relay_client_imports_nothing_of_the_server() -> None:
    probe = (
        "import json, sys, relay.client; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'relay')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, check=True, text=True)
    loaded = json.loads(done.stdout)
    assert loaded, "relay.client was not imported"
    assert [m for m in loaded if m != "relay" and not m.startswith("relay.client")] == []
