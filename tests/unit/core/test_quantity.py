"""rocshare.core.quantity: quantities read as the API server writes them (its canonical forms),
whole counts accepted in any spelling, everything else refused with the unit."""

from __future__ import annotations

import pytest

from rocshare.core.quantity import QuantityError, whole_quantity


@pytest.mark.parametrize(("raw", "value"), [
    ("3000", 3000), ("3k", 3000), ("3e3", 3000), ("3E3", 3000), ("8k", 8000), ("40k", 40000), ("1k", 1000),
    ("24k", 24000), ("10k", 10000), ("1M", 1_000_000), ("3000000m", 3000), ("1.5k", 1500), ("0", 0), ("+7", 7),
    (" 12 ", 12), (42, 42), ("0.000003M", 3), ("300e-2", 3),
])
def test_whole_numbers_in_any_canonical_form(raw, value) -> None:
    assert whole_quantity(raw, name="amd.com/gpumem", unit="MiB") == value


@pytest.mark.parametrize(("raw", "why"), [
    ("1.5", "is not a whole number"), ("12.5", "is not a whole number"), ("1500m", "is not a whole number"),
    ("-1", "is negative"), ("8Gi", "binary (byte) suffix"), ("1Ki", "binary (byte) suffix"),
    ("lots", "is not a Kubernetes quantity"), ("", "is not a Kubernetes quantity"), ("1 k", "is not a Kubernetes"),
    ("1e999", "out of range"), (True, "is not a number"),
])
def test_anything_else_is_refused_with_the_value_and_the_unit(raw, why) -> None:
    with pytest.raises(QuantityError) as refused:
        whole_quantity(raw, name="amd.com/gpumem", unit="MiB")
    assert str(refused.value).startswith("amd.com/gpumem is in MiB: ") and why in str(refused.value)
    assert repr(raw) in str(refused.value)
