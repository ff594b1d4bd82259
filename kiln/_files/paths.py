"""What a path names, resolved once; local paths given as ``file://`` URLs;
files in other formats told apart.

``source`` resolves a path, URL or file object once into a :class:`Source`
that the file layers take.  ``local_path`` turns a ``file://`` URL into the
path it names, so every function that takes a path takes one.  ``foreign`` names the format of a
file that is not Kiln (from its first bytes), so errors can say what the
file is and how to convert it.
"""

import os
import struct
from typing import Any, Optional, Tuple

from .._wire import DIR_MAGIC, RECORDS_MAGIC


def is_url(path: Any) -> bool:
    """True for a string naming an fsspec URL other than a plain local path
    (decided from the text alone: nothing remote is imported)."""
    if not isinstance(path, str) or "://" not in path:
        return False
    scheme = path.split("://", 1)[0]
    return scheme.replace("+", "").replace("-", "").replace(".", "").isalnum() and \
        scheme.lower() != "file"   # (a scheme is case-insensitive: FILE:// is local)


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


class Source:
    """What a path, a URL or a binary file object names, resolved once by
    :func:`source`: ``kiln.open``, ``load_tensors``, ``load_metadata`` and
    ``load`` resolve their argument into one of these and hand it to the
    layers below (the sharded check, :class:`kiln.KilnFile`, the mapping of
    ``kiln._files.local``, the remote reader), which take it as it is.

    ``kind``: ``"file"`` (a local path: ``local`` is it, a ``file://`` URL
    decoded), ``"set"`` (a sharded set's index or folder: ``local`` is its
    path, or its index's URL), ``"url"`` (an fsspec URL) or ``"object"`` (a
    binary file object);
    ``given`` is what the caller passed; ``name`` is what messages (and a
    file's ``path``) call it: a local file's path, a ``file://`` URL decoded."""

    __slots__ = ("given", "kind", "local", "name")

    def __init__(self, given: Any, kind: str, local: Any, name: str) -> None:
        self.given, self.kind, self.local, self.name = given, kind, local, name

    def __repr__(self) -> str:
        return "<kiln source %s %r>" % (self.kind, self.name)


def bytes_path(path: Any, what: str = "kiln",
               instead: str = "kiln.decode_tensors(data) or kiln.open(io.BytesIO(data))"
               ) -> Any:
    """The one rule for a path given as bytes, everywhere kiln takes a path:
    ``bytes`` is a path (decoded as ``os.fsdecode`` does); a ``bytes`` value
    holding a NUL byte (which no path holds: a file's contents), or a
    ``bytearray`` or ``memoryview``, is a ``TypeError`` naming ``what`` was
    called and saying to use ``instead`` for a file held in memory.  Any
    other value is returned as it is."""
    if isinstance(path, bytes) and b"\0" not in path:
        return os.fsdecode(path)
    if isinstance(path, (bytes, bytearray, memoryview)):
        raise TypeError("%s expected a path (str, bytes or os.PathLike) and got a file's "
                        "contents (%s): for a file held in memory use %s"
                        % (what, "a bytes value holding a NUL byte, which no path holds"
                           if isinstance(path, bytes) else "a " + type(path).__name__, instead))
    return path


def source(path: Any) -> Source:
    """``path`` resolved once (a :class:`Source` is returned as it is)."""
    if type(path) is Source:
        return path
    path = bytes_path(path)
    if hasattr(path, "read"):
        return Source(path, "object", None, str(getattr(path, "name", "<file object>")))
    if is_url(path):   # an index's URL is a set (the set reads its URL)
        return Source(path, "set", path, path) if is_sharded(path) else \
            Source(path, "url", None, path)
    local = os.fspath(local_path(path))
    return Source(path, "set" if is_sharded(local) else "file", local,
                  local if isinstance(local, str) else os.fsdecode(local))


def url_parts(url: str) -> Tuple[str, str]:
    """(the URL without its query or fragment, the ``?query`` kept for each shard)."""
    cut = min([i for i in (url.find("?"), url.find("#")) if i >= 0] or [len(url)])
    return url[:cut], url[cut:].split("#", 1)[0]


def is_index_name(path: str) -> bool:
    """Does ``path`` (a path or a URL, its query aside) name a set's index?"""
    return (url_parts(path)[0] if "://" in path else path).endswith(".index.json")


