"""GPU marketing names: every capture in ../shared/fixtures/sysfs gets a non-empty, correct
name, and says where it came from — with libdrm's amdgpu.ids as Debian 12 installs it
(libdrm-common 2.4.114, which lacks MI300X, RX 7900 and Strix Point), with no table at all,
and with a newer table (a few lines written here in amdgpu.ids format, as current libdrm
spells them: synthetic, for the revision-exact path). Also the table parser and the
order of sources."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocshare_agent.discovery import discover
from rocshare_agent.discovery.names import (AMDGPU_IDS_ENV, SOURCE_BUILTIN, SOURCE_DRM, SOURCE_GENERIC, SOURCE_IDS,
                                            SOURCE_IDS_AMBIGUOUS, SOURCE_IDS_DEVICE, parse_amdgpu_ids, product_name)

DEBIAN_IDS = Path("/usr/share/libdrm/amdgpu.ids")
NEWER_IDS = """# List of AMDGPU IDs (synthetic excerpt in the format of libdrm's data/amdgpu.ids)
#
# Syntax:
# device_id,\trevision_id,\tproduct_name        <-- single tab after comma

1.0.0
150E,\tC1,\tAMD Radeon 890M Graphics
150E,\tC4,\tAMD Radeon 880M Graphics
6860,\t00,\tAMD Radeon Instinct MI25
6860,\t03,\tAMD Radeon Pro V340
740F,\t02,\tAMD Instinct MI210
744C,\tC8,\tAMD Radeon RX 7900 XTX
744C,\tCC,\tAMD Radeon RX 7900 XT
74A1,\t00,\tAMD Instinct MI300X
"""

# capture -> (name, source with Debian's table, source with no table, source with the newer table)
EXPECTED = {
    "mi210-8gpu-xgmi": ("AMD Instinct MI210", SOURCE_IDS_DEVICE, SOURCE_BUILTIN, SOURCE_IDS_DEVICE),
    "mi300x-8gpu-cpx": ("AMD Instinct MI300X", SOURCE_BUILTIN, SOURCE_BUILTIN, SOURCE_IDS_DEVICE),
    "rx7900xtx-kfd": ("AMD Radeon RX 7900 XTX", SOURCE_BUILTIN, SOURCE_BUILTIN, SOURCE_BUILTIN),  # 96 CUs = XTX
    "strixpoint-apu": ("AMD Radeon 880M Graphics", SOURCE_BUILTIN, SOURCE_BUILTIN, SOURCE_IDS),  # revision 0xc4
    "vega10-1gpu": ("AMD Radeon Instinct MI25", SOURCE_BUILTIN, SOURCE_BUILTIN, SOURCE_BUILTIN),  # 64 CUs, 16 GiB
}
DRM_ONLY_NAME = "AMD Radeon RX 7900 GRE / AMD Radeon RX 7900 XT / AMD Radeon RX 7900 XTX / AMD Radeon RX 7900M"


def test_every_capture_is_covered(sysfs):
    assert set(EXPECTED) | {"rx7900xtx-drm"} == {path.name for path in sysfs.iterdir() if path.is_dir()}


def _table(kind: str, tmp_path: Path) -> Path:
    if kind == "debian":
        if not DEBIAN_IDS.exists():
            pytest.skip(f"{DEBIAN_IDS} is not installed (Debian package libdrm-common; make test installs it)")
        return DEBIAN_IDS
    if kind == "none":
        return tmp_path / "absent.ids"
    path = tmp_path / "newer.ids"
    path.write_text(NEWER_IDS)
    return path


@pytest.mark.parametrize("kind", ["debian", "none", "newer"])
@pytest.mark.parametrize("capture", sorted(EXPECTED))
def test_capture_names(capture, kind, sysfs, tmp_path, monkeypatch):
    monkeypatch.setenv(AMDGPU_IDS_ENV, str(_table(kind, tmp_path)))
    name, *sources = EXPECTED[capture]
    source = sources[["debian", "none", "newer"].index(kind)]
    result = discover(sysfs / capture)
    assert result.gpus
    assert {(gpu.product, result.product_sources[gpu.id]) for gpu in result.gpus} == {(name, source)}
    assert {gpu["productSource"] for gpu in result.to_json_dict()["gpus"]} == {source}


@pytest.mark.parametrize("kind", ["debian", "none", "newer"])
def test_drm_only_capture_names_its_card_in_the_problem(kind, sysfs, tmp_path, monkeypatch):
    monkeypatch.setenv(AMDGPU_IDS_ENV, str(_table(kind, tmp_path)))
    result = discover(sysfs / "rx7900xtx-drm")
    names = [problem.reason for problem in result.problems if "card0" in problem.reason]
    # No revision file and no KFD node (no CU count): the card is one of the 0x744c boards; with
    # the newer excerpt (XTX and XT only) the name lists those two.
    expected = "AMD Radeon RX 7900 XT / AMD Radeon RX 7900 XTX" if kind == "newer" else DRM_ONLY_NAME
    assert names == [f"amdgpu card0 (0000:03:00.0, {expected}) has no KFD node: not usable for compute"]


def test_parse_amdgpu_ids_format():
    table = parse_amdgpu_ids("# comment\n\n1.0.0\n744C,\tC8,\tAMD Radeon RX 7900 XTX\n7481,   C7,     AMD Steam Machine\n"
                             "bad line\nZZZZ,\t00,\tnot hex\n6860,\t04,\tAMD Radeon Instinct MI25x2\n")
    assert table == {0x744C: {0xC8: "AMD Radeon RX 7900 XTX"}, 0x7481: {0xC7: "AMD Steam Machine"},
                     0x6860: {0x04: "AMD Radeon Instinct MI25x2"}}


def test_debian_table_parses_and_knows_the_mi210():
    if not DEBIAN_IDS.exists():
        pytest.skip(f"{DEBIAN_IDS} is not installed")
    table = parse_amdgpu_ids(DEBIAN_IDS.read_text())
    assert len(table) > 100 and table[0x740F] == {0x02: "AMD Instinct MI210"}


def test_order_of_sources():
    ids = {0x6860: {0x00: "AMD Radeon Instinct MI25", 0x03: "AMD Radeon Pro V340"}, 0x1234: {0x00: "AMD Only Name"}}
    assert product_name(device_id=0x6860, drm_name="AMD Instinct MI25 (DRM)", ids=ids).source == SOURCE_DRM
    exact = product_name(device_id=0x6860, revision=0x03, cu_count=64, ids=ids)
    assert (exact.name, exact.source) == ("AMD Radeon Pro V340", SOURCE_IDS)  # the revision beats the CU count
    assert product_name(device_id=0x1234, ids=ids).source == SOURCE_IDS_DEVICE
    assert product_name(device_id=0x6860, cu_count=64, ids=ids).source == SOURCE_BUILTIN
    ambiguous = product_name(device_id=0x6860, cu_count=56, ids=ids)  # not the MI25's 64: several names
    assert (ambiguous.name, ambiguous.source) == ("AMD Radeon Instinct MI25 / AMD Radeon Pro V340", SOURCE_IDS_AMBIGUOUS)
    unknown = product_name(device_id=0xABCD, ids=ids, gfx="gfx1201")
    assert (unknown.name, unknown.source) == ("AMD GPU abcd (gfx1201)", SOURCE_GENERIC)


# What users write in amd.com/use-gputype (docs/requesting-gpus.md, Annotations): case-insensitive substrings.
GPUTYPE_MATCHES = {
    "mi210-8gpu-xgmi": ("MI210", "instinct", "mi2"),
    "mi300x-8gpu-cpx": ("MI300X", "mi300", "Instinct MI300X"),
    "rx7900xtx-kfd": ("7900 XTX", "rx 7900", "radeon"),
    "strixpoint-apu": ("880M", "radeon 880m graphics"),
    "vega10-1gpu": ("MI25", "radeon instinct"),
}


@pytest.mark.parametrize("capture", sorted(EXPECTED))
def test_use_gputype_matches_the_names(capture, sysfs, tmp_path, monkeypatch):
    from rocshare.core.request import Selection

    monkeypatch.setenv(AMDGPU_IDS_ENV, str(_table("none", tmp_path)))
    product = discover(sysfs / capture).gpus[0].product.lower()
    for wanted in GPUTYPE_MATCHES[capture]:
        assert Selection(use_types=(wanted.lower(),)).accepts_product(product), (wanted, product)
        assert not Selection(nouse_types=(wanted.lower(),)).accepts_product(product)
    assert not Selection(use_types=("mi100",)).accepts_product(product)


# The MI300 series by PCI device id, as libdrm's current data/amdgpu.ids lists them (revision 00). Debian 13's libdrm-common 2.4.124 knows only 74A0, 74A1 and
# 74B5 of them: every other id must still get its real name from what rocshare ships.
MI300_SERIES = {
    0x74A0: "AMD Instinct MI300A", 0x74A1: "AMD Instinct MI300X", 0x74A2: "AMD Instinct MI308X",
    0x74A5: "AMD Instinct MI325X", 0x74A8: "AMD Instinct MI308X HF", 0x74A9: "AMD Instinct MI300X HF",
    0x74B5: "AMD Instinct MI300X VF", 0x74B6: "AMD Instinct MI308X", 0x74BD: "AMD Instinct MI300X HF",
}
TRIXIE_IDS_EXCERPT = {0x74A0: {0x00: "AMD Instinct MI300A"}, 0x74A1: {0x00: "AMD Instinct MI300X"},
                      0x74B5: {0x00: "AMD Instinct MI300X VF"}}


@pytest.mark.parametrize("device_id", sorted(MI300_SERIES))
def test_mi300_series_carry_their_real_names(device_id):
    for ids in ({}, TRIXIE_IDS_EXCERPT):
        named = product_name(device_id=device_id, revision=0x00, cu_count=80, ids=ids, gfx="gfx942")
        assert named.name == MI300_SERIES[device_id]
        assert named.source == (SOURCE_IDS if device_id in ids else SOURCE_BUILTIN)
        assert product_name(device_id=device_id, ids=ids).name == MI300_SERIES[device_id]  # KFD only: no revision


def test_an_mi308x_capture_is_named_and_matched(copy_capture, tmp_path, monkeypatch):
    """The MI300X capture with its KFD device id changed to the MI308X's 0x74a2 (29858)."""
    from rocshare.core.request import Selection

    capture = copy_capture("mi300x-8gpu-cpx")
    for properties in (capture / "class" / "kfd" / "kfd" / "topology" / "nodes").glob("*/properties"):
        properties.write_text(properties.read_text().replace("device_id 29857\n", "device_id 29858\n"))
    monkeypatch.setenv(AMDGPU_IDS_ENV, str(tmp_path / "absent.ids"))
    result = discover(capture)
    assert result.gpus and {(gpu.product, result.product_sources[gpu.id]) for gpu in result.gpus} == {
        ("AMD Instinct MI308X", SOURCE_BUILTIN)}
    product = result.gpus[0].product.lower()  # amd.com/use-gputype: MI308X (lower-cased as the request parser does)
    assert Selection(use_types=("mi308x",)).accepts_product(product)
    assert not Selection(use_types=("mi300x",)).accepts_product(product)
