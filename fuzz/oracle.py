"""The fuzzing oracle, shared by the atheris harnesses and the corpus replay test.

For one input: the compiled and pure kernels give the same value or the same
error code and offset; an accepted input re-encodes to exactly the same bytes;
nothing but KilnError is ever raised.
"""

import kiln
from kiln import _kernels_py

try:
    from kiln import _kernels_c
except ImportError:  # pragma: no cover - the replay test requires it under CI
    _kernels_c = None

# fixed types for the Frozen harness; the first input byte picks one
FROZEN_TYPES = [
    "struct{id:i64,name:str,score:f64,tags:list<i32>,}",
    "list<struct{a:opt<str>,b:dict<str,list<f32>>,c:bool,}>",
    "struct{id:i64,batch:tensors,text:str,}",
    "list<opt<tensors>>",
    "dict<str,list<u8>>",
    "list<list<i16>>",
    "opt<dict<str,struct{x:u8,y:list<bool>,}>>",
    "struct{}",
]
_PLANS = {}


def _progs(kernels, text, **kw):
    key = (kernels.__name__, text, tuple(sorted(kw.items())))
    p = _PLANS.get(key)
    if p is None:
        t = kiln.parse_type(text)
        p = _PLANS[key] = (kiln.Decoder(t, kernels=kernels, **kw),
                           kiln.Encoder(t, kernels=kernels))
    return p


def outcome(kernels, text, buf, **kw):
    dec, enc = _progs(kernels, text, **kw)
    try:
        v = dec.decode(buf)
    except kiln.KilnError as e:
        return ("err", e.code, e.offset)
    try:
        again = enc.encode(v)
    except kiln.EncodeError as e:
        # a trusted decode skips the UTF-8 and quantization-shape checks; the
        # encoder runs every check, so such a value cannot be written back
        if kw.get("trusted") and e.code in ("UTF8", "TYPE"):
            return ("ok-unencodable", e.code)
        raise
    if again != buf:
        raise AssertionError("accepted input re-encodes differently under %s: %s"
                             % (kernels.__name__, text))
    return ("ok", again)


def check(text, buf, **kw):
    """Run the oracle on one input; raises AssertionError on a disagreement."""
    a = outcome(_kernels_py, text, buf, **kw)
    if _kernels_c is None:
        return a
    b = outcome(_kernels_c, text, buf, **kw)
    if a != b:
        raise AssertionError("implementations disagree on %s %s: python %r, cython %r"
                             % (text, buf.hex(), a[:3], b[:3]))
    return a


def check_frozen_input(data):
    """Harness entry for raw fuzz bytes: byte 0 picks the type and options."""
    if not data:
        return
    sel = data[0]
    text = FROZEN_TYPES[sel % len(FROZEN_TYPES)]
    kw = {}
    if sel & 0x80:
        kw = dict(trusted=True, max_count=7, max_bytes=9)
    check(text, bytes(data[1:]), **kw)


def check_directory_input(data):
    if not data:
        return
    sel = data[0]
    kw = {}
    if sel & 1:
        kw["copy"] = True
    if sel & 2:
        kw["trusted"] = True
    if sel & 4:
        kw.update(max_count=3, max_bytes=40)
    check("tensors", bytes(data[1:]), **kw)
