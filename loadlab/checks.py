"""The harness's lower-bound checks on settings and records, worded once.

``at_least`` refuses a value below its least sensible one with ``<name> must be >= <lo>, got
<value>`` plus, where there is one, what to do: a setting or a command-line flag raises
``ConfigError`` (``loadlab`` exits 2 with that line), a record's own ``__post_init__`` a plain
``ValueError``. Checks worded otherwise (a range, a hint before the value) stay where they are.
"""

from __future__ import annotations

__all__ = ["at_least"]


def at_least(
    name: str, value: float, lo: int, fix: str = "", *, error: type[ValueError] = ValueError
) -> None:
    """Raises ``error`` naming ``name``, ``lo`` and ``value`` (then ``fix``) when
    ``value < lo``.

    >>> from loadlab.errors import ConfigError
    >>> at_least("--batch", 8, 1, error=ConfigError)
    >>> at_least("turn", -1, 0)
    Traceback (most recent call last):
    ...
    ValueError: turn must be >= 0, got -1
    """
    if value < lo:
        raise error(f"{name} must be >= {lo}, got {value}{fix}")
