"""Local paths given as ``file://`` URLs, and files in other formats told apart.

``local_path`` turns a ``file://`` URL into the path it names, so every
function that takes a path takes one.  ``foreign`` names the format of a
file that is not Kiln (from its first bytes), so errors can say what the
file is and how to convert it.
"""

import struct
from typing import Any, Optional


def is_url(path: Any) -> bool:
    """True for a string naming an fsspec URL other than a plain local path
    (decided from the text alone: nothing remote is imported)."""
    if not isinstance(path, str) or "://" not in path:
        return False
    scheme = path.split("://", 1)[0]
    return scheme.replace("+", "").replace("-", "").replace(".", "").isalnum() and \
        scheme != "file"


def local_path(path: Any) -> Any:
    """The local path a ``file://`` URL names (percent-escapes decoded); any
    other value unchanged.  A URL naming another host is a ValueError."""
    if not isinstance(path, str) or path[:7].lower() != "file://":
        return path
    from urllib.parse import urlsplit
    from urllib.request import url2pathname
    u = urlsplit(path)
    if u.netloc not in ("", "localhost"):
        raise ValueError("%s names the host %r: a file:// URL must name a local file"
                         % (path, u.netloc))
    return url2pathname(u.path)


FOREIGN_HEAD = 16   # the bytes of a file's start that foreign() looks at


def foreign(head: bytes) -> Optional[str]:
    """The format of a file that starts with ``head`` (FOREIGN_HEAD bytes or more) when it
    is one kiln convert reads or another common one, else None."""
    if head[:4] == b"GGUF":
        return "GGUF"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "npz"
    if head[:6] == b"\x93NUMPY":
        return "npy"
    if len(head) >= 9:
        n = struct.unpack_from("<Q", head, 0)[0]
        if 2 <= n < (100 << 20) and head[8:9] == b"{":
            return "safetensors"
    return None


_CONVERTS = {"GGUF": ".gguf", "npz": ".npz", "safetensors": ".safetensors"}


def foreign_hint(head: bytes) -> Optional[str]:
    """A sentence naming the format and the conversion, or None (a Kiln file or
    an unknown one)."""
    what = foreign(head)
    if what is None:
        return None
    if what in _CONVERTS:
        return ("this is %s %s file, not Kiln: convert it with kiln convert FILE%s OUT.kiln "
                "(or kiln.convert.convert)" % (_an(what), what, _CONVERTS[what]))
    return "this is %s %s file, not Kiln" % (_an(what), what)


def _an(word: str) -> str:
    return "an" if word[0] in "n" else "a"
