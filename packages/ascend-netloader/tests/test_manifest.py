"""Manifest: built from a state dict, round-tripped, and every peer mistake reported by name."""

from __future__ import annotations

import copy
import hashlib

import pytest
import torch

from vllm_ascend.netloader.manifest import (
    FORMAT,
    Manifest,
    ManifestError,
    WeightMismatch,
    check_expected,
    dtype_name,
    spec_of,
)


def _state_dict():
    torch.manual_seed(0)
    return {
        "a.weight": torch.randn(3, 4, dtype=torch.bfloat16),
        "a.bias": torch.randn(3),
        "q": torch.randint(-128, 127, (5,), dtype=torch.int8),
        "t": torch.randn(4, 6)[:, ::2],  # not contiguous
        "scalar": torch.tensor(7, dtype=torch.int64),
    }


def test_from_state_dict_layout_and_round_trip():
    sd = _state_dict()
    manifest, data = Manifest.from_state_dict(sd)
    d = manifest.to_dict()
    assert d["format"] == FORMAT
    assert [(t["name"], t["dtype"], t["shape"], t["offset"], t["nbytes"]) for t in d["tensors"]] == [
        ("a.weight", "bfloat16", [3, 4], 0, 24),
        ("a.bias", "float32", [3], 24, 12),
        ("q", "int8", [5], 36, 5),
        ("t", "float32", [4, 3], 41, 48),
        ("scalar", "int64", [], 89, 8),
    ]
    assert d["total_bytes"] == manifest.total_bytes == 97
    assert d["tensors"][3]["sha256"] == hashlib.sha256(sd["t"].contiguous().numpy().tobytes()).hexdigest()
    assert bytes(data["scalar"]) == (7).to_bytes(8, "little")
    assert Manifest.from_dict(d) == manifest
    assert manifest.entry("q").empty().dtype == torch.int8
    assert [e.name for e in manifest.select(["scalar", "a.weight"])] == ["a.weight", "scalar"]


def test_unknown_entries_and_targets():
    manifest, _ = Manifest.from_state_dict(_state_dict())
    with pytest.raises(KeyError, match="tensor 'x' is not in the manifest \\(5 tensors\\)"):
        manifest.entry("x")
    with pytest.raises(ManifestError) as info:
        manifest.select(["q", "x", "y"])
    assert info.value.problems == [
        "tensor 'x' is not served by the seed",
        "tensor 'y' is not served by the seed",
    ]
    with pytest.raises(ManifestError) as info:
        manifest.entry("a.weight").check_target(torch.empty(4, 3))
    assert str(info.value) == (
        "invalid weight manifest: 2 problems\n"
        "  - tensor 'a.weight': the seed serves bfloat16, the target is torch.float32\n"
        "  - tensor 'a.weight': the seed serves shape [3, 4], the target has [4, 3]"
    )
    with pytest.raises(
        ManifestError, match=r"dtype torch\.complex64 cannot be served; allowed: float64, float32"
    ):
        dtype_name(torch.complex64)


def _problems(data) -> list[str]:
    with pytest.raises(ManifestError) as info:
        Manifest.from_dict(data)
    return info.value.problems


def test_top_level_problems():
    assert _problems([1]) == ["manifest must be a JSON object, got list"]
    assert _problems({"format": "v0", "tensors": {}, "extra": 1}) == [
        "unknown key 'extra'; allowed: format, kind, total_bytes, tensors",
        "missing key 'total_bytes'",
        "format = 'v0': expected 'vllm-ascend-netloader-manifest/1'",
        "tensors must be a list, got dict",
    ]


