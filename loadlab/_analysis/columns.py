"""Records as columns: one numpy array per field, so a run of a million requests is read,
checked and summarised in seconds and a few hundred MB (as ``RequestRecord`` objects it took
minutes and gigabytes).

``RecordColumns`` holds every field of every record: numbers in int64 arrays (``NONE`` where
a field is None), token chunks flattened with each record's start offset, text as lists.
``record(i)`` gives one ``RequestRecord`` back, equal to the one written. The per-request
metrics of ``loadlab._analysis.metrics`` have column forms in ``loadlab._analysis.vectors``
that give the same values, bit for bit.

Built two ways: ``from_records`` (a run in memory) and ``from_dicts`` (records parsed from a
results file), which also checks them: the JSON type of every field, as
``RequestRecord.from_dict`` does, and the values ``loadlab.records.impossible`` refuses. A
check that fails names the first record it fails on, with the same message the per-record
path gives.

Example::

    cols = RecordColumns.from_records(results.records)
    cols.n, cols.ints["sent_ns"][:3], cols.record(0).request_id
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from itertools import chain, compress, repeat
from operator import attrgetter, itemgetter
from typing import Any, overload

import msgspec
import numpy as np
import orjson

from loadlab._analysis.metrics import NS_PER_MS
from loadlab.records import (
    COUNT_FIELDS,
    LEFT_OUT_AT_DEFAULT,
    OUTCOME_OK,
    TIME_FIELDS,
    RequestRecord,
    impossible,
    is_failed,
    known_outcome,
)

__all__ = [
    "NONE",
    "Part",
    "RecordColumns",
    "RecordView",
    "TextColumn",
    "Unparsed",
    "columns_of",
    "part_of",
]

NONE = np.iinfo(np.int64).min  # an int field that is None (no record time or count is this)

# Field kinds. Every RequestRecord field is in exactly one (``_check_layout`` below).
_OPT_INTS = (
    "intended_ns", "sent_ns", "headers_ns", "end_ns", "http_status",
    "prompt_tokens_requested", "prompt_tokens", "cached_prompt_tokens", "shared_prefix_tokens",
    "max_tokens", "output_tokens", "answer_ns", "reasoning_start_ns", "reasoning_end_ns",
    "reasoning_tokens", "inputs", "images", "image_pixels", "audio_clips", "audio_ms",
)  # fmt: skip
_INTS = ("turn", "worker", "output_tokens_chunks", "reasoning_chunks", "tool_call_chunks",
         "tool_calls")  # fmt: skip
_BOOLS = ("output_tokens_disagree", "late", "streamed")
_CODED = ("outcome", "request_class", "endpoint", "output_tokens_source", "finish_reason", "host")
_TEXT = ("request_id", "session_id", "error", "response_id")
_LISTS = ("chunk_ns", "chunk_tokens")
_TYPES: dict[str, frozenset[type]] = {
    **{f: frozenset({int, type(None)}) for f in _OPT_INTS},
    **{f: frozenset({int}) for f in _INTS},
    **{f: frozenset({bool}) for f in _BOOLS},
    **{f: frozenset({str}) for f in ("outcome", "request_class", "endpoint", "request_id")},
    "output_tokens_source": frozenset({str}),
    **{f: frozenset({str, type(None)}) for f in ("finish_reason", "session_id", "error", "host")},
    "response_id": frozenset({str, type(None)}),
    **{f: frozenset({list}) for f in _LISTS},
    "server": frozenset({dict}),
}
_FIELDS = tuple(f.name for f in dataclasses.fields(RequestRecord))
_DEFAULTS: dict[str, Any] = {  # what a field left out of a file holds (request_id: none)
    f.name: f.default_factory() if callable(f.default_factory) else f.default
    for f in dataclasses.fields(RequestRecord)
}
_DEFAULTS["request_id"] = None


def _check_layout() -> None:
    kinds = (*_OPT_INTS, *_INTS, *_BOOLS, *_CODED, *_TEXT, *_LISTS, "server")
    if sorted(kinds) != sorted(_FIELDS):  # a field added to RequestRecord must be placed here
        raise RuntimeError(f"RecordColumns does not know fields {set(_FIELDS) ^ set(kinds)}")


_check_layout()


class RecordColumns:
    """Every field of ``n`` records as columns (module docstring)."""

    def __init__(
        self,
        ints: Mapping[str, np.ndarray],
        coded: Mapping[str, tuple[np.ndarray, tuple[Any, ...]]],
        text: Mapping[str, TextColumn],
        server: Mapping[int, dict[str, Any]],
        lists: Mapping[str, tuple[np.ndarray, np.ndarray]],
    ) -> None:
        self.ints = dict(ints)  # name -> int64 [n] (NONE: None); bools as 0/1
        self.coded = dict(coded)  # name -> (codes int32 [n], levels)
        self.text = dict(text)  # name -> [n] str | None (one string each, packed)
        self.server = dict(server)  # record index -> its non-empty ``server`` dict
        self.lists = dict(lists)  # name -> (start offsets int64 [n + 1], values int64)
        self.n = len(self.text["request_id"])

    def kept(self, name: str, make: Callable[[], Any]) -> Any:
        """A derived column made once (``make()``), kept until ``forget(name)``."""
        if name not in self.__dict__:
            self.__dict__[name] = make()
        return self.__dict__[name]

    def forget(self, *names: str) -> None:
        """Drop derived columns kept since first asked for (``gaps`` holds 180 MB for a
        million streams); they are made again when asked for."""
        for name in names:
            self.__dict__.pop(name, None)

    # ---------------------------------------------------------------- building

    @classmethod
    def from_records(cls, records: Iterable[RequestRecord]) -> RecordColumns:
        """Columns of records in memory (a run just made); nothing is checked."""
        recs = list(records)
        build = _Builder()
        build.add(Part({f: list(map(attrgetter(f), recs)) for f in _FIELDS}))
        return build.columns()

    @classmethod
    def from_dicts(
        cls,
        batches: Iterable[Sequence[Any] | bytes | Callable[[], bytes]],
        bounds: tuple[int, int] | None = None,
        map_parts: Callable[..., Iterable[Part]] = map,
        total_bytes: int | None = None,
    ) -> RecordColumns:
        """Columns of records parsed from JSON, checked as ``RequestRecord.from_dict`` checks
        one record, and against ``impossible`` (with ``bounds``: every time within [lo, hi]
        ns); raises ``ValueError`` naming the first record that fails.

        Each batch is a list of parsed records, or the bytes of records as loadlab writes
        them (``{...},{...}``, compact, in ``to_dict``'s order) or what reads them when
        called (a span of a file): those are parsed here, their
        token chunk lists straight into arrays (``part_of``); bytes that are not records raise
        ``Unparsed``. ``map_parts(part_of, batches)`` may run ``part_of`` in other processes
        (a pool's bounded map): the parts come back in order. ``total_bytes``: the size of
        all the record bytes, to size the columns once from the first batch."""
        build = _Builder(total_bytes)
        for part in map_parts(part_of, batches):
            build.add(part)
        cols = build.columns()
        cols.check(bounds)
        return cols

    def check(self, bounds: tuple[int, int] | None = None) -> None:
        """``ValueError`` naming the first record with an impossible value (``impossible``),
        or, with ``bounds``, a time outside [lo, hi] ns."""
        bad = np.zeros(self.n, dtype=bool)
        codes, levels = self.coded["outcome"]
        unknown = [i for i, v in enumerate(levels) if not known_outcome(v)]
        bad |= np.isin(codes, unknown)
        for f in COUNT_FIELDS:
            v = self.ints[f]
            bad |= (v < 0) & (v != NONE)
        starts, counts = self.lists["chunk_tokens"]
        if counts.size and counts.min() < 0:  # rare: find whose
            owner = np.repeat(np.arange(self.n), np.diff(starts))
            bad[owner[counts < 0]] = True
        bad |= self._chunks_go_back()
        for a, b in ((self.sent, self.end), (self.sent, self.first_chunk),
                     (self.last_chunk, self.end), (self.sent, self.ints["headers_ns"])):  # fmt: skip
            bad |= (a != NONE) & (b != NONE) & (a > b)
        if bounds is not None:  # chunks in order: the first and last bound them all
            lo, hi = bounds
            for v in (*(self.ints[f] for f in TIME_FIELDS), self.first_chunk, self.last_chunk):
                bad |= (v != NONE) & ((v < lo) | (v > hi))
        self.forget("chunk_owner", "same_stream")  # 80 MB a million streams, until needed
        if bad.any():
            i = int(np.argmax(bad))
            why = impossible(self.record(i), bounds)
            raise ValueError(why or f"record {self.text['request_id'][i]!r} is not valid")

    def _chunks_go_back(self) -> np.ndarray:
        """bool [n]: records with a chunk read before the one before it (4 M chunks at a
        time: the differences of all of them at once would be another 128 MB)."""
        bad = np.zeros(self.n, dtype=bool)
        ns, owner, same = self.lists["chunk_ns"][1], self.chunk_owner, self.same_stream
        for at in range(0, same.size, 1 << 22):
            back = np.diff(ns[at : at + (1 << 22) + 1]) < 0
            back &= same[at : at + (1 << 22)]
            bad[owner[at + 1 : at + 1 + back.size][back]] = True
        return bad

    # ---------------------------------------------------------------- records back

    def record(self, i: int) -> RequestRecord:
        """Record ``i`` as it was written."""
        fields: dict[str, Any] = {}
        for f in _OPT_INTS:
            v = int(self.ints[f][i])
            fields[f] = None if v == NONE else v
        for f in _INTS:
            fields[f] = int(self.ints[f][i])
        for f in _BOOLS:
            fields[f] = bool(self.ints[f][i])
        for f in _CODED:
            codes, levels = self.coded[f]
            fields[f] = levels[codes[i]]
        for f in _TEXT:
            fields[f] = self.text[f][i]
        for f in _LISTS:
            starts, vals = self.lists[f]
            fields[f] = vals[starts[i] : starts[i + 1]].tolist()
        fields["server"] = dict(self.server.get(i, {}))
        return RequestRecord(**fields)

    def __len__(self) -> int:
        return self.n

    # ---------------------------------------------------------------- common columns

    def mask(self, field: str, values: Iterable[Any]) -> np.ndarray:
        """bool [n]: the records whose coded ``field`` is one of ``values``."""
        codes, levels = self.coded[field]
        wanted = set(values)
        return np.isin(codes, [i for i, v in enumerate(levels) if v in wanted])

    def where(self, field: str, test: Any) -> np.ndarray:
        """bool [n]: the records whose coded ``field`` passes ``test(value)``."""
        codes, levels = self.coded[field]
        return np.isin(codes, [i for i, v in enumerate(levels) if test(v)])

    @cached_property
    def ok(self) -> np.ndarray:
        return self.mask("outcome", [OUTCOME_OK])

    @cached_property
    def failed(self) -> np.ndarray:
        return self.where("outcome", is_failed)

    @property
    def sent(self) -> np.ndarray:
        return self.ints["sent_ns"]

    @property
    def end(self) -> np.ndarray:
        return self.ints["end_ns"]

    @cached_property
    def n_chunks(self) -> np.ndarray:
        return np.diff(self.lists["chunk_ns"][0])

    @cached_property
    def first_chunk(self) -> np.ndarray:
        """int64 [n]: each record's first token chunk (NONE: no chunk)."""
        starts, ns = self.lists["chunk_ns"]
        has = self.n_chunks > 0
        out = np.full(self.n, NONE, dtype=np.int64)
        out[has] = ns[starts[:-1][has]]
        return out

    @cached_property
    def last_chunk(self) -> np.ndarray:
        starts, ns = self.lists["chunk_ns"]
        has = self.n_chunks > 0
        out = np.full(self.n, NONE, dtype=np.int64)
        out[has] = ns[starts[1:][has] - 1]
        return out

    @cached_property
    def chunk_owner(self) -> np.ndarray:
        """int32 [chunks]: the record each token chunk belongs to."""
        return np.repeat(np.arange(self.n, dtype=np.int32), self.n_chunks)

    @cached_property
    def gap_mask(self) -> np.ndarray:
        """bool [chunks - 1]: chunk j + 1 follows chunk j in a streamed answer (a gap of its
        ITL; a request not streamed has none: ``metrics.itl_ms``)."""
        streamed = self.ints["streamed"]
        if streamed.strides == (0,) and (not streamed.size or streamed[0]):
            return self.same_stream
        return self.same_stream & streamed.astype(bool)[self.chunk_owner[1:]]

    @property
    def gap_counts(self) -> np.ndarray:
        """int64 [n]: each record's gaps (``gaps`` holds them record after record)."""
        return np.where(self.ints["streamed"] != 0, np.maximum(self.n_chunks - 1, 0), 0)

    @cached_property
    def gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """Every gap between consecutive token chunks of a stream (ms, as ``metrics.itl_ms``:
        the int difference, then one division), and the record of each (int32)."""
        ns, inner = self.lists["chunk_ns"][1], self.gap_mask  # gap j: chunk j to j + 1
        gaps = np.empty(int(np.count_nonzero(inner)))
        done = 0
        for at in range(0, inner.size, 1 << 22):  # 4 M at a time: no 128 MB of differences
            block = np.diff(ns[at : at + (1 << 22) + 1])[inner[at : at + (1 << 22)]]
            gaps[done : done + block.size] = block / NS_PER_MS
            done += block.size
        return gaps, self.chunk_owner[1:][inner]

    @cached_property
    def same_stream(self) -> np.ndarray:
        """bool [chunks - 1]: chunk j + 1 is of the same record as chunk j (a gap of a stream)."""
        owner = self.chunk_owner
        return np.asarray(owner[1:] == owner[:-1], dtype=bool)

    @cached_property
    def output_tokens(self) -> np.ndarray:
        """int64 [n]: ``metrics.output_token_count`` of each record (usage, else the chunks'
        own counts, else one a chunk)."""
        usage = self.ints["output_tokens"]
        starts, counts = self.lists["chunk_tokens"]
        size = np.diff(starts)
        split = self.n_chunks.copy()  # no counts: one a chunk
        if _constant(counts):  # one count everywhere (a token a chunk): no sums to make
            split[size > 0] = counts[0] * size[size > 0]
        elif counts.size:
            given = np.flatnonzero(size > 0)
            split[given] = np.add.reduceat(counts, starts[given])
        return np.where(usage != NONE, usage, split).astype(np.int64)

    @cached_property
    def chunk_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """``metrics.chunk_token_counts`` of every chunk: (tokens int64 [chunks], known bool
        [n]); where a record's split is not known (known False) its chunks hold 1."""
        starts, counts = self.lists["chunk_tokens"]
        own = (np.diff(starts) == self.n_chunks) & (self.n_chunks > 0)
        chunks = self.lists["chunk_ns"][1].size
        known = own | (self.output_tokens == self.n_chunks)
        if (_constant(counts) and counts[0] == 1) or not own.any():  # a token a chunk
            return np.broadcast_to(np.int32(1), (chunks,)), known
        tokens = np.ones(chunks, dtype=np.int32)
        if own.any():  # a record's own counts, one per chunk: the same positions in both
            tokens[own[self.chunk_owner]] = counts[
                own[np.repeat(np.arange(self.n), np.diff(starts))]
            ]
        return tokens, known


def _constant(a: np.ndarray) -> bool:
    """A column that holds one value everywhere (``_Grow`` made it a view of that value)."""
    return a.size > 0 and a.strides == (0,)


class RecordView(Sequence[RequestRecord]):
    """The records of ``columns`` as a read-only sequence (``Results.records`` of a file read
    from disk): each ``RequestRecord`` is built when asked for, so a million records cost
    their columns, not a million objects. Change a record of a list, not of this: ``list()``
    it first."""

    def __init__(self, columns: RecordColumns) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return self.columns.n

    @overload
    def __getitem__(self, i: int) -> RequestRecord: ...

    @overload
    def __getitem__(self, i: slice) -> list[RequestRecord]: ...

    def __getitem__(self, i: int | slice) -> RequestRecord | list[RequestRecord]:
        if isinstance(i, slice):
            return [self.columns.record(j) for j in range(*i.indices(self.columns.n))]
        if not -self.columns.n <= i < self.columns.n:
            raise IndexError("record index out of range")
        return self.columns.record(i % self.columns.n)

    def __iter__(self) -> Iterator[RequestRecord]:
        return map(self.columns.record, range(self.columns.n))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def columns_of(records: Sequence[RequestRecord]) -> RecordColumns:
    """The columns of ``records``: their own when read from a file (``RecordView``), else
    built now (records in memory may have changed since any earlier call)."""
    if isinstance(records, RecordView):
        return records.columns
    return RecordColumns.from_records(records)


def _values(batch: Sequence[Any]) -> dict[str, list[Any]]:
    """Each field's values over the batch (its default where a record leaves it out; None
    for what is not a record at all, which ``_check_types`` then names)."""
    return {
        f: [d.get(f, _DEFAULTS[f]) if type(d) is dict else None for d in batch] for f in _FIELDS
    }


def _check_types(
    batch: Sequence[Any],
    values: Mapping[str, list[Any]],
    keys_known: bool = False,
    lists: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> None:
    """Each value of the JSON type its field takes (what ``RequestRecord.from_dict`` checks,
    a batch at a time); on any doubt the per-record check names the record and the field.
    ``keys_known``: every record holds exactly the fields ``to_dict`` writes; ``lists``: the
    chunk lists read apart (``_cut``), put back into each record that is checked."""
    ok = keys_known or (
        set(map(type, batch)) <= {dict}
        and set(chain.from_iterable(batch)) <= set(_FIELDS)
        and all(("request_id" in d and "outcome" in d) for d in batch)
    )
    ok = ok and all(set(map(type, values[f])) <= _TYPES[f] for f in _FIELDS)
    ok = ok and all(set(map(type, chain.from_iterable(values[f]))) <= {int} for f in _LISTS)
    if not ok:
        split = {
            f: np.split(vals, np.cumsum(lens)[:-1]) for f, (lens, vals) in (lists or {}).items()
        }
        for i, d in enumerate(batch):
            # raises naming the record and the field
            RequestRecord.from_dict({**d, **{f: split[f][i].tolist() for f in split}})
        raise ValueError("a record is not valid")


class Unparsed(Exception):
    """Bytes given as records are not a list of JSON records (a cut in the wrong place)."""


# Written by ``to_dict``: the two chunk lists side by side, of plain digits. ``_cut`` cuts
# them out and reads them with numpy (which stops a number past int64 at its largest: such a
# window goes the way of JSON, which names it); JSON parses the rest.
_LIST_PAIR = re.compile(rb'"chunk_ns":\[([0-9,]*)\],"chunk_tokens":\[([0-9,]*)\]')
_INT64_MAX = np.iinfo(np.int64).max
_PLACEHOLDER = b'"chunk_ns":0,"chunk_tokens":0'  # 0: a cached int, no list made per record
_RECORD_START = b'{"request_id":'
_WRITTEN = tuple(f for f in _FIELDS if f not in LEFT_OUT_AT_DEFAULT)  # fields always written


def _cut(raw: bytes) -> tuple[bytes, dict[str, tuple[np.ndarray, np.ndarray]] | None]:
    """``raw`` with each record's chunk-list pair put back as ``_PLACEHOLDER``, and the lists
    as (lengths, values) arrays, when every record has its pair as loadlab writes it (else
    ``raw`` as given and None: the lists are left for JSON)."""
    parts = _LIST_PAIR.split(raw)
    pairs = (len(parts) - 1) // 3
    if not pairs or pairs != raw.count(_RECORD_START):
        return raw, None
    return _PLACEHOLDER.join(parts[0::3]), {
        f: _numbers(parts[1 + k :: 3]) for k, f in enumerate(_LISTS)
    }


def _record_struct() -> type[msgspec.Struct]:
    """A record as its JSON types (``_TYPES``; a bool is not an int, an int not a bool), each
    field left out holding its default; the chunk lists as their JSON text (``_raw_lists``
    reads them)."""
    kinds: dict[type, Any] = {int: int, bool: bool, str: str, dict: dict[str, Any]}
    fields: list[Any] = []
    for f in _FIELDS:
        if f in _LISTS:
            fields.append((f, msgspec.Raw, _EMPTY_LIST))
            continue
        (kind,) = _TYPES[f] - {type(None)}
        t = kinds[kind] | None if type(None) in _TYPES[f] else kinds[kind]
        if f in ("request_id", "outcome"):  # what ``RequestRecord.from_dict`` requires
            fields.append((f, t))
        else:
            default = _DEFAULTS[f]
            fields.append((f, t, msgspec.field(default_factory=dict) if f == "server" else default))
    # gc=False: a batch's records are never in a cycle, and the collector need not walk them
    return msgspec.defstruct("_Record", fields, kw_only=True, forbid_unknown_fields=True, gc=False)


_EMPTY_LIST = msgspec.Raw(b"[]")
_DECODE_RECORDS = msgspec.json.Decoder(list[_record_struct()])  # type: ignore[misc]
_NOT_DIGITS = b"0123456789,[]"  # what a list of plain non-negative integers is made of
_BRACKETS = bytes.maketrans(b"[]", b" ,")  # "[1,2][3]" -> " 1,2, 3,": one list of numbers


def _typed_part(raw: bytes) -> Part | None:
    """The records of ``raw`` (``{...},{...}``) decoded straight into their JSON types, as a
    ``Part``; None on anything it refuses (a type, a field, a number past int64, a chunk list
    that is not plain integers, bytes that are not records): ``_parse`` then reads them and
    names the problem."""
    try:
        records = _DECODE_RECORDS.decode(b"[" + raw + b"]")
    except msgspec.MsgspecError:
        return None
    n = len(records)
    try:
        lists = {f: _raw_lists(list(map(attrgetter(f), records))) for f in _LISTS}
        ints = {f: _typed_ints(records, f) for f in (*_OPT_INTS, *_INTS, *_BOOLS)}
    except (Unparsed, ValueError):  # a list of something else; a number past int64
        return None
    part = Part.__new__(Part)
    part.n, part.ints, part.lists, part.nbytes = n, ints, lists, 0
    part.codes = {f: _encode(list(map(attrgetter(f), records))) for f in _CODED}
    part.text = {f: _pack(list(map(attrgetter(f), records))) for f in _TEXT}
    part.server = {i: r.server for i, r in enumerate(records) if r.server}
    return part


def _typed_ints(records: list[Any], field: str) -> np.ndarray:
    """A field's int64 column (NONE for None) from decoded records: straight from the
    records, unless a None is among them."""
    try:
        return np.fromiter(map(attrgetter(field), records), np.int64, len(records))
    except TypeError:  # a None
        return _ints(list(map(attrgetter(field), records)))
    except OverflowError:
        raise ValueError(field) from None


def _raw_lists(raws: list[msgspec.Raw]) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, values) of each record's list as JSON text (valid JSON: the decoder checked
    it); ``Unparsed`` unless every one is a flat list of integers within int64."""
    joined = b"".join(raws)
    n = len(raws)
    if joined.translate(None, _NOT_DIGITS) or joined.count(b"[") != n:
        raise Unparsed  # a string, a float, a negative number, a nested list
    sizes = np.fromiter(map(len, raws), np.int64, n)
    starts = np.cumsum(sizes) - sizes
    text = np.frombuffer(joined, np.uint8)
    if n and (text[starts] != ord("[")).any():
        raise Unparsed  # a bare number, and so a list holding a list
    commas = joined.count(b",")
    full = sizes > 2
    total = commas + int(np.count_nonzero(full))  # a list's numbers: its commas, and one more
    if len(joined) - 2 * n - commas == total:  # one digit a number ("[1,1,1]": chunk_tokens)
        digits = text - np.uint8(ord("0"))  # a comma or bracket wraps past 9
        return (sizes - 1) // 2, digits[digits < 10].astype(np.int64)
    lens = np.diff(np.searchsorted(np.flatnonzero(text == ord(",")), starts), append=commas)
    lens += full
    if not full.all():
        joined = b"".join(compress(raws, full.tolist()))
    values = np.fromstring(joined.translate(_BRACKETS)[:-1], dtype=np.int64, sep=",")
    if values.size != total or values.max() == _INT64_MAX:  # numpy stops past int64 there
        raise Unparsed
    return lens, values


def _parse(
    raw: bytes, lists: dict[str, tuple[np.ndarray, np.ndarray]] | None
) -> tuple[dict[str, list[Any]], dict[str, tuple[np.ndarray, np.ndarray]] | None]:
    """The field values of the records in ``raw`` (``{...},{...}``, cut by ``_cut``),
    type-checked, and ``lists`` (None: the lists are among the values)."""
    try:
        batch = orjson.loads(b"[" + raw + b"]")
    except orjson.JSONDecodeError:
        raise Unparsed from None
    if not all(type(d) is dict for d in batch):
        raise Unparsed
    if lists is None:
        values = _values(batch)
        _check_types(batch, values)
        return values, None
    if lists["chunk_ns"][0].size != len(batch):
        raise Unparsed
    # as to_dict writes them, each record holds exactly these fields: one pass a field
    written = set(map(len, batch)) == {len(_WRITTEN)}
    try:
        values = {f: list(map(itemgetter(f), batch)) for f in _WRITTEN} if written else {}
    except KeyError:
        written = False
    if written:
        values.update({f: [_DEFAULTS[f]] * len(batch) for f in LEFT_OUT_AT_DEFAULT})
    else:
        values = _values(batch)
    if any(set(values[f]) != {0} for f in _LISTS):
        raise Unparsed  # a record's pair was not where its placeholder is
    for f in _LISTS:
        values[f] = [[]] * len(batch)  # read into ``lists``; the type check sees lists
    _check_types(batch, values, keys_known=written, lists=lists)
    return values, lists


def _numbers(groups: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, values) of comma-separated digit lists, one per record."""
    commas = np.fromiter(map(bytes.count, groups, repeat(b",")), np.int64, len(groups))
    lens = commas + np.fromiter(map(bool, groups), bool, len(groups))
    joined = b",".join(filter(None, groups))
    try:
        values = np.fromstring(joined, dtype=np.int64, sep=",") if joined else np.zeros(0, np.int64)
    except ValueError:  # ",," or a list that starts with a comma: not JSON's
        raise Unparsed from None
    if values.size != lens.sum() or (values.size and values.max() == _INT64_MAX):
        raise Unparsed
    return lens, values


def part_of(batch: Sequence[Any] | bytes | Callable[[], bytes]) -> Part:
    """One batch of records (parsed, their bytes, or what reads their bytes: a span of a
    file) as checked columns (``from_dicts``)."""
    if callable(batch):
        batch = batch()
    if isinstance(batch, bytes):
        try:
            part = _typed_part(batch) or Part(*_parse(*_cut(batch)))
        except ValueError as exc:
            # orjson reads an integer past 64 bits as a float, which the check calls a wrong
            # type; Python's parser keeps it whole, and the message says what it is
            try:
                parsed = json.loads(b"[" + batch + b"]")
            except ValueError:
                raise exc from None
            part_of(parsed)
            raise
        part.nbytes = len(batch)
        return part
    values = _values(batch)
    _check_types(batch, values)
    return Part(values)


class Part:
    """The columns of one batch of records: what a process that parsed it sends back."""

    def __init__(
        self,
        values: Mapping[str, list[Any]],
        lists: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        """``values[field]``: a list per field; ``lists``: (lengths, values) of the chunk
        lists when ``_parse`` read them already (else they are in ``values``)."""
        self.n = len(values["request_id"])
        try:
            self.ints = {f: _ints(values[f]) for f in (*_OPT_INTS, *_INTS, *_BOOLS)}
        except ValueError:
            raise ValueError(_too_large(values)) from None
        self.codes = {f: _encode(values[f]) for f in _CODED}
        self.text = {f: _pack(values[f]) for f in _TEXT}
        if lists is None:
            try:
                lists = {
                    f: (
                        np.fromiter(map(len, values[f]), np.int64, self.n),
                        _ints(list(chain.from_iterable(values[f]))),
                    )
                    for f in _LISTS
                }
            except ValueError:
                raise ValueError(_too_large(values)) from None
        self.lists = dict(lists)
        self.server = {i: d for i, d in enumerate(values["server"]) if d}
        self.nbytes = 0  # the bytes it was parsed from (0: parsed already)

    def __getstate__(self) -> dict[str, Any]:
        """Sent to the reading process with each column of one value as that value (most of
        a run's are: a piece's columns cross a pipe at half their size)."""
        state = dict(self.__dict__)
        state["ints"] = {f: _Same.of(a) for f, a in self.ints.items()}
        state["lists"] = {f: (_Same.of(a), _Same.of(b)) for f, (a, b) in self.lists.items()}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["ints"] = {f: _Same.back(a) for f, a in state["ints"].items()}
        state["lists"] = {f: (_Same.back(a), _Same.back(b)) for f, (a, b) in state["lists"].items()}
        self.__dict__.update(state)


@dataclasses.dataclass(frozen=True)
class _Same:
    """An int column of ``n`` equal values, as sent between processes."""

    value: int
    n: int

    @staticmethod
    def of(a: np.ndarray) -> np.ndarray | _Same:
        return _Same(int(a[0]), a.size) if a.size > 1 and not (a != a[0]).any() else a

    @staticmethod
    def back(a: np.ndarray | _Same) -> np.ndarray:
        """The column again, as a view of one value (``_Grow`` reads it, never writes it)."""
        if isinstance(a, _Same):
            return np.broadcast_to(np.int64(a.value), (a.n,))
        return a


class TextColumn(Sequence["str | None"]):
    """A text field of every record in one string: the ``n`` values laid end to end with
    each one's length (-1: None). A million request ids are one object, not a million (and
    the heap the parser left them scattered in can be given back)."""

    def __init__(self, chars: str, lens: np.ndarray) -> None:
        self.chars, self.lens = chars, lens
        self.starts = np.concatenate([[0], np.cumsum(np.maximum(lens, 0))])

    def __len__(self) -> int:
        return int(self.lens.size)

    @overload
    def __getitem__(self, i: int) -> str | None: ...

    @overload
    def __getitem__(self, i: slice) -> list[str | None]: ...

    def __getitem__(self, i: int | slice) -> str | list[str | None] | None:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        size = int(self.lens[i])
        if size < 0:
            return None
        at = int(self.starts[i % len(self)])
        return self.chars[at : at + size]

    def given(self) -> np.ndarray:
        """bool [n]: the records whose value is a non-empty string."""
        return np.asarray(self.lens > 0)


def _pack(values: list[Any]) -> tuple[str, np.ndarray]:
    """(the values' text end to end, each one's length or -1 for None)."""
    n = len(values)
    if values.count(None) == n:
        return "", np.full(n, -1, dtype=np.int64)
    if None not in values:
        return "".join(values), np.fromiter(map(len, values), np.int64, n)
    lens = np.fromiter((-1 if v is None else len(v) for v in values), np.int64, n)
    return "".join(v for v in values if v is not None), lens


def _too_large(values: Mapping[str, list[Any]]) -> str:
    """Which record holds a number past int64 (no time or count of a run comes near)."""
    for f in (*_OPT_INTS, *_INTS, *_LISTS):
        for i, v in enumerate(values[f]):
            for x in v if isinstance(v, list) else (v,):
                if x is not None and not -(2**63) < x < 2**63:
                    rid = values["request_id"][i]
                    return f"record {rid!r}: {f} holds {x:.3g}, past any time or count (2**63)"
    return "a number past any time or count (2**63)"


def _encode(values: list[Any]) -> tuple[np.ndarray, tuple[Any, ...]]:
    """(codes int32 [n], levels in order first seen): ``levels[codes[i]] == values[i]``."""
    index = {v: i for i, v in enumerate(dict.fromkeys(values))}
    return np.fromiter(map(index.__getitem__, values), np.int32, len(values)), tuple(index)


class _Grow:
    """An int array appended to in place (its capacity doubles): no list of parts to join,
    so reading a file never holds its numbers twice. A column that holds one value so far
    takes no memory until another comes (most runs: no intended times, no reasoning, a
    token a chunk)."""

    def __init__(self, dtype: Any = np.int64) -> None:
        self.a = np.empty(0, dtype=dtype)
        self.n = 0
        self.same: Any = None  # the one value of every element so far (None: they differ)
        self.room = 0  # reserved capacity, taken when the values first differ

    def reserve(self, size: int) -> None:
        """Room for ``size`` values (pages never written cost no memory)."""
        if self.same is not None or (self.n == 0 and self.a.size == 0):
            self.room = max(self.room, size)
        elif size > self.a.size:
            grown = np.empty(size, dtype=self.a.dtype)
            grown[: self.n] = self.a[: self.n]
            self.a = grown

    def extend(self, x: np.ndarray) -> None:
        if not x.size:
            return
        if self.n == 0 and self.a.size == 0 and self.same is None:  # the first values
            self.same = x[0]
        if self.same is not None:
            if not (x != self.same).any():
                self.n += x.size
                return
            value, self.same = self.same, None  # they differ from here: write them all
            self.a = np.empty(max(self.room, self.n + x.size, 1 << 12), dtype=self.a.dtype)
            self.a[: self.n] = value
        need = self.n + x.size
        if need > self.a.size:
            self.reserve(max(need, 2 * self.a.size, 1 << 12))
        self.a[self.n : need] = x
        self.n = need

    def array(self) -> np.ndarray:
        if self.same is not None:
            return np.broadcast_to(np.array([self.same], dtype=self.a.dtype), (self.n,))
        return self.a[: self.n]


class _Builder:
    """Columns from parts, in order: codes mapped onto one set of levels a field."""

    def __init__(self, total_bytes: int | None = None) -> None:
        self.total_bytes = total_bytes
        self.ints = {f: _Grow() for f in (*_OPT_INTS, *_INTS, *_BOOLS)}
        self.codes = {f: _Grow(np.int32) for f in _CODED}
        self.levels: dict[str, dict[Any, int]] = {f: {} for f in _CODED}
        self.chars: dict[str, list[str]] = {f: [] for f in _TEXT}
        self.text_lens = {f: _Grow() for f in _TEXT}
        self.lens = {f: _Grow() for f in _LISTS}
        self.flat = {f: _Grow() for f in _LISTS}
        self.server: dict[int, dict[str, Any]] = {}
        self.n = 0

    def _reserve(self, part: Part) -> None:
        """Columns sized once, from the first part's bytes a record and value (5 % spare): a
        column grown by doubling leaves its earlier copies in the heap, as much again."""
        scale = 1.05 * (self.total_bytes or 0) / part.nbytes
        columns = (*self.ints.values(), *self.codes.values(), *self.lens.values())
        for grow in (*columns, *self.text_lens.values()):
            grow.reserve(int(part.n * scale) + 1)
        for f, grow in self.flat.items():
            grow.reserve(int(part.lists[f][1].size * scale) + 1)

    def add(self, part: Part) -> None:
        if self.n == 0 and part.nbytes and self.total_bytes:
            self._reserve(part)
        for f, grow in self.ints.items():
            grow.extend(part.ints[f])
        for f, index in self.levels.items():
            codes, levels = part.codes[f]
            mine = np.array([index.setdefault(v, len(index)) for v in levels], dtype=np.int32)
            self.codes[f].extend(mine[codes] if codes.size else codes)
        for f, (chars, lens) in part.text.items():
            self.chars[f].append(chars)
            self.text_lens[f].extend(lens)
        for f in _LISTS:
            self.lens[f].extend(part.lists[f][0])
            self.flat[f].extend(part.lists[f][1])
        self.server.update((self.n + i, d) for i, d in part.server.items())
        self.n += part.n

    def columns(self) -> RecordColumns:
        ints = {f: grow.array() for f, grow in self.ints.items()}
        coded = {f: (self.codes[f].array(), tuple(self.levels[f])) for f in _CODED}
        lists = {}
        for f in _LISTS:
            starts = np.zeros(self.n + 1, dtype=np.int64)
            np.cumsum(self.lens[f].array(), out=starts[1:])
            lists[f] = (starts, self.flat[f].array())
        text = {f: TextColumn("".join(self.chars[f]), self.text_lens[f].array()) for f in _TEXT}
        return RecordColumns(ints, coded, text, self.server, lists)


def _ints(values: list[Any]) -> np.ndarray:
    """int64 [n] of ints, bools and Nones (NONE); ``ValueError`` past int64's range."""
    if None in values:
        if values.count(None) == len(values):  # a field no record holds (most runs' many)
            return np.full(len(values), NONE, dtype=np.int64)
        values = [NONE if v is None else v for v in values]
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        raise ValueError("a number too large for any time or count (over 2**63)") from None
