"""The ``progress=`` option of save_tensors, TensorWriter, load_tensors(copy=True)
and kiln.convert.convert: progress counted in payload bytes.

``progress`` is None or False (no report), True (a tqdm bar on stderr; tqdm is
the ``kiln-wire[progress]`` extra) or a callable ``fn(done_bytes, total_bytes)``,
called after each piece is written or read (an exception it raises stops the
operation, which then leaves no file behind, as any failure does).  The calls
come from the thread that wrote the piece, one at a time.
"""

import contextlib
import threading
from typing import Any, Callable, Iterator, Optional, Union

ProgressLike = Union[None, bool, Callable[[int, int], Any]]

STEP = 8 << 20   # bytes between two reports inside one payload


class Progress:
    """Counts bytes for one operation and reports them (see the module doc)."""

    __slots__ = ("_fn", "_bar", "_tqdm", "_what", "_done", "_total", "_lock")

    def __init__(self, progress: ProgressLike, what: str) -> None:
        self._tqdm: Any = None
        if progress is True:
            try:
                from tqdm import tqdm
                self._tqdm = tqdm
            except ImportError:
                raise ImportError("progress=True draws a tqdm bar, and tqdm is not installed: "
                                  "pip install 'kiln-wire[progress]' (or pass a callable "
                                  "fn(done_bytes, total_bytes))") from None
            self._fn = None
        elif callable(progress) and not isinstance(progress, bool):
            self._fn = progress
        else:
            raise TypeError("progress must be None, False, True or a callable "
                            "fn(done_bytes, total_bytes), not %r" % (progress,))
        self._bar: Any = None
        self._what = what
        self._done = 0
        self._total = 0
        self._lock = threading.Lock()

    def start(self, total: int) -> None:
        with self._lock:
            self._total = int(total)
            if self._fn is None and self._bar is None:
                import sys
                self._bar = self._tqdm(total=self._total, desc=self._what, unit="B", unit_scale=True,
                                 unit_divisor=1024, file=sys.stderr)

    def add(self, n: int) -> None:
        if not n:
            return
        with self._lock:
            self._done += n
            if self._bar is not None:
                self._bar.update(n)
            else:
                self._fn(self._done, self._total)   # type: ignore[misc]

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None


def make(progress: ProgressLike, what: str) -> Optional[Progress]:
    """A Progress for ``progress``, or None when no report is asked for."""
    if progress is None or progress is False:
        return None
    return Progress(progress, what)


@contextlib.contextmanager
def session(progress: ProgressLike, what: str) -> Iterator[Optional[Progress]]:
    """``make(progress, what)`` for the length of a ``with`` block, closed after it."""
    prog = make(progress, what)
    try:
        yield prog
    finally:
        if prog is not None:
            prog.close()