def test_entry_problems_are_all_reported():
    good = Manifest.from_state_dict(_state_dict())[0].to_dict()
    bad = copy.deepcopy(good)
    t = bad["tensors"]
    t[0]["dtype"] = "float4"
    t[1]["shape"] = [3, -1]
    t[2]["sha256"] = "XYZ"
    t[3]["nbytes"] = 47
    t[4]["offset"] = 90
    bad["tensors"].append(
        {
            "name": "q",
            "dtype": "int8",
            "shape": [0],
            "offset": 97,
            "nbytes": 0,
            "sha256": "0" * 64,
            "extra": 1,
        }
    )
    bad["tensors"].append("oops")
    bad["tensors"].append({"name": "a.bias"})
    assert _problems(bad) == [
        "tensors[0] ('a.weight').dtype = 'float4': expected one of float64, float32, float16, bfloat16, "
        "float8_e4m3fn, float8_e5m2, int64, int32, int16, int8, uint8, bool",
        "tensors[1] ('a.bias').shape = [3, -1]: expected a list of non-negative integers",
        "tensors[2] ('q').sha256 = 'XYZ': expected 64 lowercase hex digits",
        "tensors[3] ('t').nbytes = 47: expected 48 (shape [4, 3] × 4 bytes of float32)",
        "tensors[4] ('scalar').offset = 90: expected 88 (tensors are laid out back to back in manifest order)",
        "tensors[5] ('q'): unknown key 'extra'; allowed: name, dtype, shape, offset, nbytes, sha256",
        "tensors[6] must be an object, got str",
        "tensors[7] ('a.bias'): missing key 'dtype'",
        "tensors[7] ('a.bias'): missing key 'shape'",
        "tensors[7] ('a.bias'): missing key 'offset'",
        "tensors[7] ('a.bias'): missing key 'nbytes'",
        "tensors[7] ('a.bias'): missing key 'sha256'",
    ]


def test_duplicates_and_total_bytes():
    good = Manifest.from_state_dict(_state_dict())[0].to_dict()
    dup = copy.deepcopy(good)
    dup["tensors"][1]["name"] = "a.weight"
    assert _problems(dup) == ["tensors[1] ('a.weight'): duplicate tensor name"]
    wrong_total = copy.deepcopy(good)
    wrong_total["total_bytes"] = 96
    assert _problems(wrong_total) == ["total_bytes = 96: expected 97 (the sum of nbytes)"]


def test_kind_round_trip_and_refusal():
    live, _ = Manifest.from_state_dict(_state_dict(), kind="live")
    assert live.to_dict()["kind"] == "live"
    assert Manifest.from_dict(live.to_dict()) == live
    legacy = live.to_dict()
    del legacy["kind"]
    assert Manifest.from_dict(legacy).kind == "checkpoint"
    assert _problems(dict(live.to_dict(), kind="file")) == ["kind = 'file': expected one of checkpoint, live"]
    with pytest.raises(ManifestError, match="kind = 'x': expected one of checkpoint, live"):
        Manifest.from_state_dict({}, kind="x")


def test_check_expected_names_every_kind_of_mismatch():
    sd = _state_dict()
    manifest, _ = Manifest.from_state_dict(sd)
    expected = {name: spec_of(t) for name, t in sd.items()}
    check_expected(manifest, expected)  # the same tensors: nothing raised
    expected.update({f"m{i}": ("float32", (1,)) for i in range(5)})
    del expected["q"]
    expected["a.bias"] = ("float16", (3,))
    expected["t"] = ("float32", (2**40,))
    with pytest.raises(WeightMismatch) as info:
        check_expected(manifest, expected)
    err = info.value
    assert (err.missing, err.extra) == (["m0", "m1", "m2", "m3", "m4"], ["q"])
    assert str(err) == (
        "the seed does not serve this model's weights: 5 missing (m0, m1, m2, ... 2 more); "
        "1 unexpected (q); 2 with another dtype or shape ('a.bias': seed float32 [3], model float16 [3], "
        "'t': seed float32 [4, 3], model float32 [1099511627776])"
    )
    assert err.problems[0] == "tensor 'm0' is missing"
    assert err.problems[5] == "tensor 'q' is not a weight of this model"
