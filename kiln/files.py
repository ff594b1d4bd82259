"""Files: save and load tensors and values, open a tensor file lazily, write
one tensor at a time.

A tensor file is one standalone Kiln tensor directory, so any Kiln reader
decodes it; every payload starts at a 64-byte aligned file offset.  Metadata,
when given, is one more tensor, the last, named ``__metadata__``: a ``u8``
payload holding a framed Kiln value (see ``kiln._meta`` and spec/kiln-v2.md,
"Tensor files").

Writes are atomic (``kiln._files.atomic``): a temporary file in the target's
directory, under a name unique across threads and processes, with the
target's permission bits, flushed and fsynced, then ``os.replace`` and an
fsync of the directory; a symbolic link is written through to its target.  A
reader that has the old file mapped keeps reading the old bytes (on Windows a
mapped file cannot be replaced: close readers first).  A writer killed half
way leaves the old file intact; its temporary file is removed by the next
save into that directory.  A tensor file is checked as a reader checks it
before it replaces anything.

Reading maps the file (``mmap``).  Views keep the mapping alive: closing a
file, or leaving its ``with`` block, while views live never raises and never
unmaps under them; the mapping goes when the last view goes.

The code lives in the package ``kiln/_files/``, one module per job (see
docs/architecture.md); this module is its public face.
"""

from typing import TYPE_CHECKING, Any, List

from ._files.kilnfile import KilnFile
from ._lazy import attribute
from ._files.load import load, load_metadata, load_tensors, open  # noqa: A004

if TYPE_CHECKING:   # what type checkers see; at run time __getattr__ imports them
    from ._files.save import save, save_tensors
    from ._files.sharded import ShardedFile
    from ._files.shardsave import save_sharded
    from ._files.writer import TensorWriter

# the writers and sets, {name: module}, imported on first use (PEP 562): reading
# a file (kiln.open, kiln inspect, kiln check) loads none of them
_LATER = {"save": "._files.save", "save_tensors": "._files.save",
          "save_sharded": "._files.shardsave", "TensorWriter": "._files.writer",
          "ShardedFile": "._files.sharded"}

__all__ = ["save_tensors", "load_tensors", "load_metadata", "save", "load", "open", "KilnFile",
           "TensorWriter", "save_sharded", "ShardedFile"]


def __getattr__(name: str) -> Any:
    return attribute(globals(), _LATER, name)


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_LATER))
