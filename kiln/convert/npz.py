"""npz <-> Kiln: one array at a time (numpy reads each member of the zip alone)."""

import zipfile
from typing import Any

import numpy as np

from ..files import KilnFile, TensorWriter, _AtomicFile
from . import ConvertError, progress


def npz_to_kiln(src: str, dst: str) -> int:
    try:
        z = np.load(src, allow_pickle=False)
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise ConvertError("%s: not a readable npz file (%s)" % (src, e)) from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ConvertError("%s: a single .npy array, not an .npz archive" % src)
    with z:
        names = list(z.files)
        with TensorWriter(dst) as w:
            for name in names:   # the table first, from each member's .npy header
                shape, dtype = _npy_header(z, name, src)
                try:
                    w.add(name, _kiln_dtype(dtype, src, name), shape)
                except ValueError as e:
                    raise ConvertError("%s: %s" % (src, e)) from None
            for name in progress(names, len(names), "npz"):
                w.write(name, np.ascontiguousarray(z[name]))   # one array in memory at a time
    return len(names)


def _npy_header(z: Any, name: str, src: str) -> Any:
    fmt = np.lib.format
    try:
        with z.zip.open(name + ".npy") as fh:
            version = fmt.read_magic(fh)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read(fh)
            header_end = fh.tell()
        size = z.zip.getinfo(name + ".npy").file_size
    except (KeyError, ValueError, OSError) as e:
        raise ConvertError("%s: member %r is not a .npy array (%s)" % (src, name, e)) from None
    count = 1
    for d in shape:
        count *= d
    if count * np.dtype(dtype).itemsize > size - header_end:   # before reading it
        raise ConvertError("%s: member %r claims %s %s but holds %d bytes"
                           % (src, name, dtype, shape, size - header_end))
    return shape, dtype


def _kiln_dtype(dtype: Any, src: str, name: str) -> str:
    from .._tensor import DTYPE_NAMES, _dtype_code_of_numpy
    try:
        return DTYPE_NAMES[_dtype_code_of_numpy(np.dtype(dtype))]
    except TypeError:
        raise ConvertError("%s: array %r has dtype %s, which Kiln has no twin for"
                           % (src, name, dtype)) from None


def kiln_to_npz(src: str, dst: str) -> int:
    with KilnFile(src) as f:
        names = f.keys()
        for name in names:
            t = f[name]
            if not isinstance(name, str):
                raise ConvertError("%s: the tensors are unnamed; npz members need names" % src)
            if t.dtype in ("i4", "u4", "e2m1") or not isinstance(t.dtype, str):
                raise ConvertError("%s: tensor %r is %s, which numpy has no dtype for"
                                   % (src, name, t.dtype))
        out = _AtomicFile(dst)
        try:
            with zipfile.ZipFile(out.f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                for name in progress(names, len(names), "npz"):
                    with zf.open(name + ".npy", "w", force_zip64=True) as member:
                        np.lib.format.write_array(member, f[name].numpy(), allow_pickle=False)
            out.commit()
        except BaseException:
            out.discard()
            raise
    return len(names)
