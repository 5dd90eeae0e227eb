"""A lean HPACK codec (RFC 7541) for the server side of lameduck's HTTP/2.

Why not ``hpack.Encoder``/``hpack.Decoder`` as they are: on the proxy's hot path they cost
~17 µs per header block each way (a tuple subclass and a logging call per field, Huffman
encoding in pure Python). This module keeps the parts of the ``hpack`` package that are
data — the static table and the Huffman decoder — and does the rest in a few tight loops.

Rules it keeps:

- Decoding: integers with bounded continuation; indices 1..61 static, 62.. dynamic, 0 or
  beyond the table is an error; a dynamic table size update only at the start of a block,
  at most two, never above the size we advertised; strings bounded by the block; Huffman
  strings decoded (padding and EOS checked by ``hpack``). Any failure raises
  ``DecodeError``: the connection answers COMPRESSION_ERROR, since the shared table can no
  longer be trusted. The decoded list is never cut short for size — the caller judges it
  against SETTINGS_MAX_HEADER_LIST_SIZE and still keeps the table in step — except above a
  hard cap (``HeaderBomb``), where a small block would expand into a large allocation.
- Encoding: exact matches (static or dynamic) are indexed; other fields are literals with
  incremental indexing, except volatile or sensitive names (never indexed for credentials,
  as RFC 7541 §7.1 advises). Strings are sent raw, not Huffman coded: bytes on the wire are
  cheaper here than Python cycles. A table size the peer lowers is signalled at the start of
  the next block (RFC 7541 §4.2).
"""

from __future__ import annotations

from collections import deque
from typing import Final, cast

from hpack.exceptions import HPACKDecodingError
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

STATIC: Final[tuple[tuple[bytes, bytes], ...]] = tuple(HeaderTable.STATIC_TABLE)
# Fields travel as ``object`` (a Row) where they are only passed on or looked up: mypyc keeps
# a ``tuple[bytes, bytes]`` unboxed and would allocate a new tuple at every list append or
# dict lookup. ``_STATIC_ROWS`` hands out the very tuples of the static table.
Row = object
_STATIC_ROWS: Final[tuple[Row, ...]] = STATIC
_STATIC_FULL: Final[dict[tuple[bytes, bytes], int]] = {}
_STATIC_NAME: Final[dict[bytes, int]] = {}
for _i, _entry in enumerate(STATIC, 1):
    _STATIC_FULL.setdefault(_entry, _i)
    _STATIC_NAME.setdefault(_entry[0], _i)

DEFAULT_TABLE_SIZE: Final = 4096

# Fields whose values change per message or carry secrets: indexing them only churns the
# table (or, for secrets, opens it to CRIME-style probing).
_NEVER_INDEX: Final = frozenset({
    b"authorization", b"proxy-authorization", b"cookie", b"set-cookie",
})
_NO_INDEX: Final = frozenset({
    b":path", b"content-length", b"etag", b"last-modified", b"location", b"age",
    b"if-modified-since", b"if-none-match", b"link", b"content-range", b"x-request-id",
})


class DecodeError(Exception):
    """The header block cannot be decoded: COMPRESSION_ERROR for the connection."""


class HeaderBomb(DecodeError):
    """The decoded list passed the hard cap: decoding stopped, the table is lost."""


