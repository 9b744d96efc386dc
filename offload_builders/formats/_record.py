"""A base for the small immutable value classes on the command-line tools' start-up path.

It gives what ``@dataclass(frozen=True)`` gave them (``repr``, ``==`` and ``hash`` over the fields,
assignment refused, ``copy``/``pickle`` support) without importing :mod:`dataclasses`, which imports
:mod:`inspect` (and with it ``ast``, ``dis`` and ``tokenize``): ~8 ms, plus ~0.4 ms to build each class,
together a third of ``offload-bundler``'s start-up (which ``bench/bench_bundler.py`` measures against
``cat``).  A subclass lists its fields in ``__slots__`` (in constructor order) and sets them in its
``__init__`` with :meth:`Record._init`.
"""
from __future__ import annotations


class Record:
    """Fields in ``__slots__``; equal when of the same class with equal fields; immutable."""

    __slots__: tuple[str, ...] = ()

    def _init(self, *values: object) -> None:
        """Set the fields, in ``__slots__`` order (only ever from ``__init__``)."""
        for name, value in zip(self.__slots__, values, strict=True):
            object.__setattr__(self, name, value)

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__qualname__}({fields})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of an immutable {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of an immutable {type(self).__name__}")

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), self._fields()  # the constructor takes the fields in __slots__ order
