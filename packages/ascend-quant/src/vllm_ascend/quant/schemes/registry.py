"""The scheme registry: (quant type, layer type) → scheme class."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from vllm_ascend.quant.schemes.base import AscendLinearScheme, AscendMoEScheme

LAYER_TYPES: tuple[str, ...] = ("linear", "moe")

SchemeClass = type[AscendLinearScheme] | type[AscendMoEScheme]
_S = TypeVar("_S", type[AscendLinearScheme], type[AscendMoEScheme])

_SCHEMES: dict[tuple[str, str], SchemeClass] = {}


class UnsupportedQuantType(KeyError, ValueError):
    """No scheme implements this (quant type, layer type); the message names both and the implemented types."""

    def __str__(self) -> str:
        return str(self.args[0])


def _check_layer_type(layer_type: str) -> None:
    if layer_type not in LAYER_TYPES:
        raise ValueError(f"layer_type={layer_type!r} is invalid; allowed values: {', '.join(LAYER_TYPES)}")


def register_scheme(quant_type: str, layer_type: str) -> Callable[[_S], _S]:
    """Class decorator: register a scheme for ``quant_type`` layers of ``layer_type`` ("linear" or "moe")."""
    _check_layer_type(layer_type)

    def decorate(cls: _S) -> _S:
        base = AscendLinearScheme if layer_type == "linear" else AscendMoEScheme
        if not issubclass(cls, base):
            raise TypeError(f"a {layer_type} scheme must subclass {base.__name__}, got {cls.__name__}")
        if (quant_type, layer_type) in _SCHEMES:
            raise ValueError(
                f"{layer_type} scheme {quant_type!r} is already registered ({_SCHEMES[quant_type, layer_type].__name__})"
            )
        cls.quant_type = quant_type
        _SCHEMES[quant_type, layer_type] = cls
        return cls

    return decorate


def implemented(layer_type: str) -> tuple[str, ...]:
    """The quant types with a registered scheme for ``layer_type``, sorted."""
    _check_layer_type(layer_type)
    return tuple(sorted(q for q, kind in _SCHEMES if kind == layer_type))


def get_scheme_class(quant_type: str, layer_type: str) -> SchemeClass:
    """The scheme class for ``quant_type`` layers of ``layer_type``; :class:`UnsupportedQuantType` when none."""
    _check_layer_type(layer_type)
    try:
        return _SCHEMES[quant_type, layer_type]
    except KeyError:
        raise UnsupportedQuantType(
            f"quant type {quant_type!r} has no {layer_type} scheme in vllm-ascend-quant; "
            f"implemented {layer_type} types: {', '.join(implemented(layer_type))}"
        ) from None
