"""SOC strings → families, and clear errors for unknown ones."""

from __future__ import annotations

import pytest

from vllm_ascend.core.device.family import (
    KNOWN_SOCS,
    AscendDeviceType,
    UnknownSocError,
    device_type_from_runtime_soc,
    device_type_from_soc_version,
)

EXPECTED = {
    "Ascend910B1": "A2",
    "Ascend910B2": "A2",
    "Ascend910B2C": "A2",
    "Ascend910B3": "A2",
    "Ascend910B4": "A2",
    "Ascend910B4-1": "A2",
    "Ascend910_9391": "A3",
    "Ascend910_9392": "A3",
    "Ascend910_9381": "A3",
    "Ascend910_9382": "A3",
    "Ascend910_9372": "A3",
    "Ascend910_9362": "A3",
    "Ascend310P1": "310P",
    "Ascend310P2": "310P",
    "Ascend310P3": "310P",
    "Ascend310P4": "310P",
    "Ascend310P5": "310P",
    "Ascend310P7": "310P",
}


def test_every_known_soc_is_covered_here():
    assert set(KNOWN_SOCS) == set(EXPECTED)


@pytest.mark.parametrize(("soc", "family"), sorted(EXPECTED.items()))
def test_compile_time_soc_version_maps_to_family(soc, family):
    assert device_type_from_soc_version(soc).value == family
    assert device_type_from_soc_version(soc.lower()).value == family  # CMake-style lower case


@pytest.mark.parametrize("soc", ["Ascend950PR_9599", "Ascend950DT_9591", "ascend950"])
def test_any_ascend950_variant_is_a5(soc):
    assert device_type_from_soc_version(soc) is AscendDeviceType.A5


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("Ascend910B3", "A2"),
        ("  Ascend910_9392\n", "A3"),
        ("Ascend310P3 (Atlas 300I Duo)", "310P"),
        ("Ascend950PR_9579", "A5"),
    ],
)
def test_runtime_soc_names(name, family):
    assert device_type_from_runtime_soc(name).value == family


@pytest.mark.parametrize("bad", ["Ascend910A", "Ascend910B9", "Ascend910_9999", "", "GeForce RTX 4090"])
def test_unknown_soc_is_a_clear_error_listing_the_known_ones(bad):
    with pytest.raises(UnknownSocError) as err:
        device_type_from_soc_version(bad)
    message = str(err.value)
    assert message.startswith(f"unknown SOC_VERSION {bad!r}; known: Ascend910B1, ")
    for soc in EXPECTED:
        assert soc in message
    assert "Ascend950* (any Ascend 950 variant)" in message
    with pytest.raises(UnknownSocError, match=r"^unknown runtime SOC name"):
        device_type_from_runtime_soc(bad)


@pytest.mark.parametrize(
    ("text", "member"),
    [("A2", "A2"), ("a3", "A3"), ("950", "A5"), ("310P", "_310P"), ("310p", "_310P"), ("Ascend910B1", "A2")],
)
def test_parse_family_names_and_socs(text, member):
    assert AscendDeviceType.parse(text) is AscendDeviceType[member]
    assert AscendDeviceType.parse(AscendDeviceType[member]) is AscendDeviceType[member]


def test_parse_rejects_unknown_family():
    with pytest.raises(UnknownSocError, match="unknown SOC_VERSION 'A9'"):
        AscendDeviceType.parse("A9")


def test_detection_and_family_parsing_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, vllm_ascend.core.device.detection, vllm_ascend.core.device.family as f; "
        "f.device_type_from_soc_version('Ascend910B1'); print(sorted(m for m in ('torch', 'torch_npu') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
