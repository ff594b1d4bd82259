"""distributed finds kiln's serializers by itself: nothing to preload.

``distributed.protocol``'s two dispatch tables (``dask_serialize`` and
``dask_deserialize``, ``dask.utils.Dispatch`` objects) take *lazy*
registrations: a function called the first time a class whose top-level
module is ``kiln`` is looked up.  ``install()`` (run by ``import kiln``)
registers :func:`_register`, which imports :mod:`kiln.dask` (whose
decorators register the real serializers, and ``dask.sizeof`` functions that
count a tensor's payload), in one of two ways:

* distributed is already imported (a ``dask worker`` meeting a kiln value:
  unpickling the value, or the class named in a ``"dask"`` header, imports
  kiln): the lazy registration is made at once;
* distributed is not imported yet (a client script that imports kiln first):
  a finder on ``sys.meta_path`` waits for ``distributed.protocol.serialize``
  to be imported, makes the registration right after that module has run,
  and takes itself off ``sys.meta_path``.  It answers None to every other
  import, and imports nothing.

So a worker that never imported ``kiln.dask`` serializes and deserializes
kiln values with kiln's serializers, and the client does too, whatever the
order of its imports.  Nothing here imports distributed or dask.
"""

import sys
from typing import Any, Optional

_SERIALIZE = "distributed.protocol.serialize"
_TABLES = ("dask_serialize", "dask_deserialize")


def _register() -> None:
    """Called by distributed when it first meets a kiln class."""
    import kiln.dask  # noqa: F401  (its decorators register the serializers)


def _hook(module: Any) -> bool:
    """Register ``_register`` lazily with ``module``'s dispatch tables."""
    tables = [getattr(module, name, None) for name in _TABLES]
    if not all(hasattr(t, "register_lazy") for t in tables):
        return False
    sizeof = getattr(sys.modules.get("dask.sizeof"), "sizeof", None)
    if hasattr(sizeof, "register_lazy"):   # a worker's memory accounting: payload bytes
        tables.append(sizeof)
    for t in tables:
        t.register_lazy("kiln", _register)
    return True


class _AfterLoad:
    """A loader that runs the real one, then makes the registration."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = self.loader   # the real loader from here on
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _hook(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _Watch:
    """A ``sys.meta_path`` finder waiting for ``distributed.protocol.serialize``."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> Optional[Any]:
        if fullname != _SERIALIZE:
            return None
        _unwatch()
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AfterLoad(spec.loader)
                return spec
        return None


def _unwatch() -> None:
    try:
        sys.meta_path.remove(_Watch)   # type: ignore[arg-type]
    except ValueError:
        pass


def install() -> None:
    """Make distributed find kiln's serializers now, or when it is imported."""
    module = sys.modules.get(_SERIALIZE)
    if module is not None:
        _hook(module)
    elif _Watch not in sys.meta_path:
        sys.meta_path.insert(0, _Watch)   # type: ignore[arg-type]
