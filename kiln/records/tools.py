"""What the command line needs of record files: a look without the type, a
full check, and conversion to and from JSON Lines.

Without the record type a reader can still check everything but the values'
contents: the header, trailer and index, each record's head, padding and CRC,
and that each value starts with a Kiln frame of the header's schema hash.
"""

import base64
import dataclasses
import datetime
import decimal
import enum
import json
import uuid
from typing import Any, Dict, Iterator, Optional, TextIO

import numpy as np

from .._errors import EncodeError, KilnError
from .._files.atomic import AtomicFile
from .._files.local import open_regular_file
from .._plan import ConvError, Some
from .._tensors import TensorDirectory
from .._types import as_type
from .._wire import FRAME, FRAME_MAGIC, FRAME_SIZE
from . import _format as F
from .reader import RecordFile
from .writer import RecordWriter


def is_record_file(head: bytes) -> bool:
    """Do these first bytes start a record container?"""
    return head[:4] == F.MAGIC


class RawRecords(RecordFile[int]):
    """A record file opened without its type: ``rf[i]`` is the length of
    record i's framed value, after every check that needs no type."""

    def __init__(self, source: Any, recover: bool = False) -> None:
        RecordFile.__init__(self, source, "list<u8>", recover=recover)   # the type is not used

    def _setup(self, type: Any, decode_options: Dict[str, Any]) -> None:
        self.type = as_type(type)
        self._hash = 0
        self._prog = self       # the record loop calls self.decode on each value
        self._max_count = 0     # no zero-size budget to share: no value is decoded

    def decode(self, buf: Any) -> int:
        return self._frame_only(buf)

    def _open(self, recover: bool) -> None:
        head = bytes(self._src.read(0, min(self._src.size, F.HEADER_SIZE)))
        if len(head) == F.HEADER_SIZE:
            self._hash = F.HEADER.unpack(head)[4]
        RecordFile._open(self, recover)

    @property
    def schema_hash(self) -> int:
        return self._hash

    def _frame_only(self, buf: Any) -> int:
        if len(buf) < FRAME_SIZE:
            raise KilnError("EOF", 0, "a value shorter than its frame")
        magic, profile, flags, reserved, h = FRAME.unpack_from(buf, 0)
        if magic != FRAME_MAGIC or profile or flags or reserved:
            raise KilnError("FRAME", 0, "the value does not start with a Kiln frame")
        if h != self._hash:
            raise KilnError("SCHEMA", 8, "the value's schema hash 0x%016x is not the file's "
                            "0x%016x" % (h, self._hash))
        return len(buf)


def describe(path: str, type: Optional[str] = None, recover: bool = False) -> Dict[str, Any]:
    """The header and trailer facts of a record file (the index is checked);
    with ``recover``, a torn file's complete records and where the scan stopped."""
    rf = RawRecords(path, recover)
    with rf:
        info: Dict[str, Any] = {"kind": "record file", "records": len(rf),
                                "schema_hash": "0x%016x" % rf.schema_hash,
                                "stored_type": rf.type_text,
                                "index_at": rf._ip}
        if rf.recovery is not None:
            err = rf.recovery.error
            why = err.reason.replace(str(path) + ": ", "")
            info["torn"] = {"complete_until": rf.recovery.offset,
                            "why": "%s at byte %d: %s" % (err.code, err.offset, why)}
    if type is not None:
        t = as_type(type)
        info["type"] = t.text
        info["type_matches"] = t.schema_hash == int(info["schema_hash"], 16)
    return info


def check_all(path: str, type: Optional[str] = None,
              recover: bool = False) -> "tuple[int, Optional[Any]]":
    """Read every record (decoded when ``type`` is given or the file stores
    its type text): the count, and with ``recover`` where a torn file's scan
    stopped (``None`` for a whole file)."""
    if type is None:
        rf: RecordFile[Any] = RawRecords(path, recover)
        if rf.type_text is not None:
            rf.close()
            rf = RecordFile(path, None, recover=recover)
    else:
        rf = RecordFile(path, type, recover=recover)
    with rf:
        n = 0
        for _ in rf:
            n += 1
        return n, rf.recovery


# --- JSON Lines ----------------------------------------------------------------

def from_json(v: Any, t: Any) -> Any:
    """A JSON value as the Python value ``kiln.encode`` takes for type ``t``
    (``list<u8>`` from a base64 string, ``opt`` from ``null``); a value the
    type's Python form cannot hold is ``EncodeError`` ``TYPE`` naming its place."""
    try:
        return _from_json(v, t)
    except ConvError as e:
        raise EncodeError("TYPE", 0, str(e)) from None


def _at(segment: str, build: Any, *args: Any) -> Any:
    try:
        return build(*args)
    except ConvError as e:
        raise EncodeError("TYPE", 0, str(e), segment) from None
    except EncodeError as e:
        e.add_path(segment)
        raise


