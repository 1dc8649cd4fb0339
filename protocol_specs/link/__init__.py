"""The relay link's two halves without sockets: the clients' state (link.py) and the relay's (relay.py)."""
