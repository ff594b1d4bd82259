"""Names a module imports on first use (PEP 562): the ``__getattr__`` of
``kiln.files`` and ``kiln._access``, whose writers reading a file never
needs (``kiln inspect`` and ``kiln check`` load none of them)."""

from typing import Any, Dict


def attribute(namespace: Dict[str, Any], table: Dict[str, str], name: str) -> Any:
    """``name`` from the module ``table[name]`` names (relative to the package
    of ``namespace``, a module's globals), imported now and kept in
    ``namespace`` so that later lookups are plain attribute reads;
    AttributeError for a name the table lacks."""
    import importlib
    where = table.get(name)
    if where is None:
        raise AttributeError("module %r has no attribute %r" % (namespace["__name__"], name))
    value = getattr(importlib.import_module(where, namespace["__package__"]), name)
    namespace[name] = value
    return value
