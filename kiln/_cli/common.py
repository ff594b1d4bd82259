"""What the commands share: the exit codes and ``Fail``, reading a file's
first bytes (a path or a URL), telling its kind by its magic, and printing
tensors and values."""

import os
from typing import Any, Dict, List, Optional

from .. import _wire as W

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 130, 141


def command(module: str, name: str) -> Any:
    """The command ``name`` of ``kiln/_cli/<module>.py``, imported when it runs:
    ``kiln inspect`` loads neither the demo, the cases nor the converters."""
    def run(args: Any) -> int:
        import importlib
        fn: Any = getattr(importlib.import_module("kiln._cli." + module), name)
        return int(fn(args))
    run.__name__ = name
    return run


# each command's runner (the parser's ``fn``): its name -> its module
RUNNERS = {name: command(module, "cmd_" + name)
           for name, module in (("demo", "demo"), ("inspect", "tensors"), ("check", "tensors"),
                                ("convert", "tensors"), ("cases", "cases"), ("gen", "cases"),
                                ("hash", "cases"))}


class Fail(Exception):
    """A one-line error and an exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        Exception.__init__(self, message)
        self.code = code


def located(path: str, e: Any) -> str:
    """A KilnError about the file ``path`` in the one format of the command line:
    ``<path>: <CODE> at byte N: <what>``, the path named once, and the library's
    ``recover=True`` advice given as the command's ``--recover``."""
    return "%s: %s at byte %d: %s" % (path, e.code, e.offset, what(path, e))


def what(path: str, e: Any) -> str:
    """The reason of a KilnError about ``path`` without the path in it."""
    reason = str(getattr(e, "reason", e))
    for name in (str(path), os.path.basename(str(path))):
        reason = reason.replace(name + ": ", "").replace(name + " is truncated",
                                                         "the file is truncated")
    return reason.replace("recover=True reads", "--recover reads")


def head(path: str, n: int) -> bytes:
    """The first ``n`` bytes of a regular file or a URL (one range request):
    a FIFO, a socket or a device is refused without waiting on it."""
    from .._access import is_url, local_path, read_head
    path = local_path(path)
    if is_url(path):   # the remote reader (http.client, fsspec) only for a URL
        from ..remote import head as remote_head
        return remote_head(path, n)[1]
    return read_head(path, n)


def size(path: str) -> int:
    from .._access import file_size, is_url, local_path
    path = local_path(path)
    if is_url(path):
        from ..remote import head as remote_head
        return remote_head(path, 0)[0]
    return file_size(path)
def oserror(e: OSError) -> str:
    """An OSError as one line: its message, or the system's text for its errno."""
    return str(e.strerror or e)


def dumps(value: Any, indent: Optional[int] = None) -> str:
    """``value`` as JSON for printing (what JSON has no type for, as its text);
    json is imported here, on first use: a plain ``kiln inspect`` or ``check``
    needs none."""
    import json
    return json.dumps(value, indent=indent, default=str)


def read(fn: Any, path: str) -> Any:
    try:
        return fn(path)
    except OSError as e:
        raise Fail("cannot read %s: %s" % (path, oserror(e)))


def kind(path: str) -> str:
    try:
        magic = head(path, len(W.DIR_MAGIC))
    except OSError as e:
        raise Fail("cannot read %s: %s" % (path, oserror(e)))
    except (ImportError, ValueError) as e:
        raise Fail("cannot read %s: %s" % (path, e), EXIT_USAGE)
    if magic == W.DIR_MAGIC:
        return "directory"
    if magic in (W.FRAME_MAGIC, W.PADDED_MAGIC):   # a frame, or kiln.save's pad head first
        return "framed"
    if not magic:
        raise Fail("%s is empty" % path, EXIT_INVALID)
    from .._access import FOREIGN_HEAD, foreign_hint
    hint = foreign_hint(head(path, FOREIGN_HEAD))
    if hint is not None:
        raise Fail("%s: %s" % (path, hint), EXIT_INVALID)
    return "bare"


def row(name: Any, t: Any, at: int = 0) -> Dict[str, Any]:
    """A tensor's line of a table; ``at``: where the buffer it was decoded from
    starts in the file (a value after kiln.save's pad head)."""
    from .._access import file_offset
    return {"name": name, "dtype": t.dtype, "shape": list(t.shape),
            "offset": at + file_offset(t),
            "bytes": t.nbytes, "layout": t.layout, "quant_scheme": t.quant_scheme,
            "quant_axis": t.quant_axis, "group_size": t.group_size,
            "scale_index": t.scale_index, "outer_index": t.outer_index,
            "block_size": t.block_size}


def short(v: Any, width: int = 8, at: int = 0) -> Any:
    """A value for printing: long arrays and lists shortened; ``at`` as for
    :func:`row`."""
    import numpy as np
    import kiln
    if isinstance(v, np.ndarray):
        items = v.ravel()[:width].tolist()
        return {"ndarray": str(v.dtype), "shape": list(v.shape),
                "first": items + (["..."] if v.size > width else [])}
    if isinstance(v, kiln.TensorDirectory):
        return {"tensors": [row(k, t, at) for k, t in v.items()]}
    if isinstance(v, bytes):
        return {"bytes": len(v), "first": v[:width].hex()}
    if isinstance(v, dict):
        return {k: short(x, width, at) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        out = [short(x, width, at) for x in v[:width]]
        return out + (["... %d more" % (len(v) - width)] if len(v) > width else [])
    if isinstance(v, kiln.Some):
        return {"Some": short(v.value, width, at)}
    return v


def table_text(rows: List[Dict[str, Any]], shard: bool = False) -> str:
    """The tensor table as aligned columns (with ``shard``: the file holding each)."""
    from .._access import dtype_label
    cols = ["name", "dtype", "shape", "offset", "bytes", "layout", "quant"]
    lines = []
    for r in rows:
        q = "-"
        if r["quant_scheme"]:
            q = "scheme %d axis %s group %d scale %s" % (r["quant_scheme"], r["quant_axis"],
                                                         r["group_size"], r["scale_index"])
            if r["outer_index"] is not None:
                q += " outer %s" % r["outer_index"]
        lines.append([str(r["name"]), dtype_label(r["dtype"], r["layout"]),
                      "x".join(map(str, r["shape"])) or "()", str(r["offset"]), str(r["bytes"]),
                      r["layout"] or "-", q] + ([r["shard"]] if shard else []))
    if shard:
        cols.append("shard")
    widths = [max([len(c)] + [len(ln[i]) for ln in lines]) for i, c in enumerate(cols)]
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    out += ["  ".join(x.ljust(w) for x, w in zip(ln, widths)) for ln in lines]
    return "\n".join(out)
NOT_KILN = ("%s is neither a tensor directory nor a framed record: pass --type TEXT "
             "to read a bare value")
def records_file(path: str) -> bool:
    """Does ``path`` start with a record container's magic?"""
    try:
        return head(path, len(W.RECORDS_MAGIC)) == W.RECORDS_MAGIC
    except OSError:
        return False           # kind reports it
