"""Kubernetes quantities, read as the API server writes them. Pure.

The API server stores a quantity in its canonical form: a pod asking ``amd.com/gpumem: 3000``
comes back as ``3k``, ``1000`` as ``1k``, and ``3e3`` stays ``3e3`` (the canonical form keeps
the notation it was given: decimal SI, binary SI or decimal exponent). Every amd.com resource
and every amd.com quota is a whole count (MiB, percent, GPUs), so:

* any spelling whose value is a whole number is read as that number: ``3000``, ``3k``,
  ``3e3``, ``3000000m``;
* binary suffixes (``Ki``, ``Mi``, ``Gi``...) are refused even when whole: they count bytes,
  and ``amd.com/gpumem: 8Gi`` would be eight billion MiB, never what was meant;
* a fraction, a negative value or text that is no quantity is refused.

A refusal names the resource, its unit and the value: ``amd.com/gpumem is in MiB: '1.5'
is not a whole number``. This is the one quantity reader of the tree: the webhook, the
extender (requests, quotas, node allocatable) and the node agent all call it.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_GRAMMAR = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_DECIMAL_SUFFIX = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_EXPONENT = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_BINARY_SUFFIXES = tuple(_BINARY_EXPONENT)
_EXPONENT_MAX = 30  # 1e30 is far beyond any count; larger exponents are refused, not computed


class QuantityError(ValueError):
    """The value is not a whole count in the resource's unit; the message says which and why."""


def whole_quantity(raw: object, *, name: str, unit: str) -> int:
    """The whole number a quantity denotes. `name` and `unit` word the refusal
    (``name="amd.com/gpumem", unit="MiB"``). Raises QuantityError."""
    value = _value(raw, name=name, unit=unit)
    if value != value.to_integral_value():
        raise QuantityError(f"{name} is in {unit}: {raw!r} is not a whole number")
    if value < 0:
        raise QuantityError(f"{name} is in {unit}: {raw!r} is negative")
    return int(value)


def _value(raw: object, *, name: str, unit: str, binary: bool = False) -> Decimal:
    """The number a quantity denotes, sign kept; binary suffixes (Ki, Mi...) only where `binary`."""
    if isinstance(raw, bool):
        raise QuantityError(f"{name} is in {unit}: {raw!r} is not a number")
    if isinstance(raw, int):
        return Decimal(raw)
    return _decimal(str(raw).strip(), raw, name=name, unit=unit, binary=binary)


def _decimal(text: str, raw: object, *, name: str, unit: str, binary: bool) -> Decimal:
    match = _GRAMMAR.match(text)
    if match is None:
        raise QuantityError(f"{name} is in {unit}: {raw!r} is not a Kubernetes quantity")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix in _BINARY_SUFFIXES:
        if not binary:
            raise QuantityError(f"{name} is in {unit}: {raw!r} has a binary (byte) suffix; write the count of {unit}")
        return Decimal(number) * (1 << _BINARY_EXPONENT[suffix])
    if suffix[:1] in ("e", "E"):
        exponent = int(suffix[1:])
    else:
        exponent = _DECIMAL_SUFFIX[suffix]
    if abs(exponent) > _EXPONENT_MAX:
        raise QuantityError(f"{name} is in {unit}: {raw!r} is out of range")
    try:
        return Decimal(number).scaleb(exponent)
    except InvalidOperation:
        raise QuantityError(f"{name} is in {unit}: {raw!r} is not a Kubernetes quantity") from None


# ---- host resources: CPU and memory, as kube-scheduler reads them ------------------------------

MIB = 1 << 20


def cpu_milli_quantity(raw: object, *, name: str = "cpu") -> int:
    """A CPU quantity in millicores, rounded up as Kubernetes does (``100m``, ``0.5``, ``2``;
    ``1.0001`` is 1001). Raises QuantityError for a negative value, a binary suffix or no quantity."""
    value = _host_decimal(raw, name=name, unit="cores", binary=False)
    return int((value * 1000).to_integral_value(rounding="ROUND_CEILING"))


def memory_mib_quantity(raw: object, *, name: str = "memory", round_up: bool = True) -> int:
    """A memory quantity (bytes: ``512Mi``, ``1Gi``, ``1e9``, ``2G``) in whole MiB, rounded up
    (what a pod asks is never under-counted) or, `round_up` False, down (what a node offers is
    never over-counted). Raises QuantityError like `cpu_milli_quantity`."""
    value = _host_decimal(raw, name=name, unit="bytes", binary=True)
    return int((value / MIB).to_integral_value(rounding="ROUND_CEILING" if round_up else "ROUND_FLOOR"))


def _host_decimal(raw: object, *, name: str, unit: str, binary: bool) -> Decimal:
    value = _value(raw, name=name, unit=unit, binary=binary)
    if value < 0:
        raise QuantityError(f"{name} is in {unit}: {raw!r} is negative")
    return value
