"""The Debug Adapter Protocol as tether speaks it: the framing, typed messages, the official schema (vendored) and the capabilities the adapter answers with."""
