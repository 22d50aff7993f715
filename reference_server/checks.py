"""The server's lower-bound checks on its settings, worded once.

Every size, count and limit the server is built from has a least sensible value (a KV cache
needs a block, a scheduler a sequence slot, a model one layer); ``at_least`` refuses one below
it with ``ValueError("<name> must be >= <lo>, got <value>")`` plus, where there is one, the fix.
The server stands alone (it never imports ``loadlab``), so ``loadlab`` words its own checks.
"""

from __future__ import annotations

__all__ = ["at_least"]


def at_least(name: str, value: float, lo: int, fix: str = "") -> None:
    """Raises ``ValueError`` naming ``name``, ``lo`` and ``value`` (then ``fix``) when
    ``value < lo``.

    >>> at_least("block_size", 16, 1)
    >>> at_least("num_blocks", 0, 1, "; raise the KV budget")
    Traceback (most recent call last):
    ...
    ValueError: num_blocks must be >= 1, got 0; raise the KV budget
    """
    if value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}{fix}")
