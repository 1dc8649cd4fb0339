"""What the user is shown outside the IDE: the CLI's text and desktop notifications.

- :mod:`.render`: the tables, status lines, sizes and ages the CLI prints (pure text);
- :mod:`.notify`: a desktop notification when the program pauses with no IDE attached.

Import the modules themselves (``adapter.show.render``...): this package's ``__init__`` imports
nothing.
"""
