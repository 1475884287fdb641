"""Initial placement, expert maps, log2phy maps and expert-map JSON files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_ascend.eplb import (
    EplbInputError,
    expert_file_to_tensor,
    generate_global_placement,
    generate_log2phy_map,
)
from vllm_ascend.eplb.expert_map_file import expert_map_document, save_expert_map
from vllm_ascend.eplb.placement import generate_expert_map


def test_global_placement_exact():
    assert generate_global_placement(8, 2, 2).tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 0, 1]]
    assert generate_global_placement(4, 2, 0).tolist() == [[0, 1], [2, 3]]
    assert generate_global_placement(4, 3, 2, num_layers=2).tolist() == [[[0, 1], [2, 3], [0, 1]]] * 2


@pytest.mark.parametrize(
    "args, match",
    [
        ((9, 2, 0), r"num_experts \+ num_redundant_experts \(9\) must be divisible by num_ranks=2"),
        ((2, 2, 4), "would hold one expert twice"),
        ((0, 2, 0), "num_experts must be an integer >= 1"),
        ((8, 2, -2), "num_redundant_experts must be an integer >= 0"),
    ],
)
def test_impossible_placement_is_clear_error(args, match):
    with pytest.raises(EplbInputError, match=match):
        generate_global_placement(*args)


def test_expert_map_and_log2phy():
    table = generate_global_placement(8, 2, 2, num_layers=1)
    emap = generate_expert_map(table)
    assert emap[0, 0].tolist() == [0, 1, 2, 3, 4, -1, -1, -1]
    assert emap[0, 1].tolist() == [3, 4, -1, -1, -1, 0, 1, 2]
    log2phy = generate_log2phy_map(table)
    # own copies first; otherwise the single replica
    assert log2phy[0, 0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert log2phy[0, 1].tolist() == [8, 9, 2, 3, 4, 5, 6, 7]
    # rank 1 holds neither replica of experts 0/1: it takes replica 1 % 2; with tp_size 3 all ranks take replica 0
    table = generate_global_placement(4, 3, 2, num_layers=1)  # [[0,1],[2,3],[0,1]]
    assert generate_log2phy_map(table)[0, 1].tolist() == [4, 5, 2, 3]
    assert generate_log2phy_map(table, tp_size=3)[0, 1].tolist() == [0, 1, 2, 3]
    with pytest.raises(EplbInputError, match="tp_size must be a positive divisor"):
        generate_log2phy_map(table, tp_size=2)


def test_log2phy_is_consistent_on_random_tables():
    rng = np.random.default_rng(0)
    for _ in range(100):
        ranks, slots = int(rng.integers(2, 6)), int(rng.integers(2, 6))
        n = int(rng.integers(slots, ranks * slots + 1))
        table = generate_global_placement(n, ranks, ranks * slots - n, 1)
        shuffled = rng.permutation(table.ravel()).reshape(table.shape)
        if all(len(set(r.tolist())) == slots for r in shuffled[0]):
            table = shuffled
        log2phy = generate_log2phy_map(table)
        flat = table.reshape(-1)
        for r in range(ranks):
            # every logical expert routes to a physical slot that holds it
            assert np.array_equal(flat[log2phy[0, r]], np.arange(n))


def test_expert_map_file_roundtrip(tmp_path):
    table = generate_global_placement(8, 2, 2, num_layers=3)
    path = tmp_path / "map.json"
    save_expert_map(table, path)
    tensor, layers, ranks = expert_file_to_tensor(path)
    assert (layers, ranks) == (3, 2) and tensor.tolist() == table.tolist()
    assert json.loads(path.read_text())["layer_list"][0]["device_list"][1]["device_expert"] == [5, 6, 7, 0, 1]


def _doc():
    return expert_map_document(generate_global_placement(4, 2, 0, num_layers=2))


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda d: d.pop("moe_layer_count"), "root: missing field 'moe_layer_count'"),
        (
            lambda d: d.update(moe_layer_count=3),
            r"moe_layer_count=3 must be >= 1 and equal len\(layer_list\)=2",
        ),
        (lambda d: d["layer_list"][1].update(layer_id=5), r"layer_list\[1\].layer_id=5"),
        (lambda d: d["layer_list"][0].update(device_count="2"), r"layer_list\[0\].device_count must be int"),
        (
            lambda d: d["layer_list"][0]["device_list"][0].update(device_expert=[0, -1]),
            r"device_list\[0\].device_expert must be a non-empty list of expert ids in 0\.\.3 "
            r"\(the layer's 2 devices x 2 slots\)",
        ),
        # ids far past the slot count: refused before any array is sized by them
        (
            lambda d: d["layer_list"][1]["device_list"][1].update(device_expert=[0, 10**12]),
            r"layer_list\[1\].device_list\[1\].device_expert must be a non-empty list of expert ids in 0\.\.3",
        ),
        (
            lambda d: d["layer_list"][0]["device_list"][0].update(device_expert=[2**63 + 5, 1]),
            r"layer_list\[0\].device_list\[0\].device_expert must be a non-empty list of expert ids in 0\.\.3",
        ),
        (
            lambda d: d["layer_list"][0]["device_list"][0].update(device_expert=[4, 1]),
            r"device_list\[0\].device_expert must be a non-empty list of expert ids in 0\.\.3",
        ),
        (
            lambda d: d["layer_list"][0]["device_list"][0].update(device_expert=[0, 1, 2]),
            "same number of device_expert",
        ),
        (
            lambda d: d["layer_list"][0]["device_list"][0].update(device_expert=[0, 0]),
            "expert map layer 0 has no replica",
        ),
        (lambda d: d["layer_list"][0]["device_list"][1].pop("device_id"), "missing field 'device_id'"),
    ],
)
def test_malformed_expert_map_is_clear_error(tmp_path, mutate, match):
    doc = _doc()
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(EplbInputError, match=match):
        expert_file_to_tensor(path)


def test_unreadable_expert_map_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(EplbInputError, match="is not valid JSON"):
        expert_file_to_tensor(bad)
    with pytest.raises(EplbInputError, match="is unreadable: No such file or directory"):
        expert_file_to_tensor(tmp_path / "missing.json")


@pytest.mark.parametrize(
    "content, match",
    [
        (b"[" * 100_000 + b"]" * 100_000, r"is nested 100000 levels deep; at most 64 levels are allowed"),
        (b'{"moe_layer_count": NaN}', r"is not valid JSON: NaN is not a JSON number"),
        (b'{"moe_layer_count": Infinity}', r"is not valid JSON: Infinity is not a JSON number"),
        (
            b'{"moe_layer_count": 1' + b"0" * 5000 + b"}",
            r"is not valid JSON: Exceeds the limit \(4300 digits\)",
        ),
        (b'{"moe_layer_count": "\xff"}', r"is not UTF-8: byte 0xff at offset 21"),
    ],
    ids=["deep", "nan", "inf", "long-int", "utf8"],
)
def test_hostile_expert_map_files_are_eplb_errors_naming_the_path(tmp_path, content, match):
    path = tmp_path / "hostile.json"
    path.write_bytes(content)
    with pytest.raises(EplbInputError, match=match) as info:
        expert_file_to_tensor(path)
    assert str(info.value).startswith(f"expert map file {str(path)!r} ")


def test_oversize_expert_map_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(64 * 1024 * 1024 + 1)  # sparse: the size is checked from fstat, never read
    with pytest.raises(EplbInputError, match=r"is too large: 67108865 bytes; at most 67108864 are allowed"):
        expert_file_to_tensor(path)


@pytest.mark.parametrize(
    "table, match",
    [
        (
            [[[0, 10**12]]],
            r"holds expert id 1000000000000; a layer of 1 ranks x 2 slots can place ids 0\.\.1 only",
        ),
        ([[[0, 2**63 + 5]]], r"holds expert id 9\.22\d*e\+18; a layer of 1 ranks x 2 slots"),
        ([[[0, 2**70]]], r"must hold integer logical expert ids, got dtype object"),
        ([[[0.0, 1e300]]], r"holds expert id 1e\+300"),
    ],
)
def test_huge_expert_ids_are_range_checked_before_allocation(table, match):
    with pytest.raises(EplbInputError, match=match):
        generate_expert_map(table)
    with pytest.raises(EplbInputError, match=match):
        generate_log2phy_map(table)
