"""Plain data for the JSON files loadlab writes: a record's attributes by name, in order.

A ``to_dict`` that spells ``"peak_rps": self.peak_rps`` for each key writes every name twice;
``pick`` takes the names once (space-separated, as ``namedtuple`` does) and keeps their order,
which is the order of the keys in the file. Keys that are not an attribute as it is (a nested
record's ``to_dict``, a tuple written as a list, a renamed key) stay spelled out beside it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["pick"]


def pick(obj: object, names: str) -> dict[str, Any]:
    """``{name: obj.name}`` for each space-separated name, in the order given.

    >>> from types import SimpleNamespace
    >>> pick(SimpleNamespace(a=1, b="x", c=None), "b a")
    {'b': 'x', 'a': 1}
    """
    return {name: getattr(obj, name) for name in names.split()}
