"""Kernel arguments as torch operator arguments, and back: one conversion for every op.

Kernels take Python values (a float or a per-row tensor for a temperature, a process group,
an options object); torch operator schemas take flat scalars and tensors. An op declares
its operator parameters once, as a `Signature` of `Param`s, and the conversion both ways,
the operator schema and the split of every compound value (a temperature into an optional
tensor and a float, above all) are written here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from rlk._runtime import shards
from rlk._runtime.options import Options

KernelArgs = dict[str, Any]


@dataclass(frozen=True)
class Param:
    """One kernel argument as the operator parameters it becomes (`schema`, in order),
    with `encode` (kernel value -> operator values) and `decode` (the reverse)."""

    name: str
    schema: tuple[str, ...]
    encode: Callable[[Any], tuple[Any, ...]] = lambda value: (value,)
    decode: Callable[[tuple[Any, ...]], Any] = lambda values: values[0]

    @property
    def tensor(self) -> bool:
        """Whether the parameter is one (optional) tensor: what autograd can differentiate."""
        return len(self.schema) == 1 and self.schema[0].split()[0] in ("Tensor", "Tensor?")


def plain(name: str, kind: str) -> Param:
    """A value the schema takes as it is: Tensor, Tensor?, int, float, float?, bool, str."""
    return Param(name, (f"{kind} {name}",))


def temperature_param(name: str = "temperature") -> Param:
    """A float or a per-row tensor: the operator takes an optional tensor and a float (the
    float unused when the tensor is given)."""

    def encode(value: Any) -> tuple[Any, ...]:
        return (value, 1.0) if isinstance(value, Tensor) else (None, float(value))

    def decode(values: tuple[Any, ...]) -> Any:
        return values[1] if values[0] is None else values[0]

    return Param(name, (f"Tensor? {name}", f"float {name}_value"), encode, decode)


def group_param(name: str = "group") -> Param:
    """A process group (or None), by its name ("" for none)."""
    return Param(name, (f"str {name}",), lambda value: (shards.group_name(value),),
                 lambda values: shards.resolve_group(values[0]))


def options_param(name: str, cls: type[Options]) -> Param:
    """An options object, flattened to its fields."""
    return Param(name, tuple(cls.schema().split(", ")), lambda value: value.flat(),
                 lambda values: cls.from_flat(tuple(values)))


def flags_param(name: str, parts: Sequence[str]) -> Param:
    """A tuple of booleans, one parameter each."""
    return Param(name, tuple(f"bool {part}" for part in parts), tuple,
                 lambda values: tuple(bool(value) for value in values))


def nested_param(name: str, params: Sequence[Param]) -> Param:
    """A dict of kernel arguments (linear_policy_loss's policy arguments), each its own
    parameters."""
    inner = Signature(tuple(params))
    return Param(name, inner.parameters, inner.encode, inner.decode)


@dataclass(frozen=True)
class Signature:
    """An op's operator parameters, from its kernel arguments; `fixed` are kernel arguments
    the operator does not carry (their value is the spec's, as logp_entropy's with_entropy)."""

    params: tuple[Param, ...]
    fixed: Mapping[str, Any] = field(default_factory=dict)

    @property
    def parameters(self) -> tuple[str, ...]:
        return tuple(part for param in self.params for part in param.schema)

    def schema(self, returns: str) -> str:
        return f"({', '.join(self.parameters)}) -> {returns}"

    def widths(self) -> tuple[int, ...]:
        return tuple(len(param.schema) for param in self.params)

    def encode(self, args: Mapping[str, Any]) -> tuple[Any, ...]:
        """Kernel arguments -> the operator's positional arguments."""
        values: list[Any] = []
        for param in self.params:
            values.extend(param.encode(args[param.name]))
        return tuple(values)

    def decode(self, values: Sequence[Any]) -> KernelArgs:
        """The operator's positional arguments -> kernel arguments."""
        args: KernelArgs = {}
        start = 0
        for param in self.params:
            stop = start + len(param.schema)
            args[param.name] = param.decode(tuple(values[start:stop]))
            start = stop
        args.update(self.fixed)
        return args

    def position(self, name: str) -> int:
        """Where the one-tensor parameter `name` sits among the operator's arguments."""
        start = 0
        for param in self.params:
            if param.name == name:
                if not param.tensor:
                    raise ValueError(f"{name} is not a tensor parameter")
                return start
            start += len(param.schema)
        raise KeyError(name)