def _from_json(v: Any, t: Any) -> Any:
    wire = getattr(t, "wire", None)
    if wire is not None:   # a Python type carried by a wire type (kiln._pyconv)
        if isinstance(v, list) and wire.text.startswith("struct{"):   # tuple[A, B]
            return tuple(_at("[%d]" % i, _from_json, x, ft)
                         for i, (x, (_, ft)) in enumerate(zip(v, wire.fields))) \
                if len(v) == len(wire.fields) else v
        if isinstance(v, list) and wire.text.startswith("list<") and t.from_wire is tuple:
            return [_at("[%d]" % i, _from_json, x, wire.elem) for i, x in enumerate(v)]
        return t.json_in(v) if t.json_in is not None else v
    text = t.text
    if text == "list<u8>" and isinstance(v, str):
        return base64.b64decode(v, validate=True)
    if text == "tensors":
        raise ValueError("a tensors field cannot be read from JSON")
    fields = getattr(t, "fields", None)
    if fields is not None and isinstance(v, dict):
        types = dict(fields)
        return {k: _at("." + str(k), _from_json, x, types[k]) if k in types else x
                for k, x in v.items()}
    if text.startswith("list<") and isinstance(v, list):
        return [_at("[%d]" % i, _from_json, x, t.elem) for i, x in enumerate(v)]
    if text.startswith("opt<"):
        return None if v is None else _from_json(v, t.elem)
    if text.startswith("dict<") and isinstance(v, dict):
        return {k: _at("[%r]" % (k,), _from_json, x, t.value) for k, x in v.items()}
    return v


def to_json(v: Any) -> Any:
    """A decoded value as JSON data (arrays as lists, bytes as base64)."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, dict):
        return {k: to_json(x) for k, x in v.items()}
    names = _field_names(v)
    if names is not None:   # an instance of a bound class: its fields, as an object
        return {k: to_json(getattr(v, k)) for k in names}
    if isinstance(v, (list, tuple)):
        return [to_json(x) for x in v]
    if isinstance(v, Some):
        return to_json(v.value)
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (datetime.date, uuid.UUID, decimal.Decimal)):   # datetimes too
        return v.isoformat() if isinstance(v, datetime.date) else str(v)
    if isinstance(v, datetime.timedelta):
        return v // datetime.timedelta(microseconds=1)
    if isinstance(v, TensorDirectory):
        raise ValueError("a tensors field cannot be written as JSON")
    return v


def _field_names(v: Any) -> Optional["tuple[str, ...]"]:
    cls = type(v)
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    if isinstance(v, tuple) and hasattr(cls, "_fields"):
        return tuple(cls._fields)
    return getattr(cls, "__kiln_fields__", None)


class JsonLinesError(KilnError):
    """A line of a JSON Lines file that is not a record of the type: named by the
    file, the line and the field (``$`` for the whole line), never a byte offset
    of an output the line never became.  ``code`` is the encode error's code
    (``TYPE``, ``UTF8``, ``LIMIT``), or ``JSON`` for a line that is not JSON.
    A :class:`kiln.KilnError` (so a ``ValueError``) whose ``offset`` is the
    byte offset of the line's start in the JSON Lines file."""

    def __init__(self, path: str, line: int, error: Any, code: Optional[str] = None,
                 offset: int = 0) -> None:
        self.path, self.line, self.offset = path, line, offset
        self.field = "$" + getattr(error, "path", "")
        self.code = code or getattr(error, "code", "TYPE")
        self.reason = str(getattr(error, "reason", error))
        where = "" if self.field == "$" else ", field %s" % self.field[2:]
        self._text = "%s: line %d%s: %s" % (path, line, where, self.reason)
        ValueError.__init__(self, self._text)

    def __str__(self) -> str:
        return self._text

    def __reduce__(self) -> Any:
        return (_jsonl_error, (self.path, self.line, self.field, self.code, self.reason,
                               self.offset))


def _jsonl_error(path: str, line: int, field: str, code: str, reason: str,
                 offset: int) -> JsonLinesError:
    class _Where:
        pass
    where = _Where()
    where.path, where.reason = field[1:], reason   # type: ignore[attr-defined]
    return JsonLinesError(path, line, where, code, offset)


def _lines(f: TextIO, path: str) -> Iterator[Any]:
    """(line number, the byte offset of its start, its JSON value) of each line
    that is not blank."""
    at = 0
    for n, line in enumerate(f, 1):
        if line.strip():
            try:
                yield n, at, json.loads(line)
            except ValueError as e:
                raise JsonLinesError(path, n, "not JSON: %s" % e, "JSON", at) from None
        at += len(line.encode("utf-8", "surrogatepass"))


def jsonl_to_records(src: str, dst: str, type: Any, round_floats: bool = False) -> int:
    """Write each line of a JSON Lines file as one record of ``type``.  A
    number an f32 or f64 field cannot hold exactly (0.1 as f32) is refused,
    naming the line, unless ``round_floats`` (as for :func:`kiln.encode`)."""
    t = as_type(type)
    # through the atomic replace: a failure leaves dst as it was (an existing
    # file is kept, no half-converted output is left)
    with open_regular_file(src, text=True) as f, AtomicFile(dst) as out:
        w = RecordWriter(out.f, t, round_floats=round_floats)
        count = 0
        for n, at, doc in _lines(f, src):
            try:
                w.write(from_json(doc, t))
            except (KilnError, ValueError, ArithmeticError) as e:
                # ArithmeticError: decimal.InvalidOperation, OverflowError (a
                # Decimal or a timedelta past what Python's types hold)
                raise JsonLinesError(src, n, e, None, at) from None
            count += 1
        w.close()
    return count


def records_to_jsonl(src: str, dst: str, type: Any = None) -> int:
    """Write each record of a record file as one line of JSON (``type`` None:
    the type text the file stores)."""
    with RecordFile(src, type) as rf, AtomicFile(dst) as out:
        n = 0
        for v in rf:
            out.f.write((json.dumps(to_json(v), ensure_ascii=False) + "\n").encode("utf-8"))
            n += 1
    return n
