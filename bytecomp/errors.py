"""Errors a user can cause and fix: the CLI prints them as one line, no traceback."""


class BytecompError(Exception):
    """A problem with the user's input (a file, a spec, an option, a cluster).

    The message is complete on its own: it names the file, field or value at
    fault and says what would be valid.
    """


class SpecError(BytecompError, ValueError):
    """A compressor spec that cannot be parsed or has an invalid value."""
