"""Validated option sets: one frozen dataclass per op holds every default and every rule.

An op's options are declared once, as fields built with `number`, `optional_number`,
`choice` and `flag`. The dataclass checks each field when constructed (so a bad value
raises before any kernel runs, naming the option, what it allows and what it got), and
flattens to the op's torch schema, where torch.compile and export need plain scalars.
Public functions take `options=` and/or keyword settings and merge them with `build`,
which caches validated objects: a trainer calling with the same settings every step pays
one dictionary lookup, not the validation.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from rlk._runtime import validate

_CACHE_SIZE = 256
Self = TypeVar("Self", bound="Options")


@dataclass(frozen=True)
class Number:
    """A finite real number in a range; `strict` bounds exclude the bound itself."""

    low: float = -math.inf
    high: float = math.inf
    low_strict: bool = False
    high_strict: bool = False
    optional: bool = False
    description: str = dataclasses.field(init=False, default="")

    @property
    def schema(self) -> str:
        return "float?" if self.optional else "float"

    def __post_init__(self) -> None:
        # written once: torch.compile traces check(), where formatting numbers is unsupported
        parts = ["finite"]
        if self.low > -math.inf:
            parts.append(f"{'>' if self.low_strict else '>='} {self.low:g}")
        if self.high < math.inf:
            parts.append(f"{'<' if self.high_strict else '<='} {self.high:g}")
        text = " and ".join(parts)
        object.__setattr__(self, "description", f"None or {text}" if self.optional else text)

    def check(self, name: str, value: Any) -> Any:
        if value is None and self.optional:
            return None
        # numbers.Real admits NumPy scalars; SymFloat/SymInt appear under torch.compile
        real = isinstance(value, (numbers.Real, torch.SymFloat, torch.SymInt))
        if isinstance(value, bool) or not real:
            kind = "a float or None" if self.optional else "a float"
            raise TypeError(f"{name} must be {kind}, got {type(value).__name__} {value!r}")
        number = value if isinstance(value, (torch.SymFloat, torch.SymInt)) else float(value)
        # comparisons instead of math.isfinite: they also hold for symbolic values
        below = number > self.low if self.low_strict else number >= self.low
        above = number < self.high if self.high_strict else number <= self.high
        if not (-math.inf < number < math.inf and below and above):
            raise ValueError(f"{name} must be {self.description}; got {_shown(value)}")
        validate.in_float32(name, number)
        return number


def _shown(value: Any) -> str:
    """The value for an error message (under torch.compile it may be symbolic)."""
    return "a value traced by torch.compile" if torch.compiler.is_compiling() else repr(value)


@dataclass(frozen=True)
class Choice:
    """One string out of a fixed tuple."""

    allowed: tuple[str, ...]
    schema: ClassVar[str] = "str"

    def check(self, name: str, value: Any) -> str:
        if not isinstance(value, str) or value not in self.allowed:
            allowed = ", ".join(map(repr, self.allowed))
            raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
        return value


@dataclass(frozen=True)
class Flag:
    """True or False (NumPy's too), nothing else (not 0/1, not a string)."""

    schema: ClassVar[str] = "bool"

    def check(self, name: str, value: Any) -> bool:
        return validate.boolean(name, value)


Rule = Number | Choice | Flag


def number(default: float, **bounds: Any) -> Any:
    """A float field; `bounds` as in `Number`."""
    return dataclasses.field(default=default, metadata={"rule": Number(**bounds)})


def optional_number(**bounds: Any) -> Any:
    """A float-or-None field, None by default (the feature is off)."""
    return dataclasses.field(default=None, metadata={"rule": Number(optional=True, **bounds)})


def choice(default: str, allowed: tuple[str, ...]) -> Any:
    return dataclasses.field(default=default, metadata={"rule": Choice(allowed)})


def flag(default: bool) -> Any:
    return dataclasses.field(default=default, metadata={"rule": Flag()})


def option_set(cls: type[Self]) -> type[Self]:
    """Make `cls` a frozen dataclass of rule fields and record its rules (decorator).

    The rules are read once here: torch.compile traces `__post_init__`, and reading
    dataclass fields of a class is beyond what it traces.
    """
    cls = dataclass(frozen=True)(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    cls._rules = tuple((field.name, field.metadata["rule"]) for field in fields)
    cls._cache = {}
    cls._field_hash = cls.__hash__  # type: ignore[attr-defined]
    cls.__hash__ = Options.cached_hash  # type: ignore[assignment]
    return cls


class Options:
    """Base of an op's option set: subclasses are `@option_set` classes of rule fields."""

    op_name: ClassVar[str] = ""
    _rules: ClassVar[tuple[tuple[str, Rule], ...]] = ()
    _cache: ClassVar[dict[Any, Any]]

    def __post_init__(self) -> None:
        for name, rule in self._rules:
            object.__setattr__(self, name, rule.check(name, getattr(self, name)))
        self.check_combination()

    def check_combination(self) -> None:
        """Rules between fields (a subclass raises ValueError for a combination it refuses)."""

    def cached_hash(self) -> int:
        """The dataclass hash of every field, computed once per object: options objects are
        dictionary keys on every call's path (option and backend caches)."""
        found = self.__dict__.get("_hash")
        if found is None:
            found = self._field_hash()  # type: ignore[attr-defined]
            object.__setattr__(self, "_hash", found)  # not a field: outside eq and hash
        return found

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(name for name, _ in cls._rules)

    @classmethod
    def schema(cls) -> str:
        """The options as arguments of a torch operator schema, in field order."""
        return ", ".join(f"{rule.schema} {name}" for name, rule in cls._rules)

    def flat(self) -> tuple[Any, ...]:
        """The values in field order: the options as a torch operator receives them."""
        return tuple(getattr(self, name) for name, _ in self._rules)

    @classmethod
    def from_flat(cls: type[Self], values: tuple[Any, ...]) -> Self:
        """Inverse of `flat` (validated; cached outside torch.compile)."""
        return cls._cached(values, lambda: cls(*values))

    def choices(self) -> tuple[Any, ...]:
        """What a kernel's `check` may depend on: every choice and flag, and which optional
        numbers are set (not their values, so a schedule over a coefficient keeps one cached
        kernel selection). Computed once per object: it is on every call's path."""
        found = self.__dict__.get("_choices")
        if found is None:
            key = []
            for name, rule in self._rules:
                value = getattr(self, name)
                if isinstance(rule, Number):
                    if rule.optional:
                        key.append(value is not None)
                else:
                    key.append(value)
            found = tuple(key)
            object.__setattr__(self, "_choices", found)  # not a field: outside eq and hash
        return found

    @classmethod
    def build(cls: type[Self], options: Self | None, settings: Mapping[str, Any]) -> Self:
        """`options` (or the defaults) with `settings` applied, validated."""
        if options is not None and not isinstance(options, cls):
            raise TypeError(f"options must be {cls.__name__} or None, got "
                            f"{type(options).__name__}")
        base = options if options is not None else cls._cached((), cls)
        if not settings:
            return base
        names = cls.names()
        for name in settings:
            if name not in names:
                raise TypeError(cls._unknown_message(name))

        def make() -> Self:
            values = dict(zip(names, base.flat(), strict=True))
            values.update(settings)
            return cls(**values)

        # the key holds each value's type: True == 1 must not reuse a validated 1
        key = (base, *((name, type(value), value) for name, value in settings.items()))
        return cls._cached(key, make)

    @classmethod
    def _cached(cls: type[Self], key: Any, make: Callable[[], Self]) -> Self:
        if torch.compiler.is_compiling():
            return make()  # symbolic values neither hash nor belong in a cache
        try:
            found = cls._cache.get(key)
        except TypeError:  # an unhashable value: construct, which explains what is wrong
            return make()
        if found is None:
            found = make()
            if len(cls._cache) >= _CACHE_SIZE:
                cls._cache.clear()
            cls._cache[key] = found
        return found

    @classmethod
    def _unknown_message(cls, name: str) -> str:
        names = cls.names()
        close = ([known for known in names if name.startswith(known) or known.startswith(name)]
                 or difflib.get_close_matches(name, names, n=1))
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (f"{cls.op_name} got an unexpected option {name!r}{hint}; its options are "
                f"{', '.join(cls.names())}")