def _encode_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) whose first octet carries ``first`` above the prefix."""
    cached = _INT_CACHE.get((value, prefix_bits, first))
    if cached is not None:
        return cached
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_INT_CACHE: Final[dict[tuple[int, int, int], bytes]] = {}


def _string(value: bytes) -> bytes:
    """A raw (not Huffman-coded) string literal."""
    n = len(value)
    if n < 127:
        return bytes((n,)) + value
    return _encode_int(n, 7, 0) + value


class Decoder:
    """Decodes the client's header blocks; one per connection, fed blocks in wire order.

    ``generation`` moves whenever the dynamic table may change (an insertion, a size update):
    a block decoded without moving it decodes to the same fields again for as long as it
    does not move."""

    __slots__ = ("_dyn", "_max", "_size", "generation", "max_allowed")

    def __init__(self, max_allowed: int = DEFAULT_TABLE_SIZE) -> None:
        self._dyn: deque[Row] = deque()  # (name, value), newest first
        self._size = 0
        self._max = max_allowed  # the encoder's current choice
        self.max_allowed = max_allowed  # our SETTINGS_HEADER_TABLE_SIZE
        self.generation = 0

    def _add(self, entry: Row, size: int) -> None:
        self.generation += 1
        dyn = self._dyn
        if size > self._max:
            dyn.clear()
            self._size = 0
            return
        self._size += size
        while self._size > self._max:
            self._drop_oldest()
        dyn.appendleft(entry)

    def _drop_oldest(self) -> None:
        name, value = cast("tuple[bytes, bytes]", self._dyn.pop())
        self._size -= len(name) + len(value) + 32

    def _resize(self, new: int) -> None:
        self.generation += 1
        if new > self.max_allowed:
            raise DecodeError("table size update above SETTINGS_HEADER_TABLE_SIZE")
        self._max = new
        while self._size > new:
            self._drop_oldest()

    def decode(self, data: bytes, hard_cap: int) -> tuple[list[tuple[bytes, bytes]], int]:
        """The fields of one complete block and their RFC 9113 §6.5.2 size (name+value+32).
        Indexed fields are the table's own tuples (shared, immutable)."""
        headers: list[Row] = []
        size = 0
        pos = 0
        n = len(data)
        dyn = self._dyn
        updates = 0
        try:
            while pos < n:
                b = data[pos]
                if b & 0x80:  # indexed field
                    idx = b & 0x7F
                    pos += 1
                    if idx == 0x7F:
                        idx, pos = _decode_int_tail(data, pos, idx)
                    if idx <= 61:
                        if idx == 0:
                            raise DecodeError("index 0")
                        entry = _STATIC_ROWS[idx - 1]
                    else:
                        entry = dyn[idx - 62]  # IndexError if beyond the table
                    name, value = cast("tuple[bytes, bytes]", entry)
                    field_size = len(name) + len(value) + 32
                elif b & 0x40 or not b & 0x20:  # a literal
                    if b & 0x40:
                        mask = 0x3F
                        index = True
                    else:
                        mask = 0x0F
                        index = False
                    idx = b & mask
                    pos += 1
                    if idx == mask:
                        idx, pos = _decode_int_tail(data, pos, idx)
                    if idx:
                        name = STATIC[idx - 1][0] if idx <= 61 else _name_of(dyn[idx - 62])
                    else:
                        name, pos = _decode_str(data, pos, n)
                    value, pos = _decode_str(data, pos, n)
                    entry = (name, value)
                    field_size = len(name) + len(value) + 32
                    if index:
                        self._add(entry, field_size)
                else:  # dynamic table size update
                    if headers or updates >= 2:
                        raise DecodeError("table size update after a field")
                    updates += 1
                    new = b & 0x1F
                    pos += 1
                    if new == 0x1F:
                        new, pos = _decode_int_tail(data, pos, new)
                    self._resize(new)
                    continue
                headers.append(entry)
                size += field_size
                if size > hard_cap:
                    raise HeaderBomb("decoded header list above the hard cap")
        except IndexError as exc:
            raise DecodeError("index beyond the table or truncated block") from exc
        except HPACKDecodingError as exc:
            raise DecodeError(str(exc)) from exc
        return cast("list[tuple[bytes, bytes]]", headers), size


def _name_of(entry: Row) -> bytes:
    return cast("tuple[bytes, bytes]", entry)[0]


