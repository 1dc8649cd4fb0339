"""The web view as plain data: routes, the session cookie and its checks, and the SVG charts of metrics."""
