"""rocshare.core.quantity: quantities read as the API server writes them (its canonical forms),
whole counts accepted in any spelling, everything else refused with the unit."""

from __future__ import annotations

import pytest

from rocshare.core.quantity import QuantityError, cpu_milli_quantity, memory_mib_quantity, whole_quantity


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


# ---- host resources: CPU in millicores, memory in MiB ---------------------------------------------


@pytest.mark.parametrize(("raw", "milli"), [
    ("100m", 100), ("2", 2000), ("0.5", 500), ("1.0001", 1001), ("2k", 2_000_000), (4, 4000), ("0", 0), ("1e1", 10_000),
])
def test_cpu_in_millicores_rounded_up(raw, milli) -> None:
    assert cpu_milli_quantity(raw) == milli


@pytest.mark.parametrize(("raw", "mib", "floor_mib"), [
    ("1Gi", 1024, 1024), ("512Mi", 512, 512), ("1e9", 954, 953), ("2G", 1908, 1907), ("1", 1, 0), (1048576, 1, 1),
    ("1.5Gi", 1536, 1536), ("0", 0, 0),
])
def test_memory_in_mib_rounded_up_for_asks_and_down_for_offers(raw, mib, floor_mib) -> None:
    assert memory_mib_quantity(raw) == mib
    assert memory_mib_quantity(raw, round_up=False) == floor_mib


@pytest.mark.parametrize(("read", "raw", "why"), [
    (cpu_milli_quantity, "-1", "is negative"), (cpu_milli_quantity, "2Gi", "binary (byte) suffix"),
    (cpu_milli_quantity, "two", "is not a Kubernetes quantity"), (memory_mib_quantity, "-1Mi", "is negative"),
    (memory_mib_quantity, "1 Gi", "is not a Kubernetes quantity"), (memory_mib_quantity, True, "is not a number"),
])
def test_host_quantities_refuse_with_the_value(read, raw, why) -> None:
    with pytest.raises(QuantityError) as refused:
        read(raw, name="container 'main': x")
    assert str(refused.value).startswith("container 'main': x is in ") and why in str(refused.value)