def _decode_int_tail(data: bytes, pos: int, value: int) -> tuple[int, int]:
    shift = 0
    while True:
        b = data[pos]  # IndexError: truncated
        pos += 1
        value += (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise DecodeError("integer too large")


# A peer sends the same Huffman-coded strings again and again (nginx codes every response field
# as a literal, never indexed: its name, the date, the content type), and hpack's decoder is pure
# Python (bit by bit): each distinct string is decoded once. Keyed by the coded bytes, so the
# result is the same as decoding; bounded (short strings only, dropped when full), as the
# field caches below.
_HUFFMAN: Final[dict[bytes, bytes]] = {}
HUFFMAN_CACHE_MAX: Final = 4096
HUFFMAN_CACHED_LEN: Final = 256


def _huffman(coded: bytes) -> bytes:
    out = _HUFFMAN.get(coded)
    if out is None:
        out = decode_huffman(coded)
        if len(coded) <= HUFFMAN_CACHED_LEN:
            if len(_HUFFMAN) >= HUFFMAN_CACHE_MAX:
                _HUFFMAN.clear()
            _HUFFMAN[coded] = out
    return out


def _decode_str(data: bytes, pos: int, n: int) -> tuple[bytes, int]:
    b = data[pos]
    length = b & 0x7F
    pos += 1
    if length == 0x7F:
        length, pos = _decode_int_tail(data, pos, length)
    end = pos + length
    if end > n:
        raise DecodeError("string beyond the block")
    if b & 0x80:
        return _huffman(data[pos:end]), end
    return data[pos:end], end


class Encoder:
    """Encodes our header blocks; the dynamic table is mirrored by two dicts for lookups.

    ``generation`` names the table's state: it moves on every insertion and every size
    change, and nothing else changes the table. A field's octets are a function of the field
    and that state, so octets worked out at one generation are the same at that generation
    again (``field`` says which octets depend on it at all): ``connection.H2Connection`` keeps
    the previous head's octets and reuses those still valid (RFC 7541 §2.3, §4)."""

    __slots__ = ("_dyn", "_full", "_inserted", "_max", "_names", "_size", "_updates",
                 "generation")

    def __init__(self) -> None:
        self._dyn: deque[tuple[bytes, bytes, int]] = deque()  # (name, value, id), newest first
        self._full: dict[Row, int] = {}  # (name, value) → insertion id
        self._names: dict[bytes, int] = {}
        self._inserted = 0
        self._size = 0
        self._max = DEFAULT_TABLE_SIZE
        self._updates: list[int] = []
        self.generation = 0

    def set_max_table_size(self, peer_max: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: we use at most 4096 of it, and tell the
        peer's decoder of every change at the start of the next block (RFC 7541 §4.2: the
        smallest size in between, then the final one)."""
        new = min(peer_max, DEFAULT_TABLE_SIZE)
        if new == self._max:
            return
        self._max = new
        self.generation += 1
        self._evict(0)
        self._updates = [new] if not self._updates else [min(self._updates[0], new), new]

    def _evict(self, room: int) -> None:
        dyn = self._dyn
        while dyn and self._size + room > self._max:
            name, value, ident = dyn.pop()
            self._size -= len(name) + len(value) + 32
            key = (name, value)
            if self._full.get(key) == ident:
                del self._full[key]
            if self._names.get(name) == ident:
                del self._names[name]

    def encode(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        """One block for ``headers`` (names lower-case, pseudo-fields first)."""
        out = [self.updates()] if self._updates else []
        for row in cast("list[Row]", headers):
            out.append(self.field(row)[0])
        return b"".join(out)

    def updates(self) -> bytes:
        """The dynamic table size updates the next block must start with (RFC 7541 §4.2,
        §6.3), if the peer's SETTINGS changed the size since the last block; else b""."""
        if not self._updates:
            return b""
        first, last = self._updates[0], self._updates[-1]
        self._updates = []
        done = _encode_int(last, 5, 0x20)
        return _encode_int(first, 5, 0x20) + done if first < last else done

    def field(self, row: Row) -> tuple[bytes, int]:
        """The octets of one field, and what they depend on: ``STATELESS`` (the field alone:
        a static table match or a literal never indexed), the generation they were worked out
        at (an index into the dynamic table), or ``INSERTED`` (a literal that added the field
        to the table: next time it is indexed instead)."""
        done = _FIXED.get(row)
        if done is not None:
            return done, STATELESS
        ident = self._full.get(row)
        if ident is not None and ident >= self._inserted - len(self._dyn):
            idx = 61 + self._inserted - ident  # the newest entry is 62
            return (_INDEXED[idx] if idx < 127 else _encode_int(idx, 7, 0x80)), self.generation
        return self._literal(row)

    def _literal(self, field: Row) -> tuple[bytes, int]:
        """A field sent as a literal; indexed for next time unless volatile or secret."""
        name, value = cast("tuple[bytes, bytes]", field)
        nidx = _STATIC_NAME.get(name)
        if nidx is None:
            ident = self._names.get(name)
            if ident is not None and ident >= self._inserted - len(self._dyn):
                nidx = 61 + self._inserted - ident
        size = len(name) + len(value) + 32
        never = name in _NEVER_INDEX
        if never or name in _NO_INDEX:
            # Never in the dynamic table, not even by name (so ``nidx`` is a static index or
            # none): the octets depend on the field alone, and are kept for the next response
            # carrying it.
            first = 0x10 if never else 0x00
            done = ((_encode_int(nidx, 4, first) if nidx else bytes((first,)) + _string(name))
                    + _string(value))
            if size <= _FIXED_ENTRY_MAX:
                if len(_FIXED) >= _FIXED_MAX:
                    _FIXED.clear()
                    _FIXED.update(_STATIC_BYTES)
                _FIXED[field] = done
            return done, STATELESS
        if size > self._max >> 1:
            return ((_encode_int(nidx, 4, 0x00) if nidx else b"\x00" + _string(name))
                    + _string(value)), self.generation
        done = (_encode_int(nidx, 6, 0x40) if nidx else b"\x40" + _string(name)) + _string(value)
        self._evict(size)
        ident = self._inserted
        self._inserted += 1
        self.generation += 1
        self._dyn.appendleft((name, value, ident))
        self._size += size
        self._full[field] = ident
        self._names[name] = ident
        return done, INSERTED


# What a field's octets depend on (``Encoder.field``), besides a generation (>= 0).
STATELESS: Final = -1
INSERTED: Final = -2

# Indexed field representations (RFC 7541 §6.1) below 127: one octet.
_INDEXED: Final[tuple[bytes, ...]] = tuple(bytes((0x80 | i,)) for i in range(127))

for _p, _f in ((4, 0x00), (4, 0x10), (6, 0x40), (7, 0x80), (5, 0x20)):
    for _v in range(256):
        _b = _encode_int(_v, _p, _f)
        _INT_CACHE[(_v, _p, _f)] = _b

# Complete encodings that depend on the field alone: static table matches (":status 200" is
# one octet), and — added as they are sent — literals never indexed. Bounded: cleared back
# to the static part when full, so distinct values (request ids...) cannot grow it.
_STATIC_BYTES: Final[dict[Row, bytes]] = {f: _INDEXED[i] for f, i in _STATIC_FULL.items()}
_FIXED: Final[dict[Row, bytes]] = dict(_STATIC_BYTES)
_FIXED_MAX: Final = 1024 + len(_STATIC_BYTES)
_FIXED_ENTRY_MAX: Final = 256  # RFC 7541 §4.1 size (name + value + 32); longer ones are re-encoded
