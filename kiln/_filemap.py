"""The mapping side shared by :class:`kiln.KilnFile` and
:class:`kiln.remote.RemoteFile`: each is a ``Mapping[str, Tensor]`` whose
tensors come from the directory ``_view()`` returns (what a subclass must
give, raising ``ValueError`` once the file is closed)."""

from typing import Any, Iterator, List, Mapping, Optional, Tuple, TypeVar, Union, overload

from ._tensors import Tensor, TensorDirectory

T = TypeVar("T")


class TensorFileMapping(Mapping[str, Tensor]):
    """``keys()``, ``values()`` and ``items()`` are lists in file order, as a
    :class:`kiln.TensorDirectory`'s are; a file compares by identity (it is a
    handle), not by content."""

    __slots__ = ()

    def _view(self) -> TensorDirectory:  # pragma: no cover - every subclass gives it
        raise NotImplementedError

    def __getitem__(self, name: Any) -> Tensor:
        return self._view()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._view())

    def __len__(self) -> int:
        return len(self._view())

    def __contains__(self, name: object) -> bool:
        return name in self._view()

    def keys(self) -> List[str]:  # type: ignore[override]  # a list, as a directory's
        return list(self)

    def values(self) -> List[Tensor]:  # type: ignore[override]
        return [self[k] for k in self]

    def items(self) -> List[Tuple[str, Tensor]]:  # type: ignore[override]
        return [(k, self[k]) for k in self]

    @overload
    def get(self, name: str) -> Optional[Tensor]: ...

    @overload
    def get(self, name: str, default: Union[Tensor, T]) -> Union[Tensor, T]: ...

    def get(self, name: Any, default: Any = None) -> Any:
        """``f[name]``, or ``default`` when there is no such name (or position)."""
        try:
            return self[name]
        except (KeyError, IndexError):
            return default

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)