def is_sharded(path: Any) -> bool:
    """Does ``kiln.open(path)`` name a sharded set (an index or a folder)?"""
    if not isinstance(path, (str, os.PathLike)):
        return False
    p = os.fspath(path)
    if isinstance(p, bytes):
        return False
    if is_index_name(p):
        return True
    return "://" not in p and os.path.isdir(p)


FOREIGN_HEAD = 128   # the bytes of a file's start that foreign() looks at

# the member names torch.save writes in its zip (<archive>/data.pkl first)
_TORCH_MEMBERS = (b"data.pkl", b"version", b".format_version", b"byteorder")


def _zip_kind(head: bytes) -> str:
    """npz, torch (a ``torch.save`` checkpoint) or zip, from the first member's
    name in the zip's first local header; "zip?" when ``head`` ends before it."""
    if head[:4] == b"PK\x05\x06":   # an empty zip: numpy's savez of nothing
        return "npz"
    if len(head) < 30:
        return "zip?"
    n = struct.unpack_from("<H", head, 26)[0]
    name = head[30:30 + n]
    if len(name) < n:
        return "zip?"
    if name.endswith(b".npy"):
        return "npz"
    if name.rsplit(b"/", 1)[-1] in _TORCH_MEMBERS:
        return "torch"
    return "zip"


def foreign(head: bytes) -> Optional[str]:
    """The format of a file that starts with ``head`` (FOREIGN_HEAD bytes or more) when it
    is one kiln convert reads or another common one, else None."""
    if head[:4] == b"GGUF":
        return "GGUF"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return _zip_kind(head)
    if head[:6] == b"\x93NUMPY":
        return "npy"
    if head[:2] == b"\x80\x02" or head[:2] in (b"\x80\x03", b"\x80\x04", b"\x80\x05"):
        return "pickle"
    if len(head) >= 9:
        n = struct.unpack_from("<Q", head, 0)[0]
        if 2 <= n < (100 << 20) and head[8:9] == b"{":
            return "safetensors"
    return None


_CONVERTS = {"GGUF": ".gguf", "npz": ".npz", "safetensors": ".safetensors"}
_READS = {
    "torch": "this is a PyTorch checkpoint, a torch.save zip, not Kiln: load it with "
             "torch.load(path, weights_only=True) and write its state dict with "
             "kiln.torch.save_file",
    "pickle": "this is a Python pickle, as older torch.save writes, not Kiln: load it "
              "with torch.load(path, weights_only=True) and write its state dict with "
              "kiln.torch.save_file",
    "npy": "this is an npy file, not Kiln: load it with numpy.load and write it with "
           "kiln.save_tensors",
    "zip?": "this is a zip file, not Kiln: an npz converts with kiln convert FILE.npz "
            "OUT.kiln; a torch.save checkpoint loads with torch.load(path, weights_only=True) "
            "and writes with kiln.torch.save_file",
}
# Kiln's own kinds, where another reader was asked
_KILN = {
    RECORDS_MAGIC: "this is a Kiln record file, not a tensor file: read it with kiln.RecordFile "
             "or kiln inspect",
    DIR_MAGIC: "this is a Kiln tensor file: read it with kiln.open, kiln.load_tensors or "
             "kiln inspect",
}


def foreign_hint(head: bytes, own: bytes = DIR_MAGIC) -> Optional[str]:
    """A sentence naming the format and what reads or converts it, or None (an
    unknown one, or the asking reader's ``own`` magic: a tensor reader's
    ``KLNT`` by default).  Kiln's record and tensor files get one too, for
    the reader of another kind."""
    if bytes(head[:4]) == own:
        return None
    kiln_kind = _KILN.get(bytes(head[:4]))
    if kiln_kind is not None:
        return kiln_kind
    what = foreign(head)
    if what is None:
        return None
    if what in _CONVERTS:
        return ("this is %s %s file, not Kiln: convert it with kiln convert FILE%s OUT.kiln "
                "(or kiln.convert.convert)" % (_an(what), what, _CONVERTS[what]))
    return _READS.get(what) or "this is %s %s file, not Kiln" % (_an(what), what)


def _an(word: str) -> str:
    return "an" if word[0] in "n" else "a"
