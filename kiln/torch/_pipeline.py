"""The pipelined loader: payload ranges of one or more files read in large
chunks into a ring of staging buffers and copied to their tensors (issue 50).

THE CONTRACT (kiln/torch/_load.py calls this; the body is being built):

    class Item(NamedTuple):
        key: str            # the name errors report (the file's tensor name)
        path: str           # the local file the payload lies in
        offset: int         # the payload's first byte in that file
        nbytes: int         # its size in bytes (0 allowed)
        crc: Optional[int]  # the CRC-32 recorded for it, None when none is
        dtype: Any          # the torch dtype of the result
        shape: Tuple[int, ...]
        target: Any         # a tensor to fill in place (any device, contiguous,
                            # same dtype and shape), or None: make a new one

    def load(items, device, *, progress=None, **tuning) -> List[torch.Tensor]
        # the tensors in the order of ``items``: ``target`` itself where given,
        # else a new tensor on ``device`` that owns its memory.  Raises
        # KilnError (a short read names the file and offset; CHECKSUM names
        # the tensor) and nothing partial is handed out.
"""
