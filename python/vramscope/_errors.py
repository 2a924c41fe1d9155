"""The exceptions the Python API raises.

Every error of a vramscope function is one of: `TypeError` (an argument of the
wrong Python type), `ValueError` (a bad value the API refuses before the engine
sees it, such as a NUL byte in a path), or a subclass of `vramscope.Error`:
`InputError` (also a `ValueError`: the engine refused the input, with the
command line's one-line message) or `InternalError` (a defect in vramscope
itself; please report it). Nothing else escapes, and nothing takes the
interpreter down.
"""


class Error(Exception):
    """Base class of the errors the engine reports."""


class InputError(Error, ValueError):
    """The engine refused the input (the CLI's exit 2): a bad knob, model or file."""


class InternalError(Error):
    """A defect in vramscope (the CLI's exit 1): the message says what failed."""
