"""Floor 3, files: everything between a path or a URL and the tensor objects.

One module per job; the public faces are :mod:`kiln.files` and
:mod:`kiln.remote`.  This ``__init__`` imports nothing, so importing one
module of the package loads only what that module needs.

* ``atomic``: replace a file atomically (``AtomicFile``, a context manager).
* ``declare``: what a writer may commit (declarations, the directory check
  over the file before the replace).
* ``save``: ``save_tensors`` and ``save``, and the block writers.
* ``writer``: the streaming ``TensorWriter``.
* ``tables``: the one place that reads the inside of ``Tensor`` and
  ``TensorDirectory`` (rows, buffer, payload base).
* ``base``: what a local and a remote file share (``TensorFile``: the
  mapping, the lookup; ``open_table``, ``split_metadata``, the reserved name).
* ``local``: regular files only, mapping them, a lazy open's payload checks.
* ``kilnfile``: ``KilnFile``.
* ``load``: ``open``, ``load_tensors``, ``load_metadata``, ``load``.
* ``remote``: ``RemoteFile`` and ``RowSource``; ``fetch``: their byte sources.
* ``checksum``, ``progress``, ``paths``: CRC-32 entries, ``progress=``,
  ``file://`` paths and foreign formats.
"""
