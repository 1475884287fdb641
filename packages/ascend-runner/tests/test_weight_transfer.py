"""The weight-transfer engines: init / update info checks, the chunk plan, pack / unpack, and a real round trip
over a 2-process gloo group on 127.0.0.1 (the trainer in a child process, the worker engine here)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_ascend.runner.weight_transfer import (
    ALIGN,
    CollectiveInitInfo,
    CollectiveUpdateInfo,
    CollectiveWeightTransferEngine,
    GlooTrainerInitInfo,
    HcclTrainerInitInfo,
    WeightTransferError,
    pack,
    plan_chunks,
    unpack,
)

WIRE = dict(master_address="127.0.0.1", master_port=29500, world_size=3)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"master_address": ""},
            "init_info.master_address='' is invalid; allowed: a host name or IP address",
        ),
        ({"master_port": 70000}, "init_info.master_port=70000 is invalid; allowed: an integer in [1, 65535]"),
        ({"world_size": 1}, "init_info.world_size=1 is invalid; allowed: an integer >= 2"),
        ({"packed": "yes"}, "init_info.packed='yes' is invalid; allowed: True or False"),
        (
            {"packed_buffer_size_bytes": 8},
            f"init_info.packed_buffer_size_bytes=8 is invalid; allowed: an integer in [{ALIGN}, ",
        ),
        ({"timeout_s": 0}, "init_info.timeout_s=0 is invalid; allowed: a positive number of seconds"),
        ({"rank_offset": 0}, "init_info.rank_offset=0 is invalid; allowed: an integer in [1, world_size=3)"),
        ({"rank_offset": 3}, "init_info.rank_offset=3 is invalid; allowed: an integer in [1, world_size=3)"),
    ],
)
def test_worker_init_info_names_the_bad_field(override, message):
    with pytest.raises(WeightTransferError) as info:
        CollectiveInitInfo(**{**WIRE, "rank_offset": 1, **override})
    assert str(info.value).startswith(message), str(info.value)


def test_trainer_init_info_is_checked_and_dispatches_by_backend():
    assert GlooTrainerInitInfo(rank=0, **WIRE).backend == "gloo"
    assert HcclTrainerInitInfo(rank=0, **WIRE).backend == "hccl"
    with pytest.raises(WeightTransferError, match=r"trainer init_info.master_port=0 is invalid"):
        GlooTrainerInitInfo(rank=0, **{**WIRE, "master_port": 0})
    with pytest.raises(
        WeightTransferError, match=r"trainer init_info.rank=-1 is invalid; allowed: an integer >= 0"
    ):
        GlooTrainerInitInfo(rank=-1, **WIRE)


def _engine(model=None, rank=0, dp_index=0, world_size=1, backend="gloo"):
    vllm_config = SimpleNamespace(
        parallel_config=SimpleNamespace(data_parallel_index=dp_index, world_size=world_size, rank=rank),
        model_config=None,
    )
    return CollectiveWeightTransferEngine(
        SimpleNamespace(backend=backend), vllm_config, torch.device("cpu"), model
    )


def test_engine_parses_infos_with_clear_errors():
    engine = _engine()
    with pytest.raises(WeightTransferError) as info:
        engine.parse_init_info({**WIRE, "rank_offset": 1, "nccl_unique_id_b64": "x"})
    assert "nccl_unique_id_b64" in str(info.value) and "allowed fields: master_address, master_port" in str(
        info.value
    )
    with pytest.raises(
        WeightTransferError, match=r"update_info.dtype_names\[0\]='complex64' is invalid; allowed: "
    ):
        engine.parse_update_info({"names": ["w"], "dtype_names": ["complex64"], "shapes": [[2]]})
    with pytest.raises(
        WeightTransferError,
        match=r"update_info.shapes has 0 entries; allowed: a list of 1 entries, one per name",
    ):
        engine.parse_update_info({"names": ["w"], "dtype_names": ["float32"], "shapes": []})
    with pytest.raises(WeightTransferError, match=r"update_info.shapes\[0\]=\[-1\] is invalid"):
        engine.parse_update_info({"names": ["w"], "dtype_names": ["float32"], "shapes": [[-1]]})
    with pytest.raises(
        WeightTransferError, match=r"weight_transfer_config.backend='nccl' is not this engine's"
    ):
        _engine(backend="nccl")


def test_worker_rank_follows_vllm_numbering():
    """``rank_offset + dp_index * world_size + rank``; a group too small for this worker is refused by name."""
    engine = _engine(rank=1, dp_index=1, world_size=2)
    info = CollectiveInitInfo(**{**WIRE, "world_size": 4, "rank_offset": 1})
    assert engine.worker_rank(info) == 4
    with pytest.raises(WeightTransferError, match=r"init_info.world_size=4 is invalid; allowed: > 4"):
        engine.init_transfer_engine(info)


SPECS = [
    ("a", torch.float32, (3, 5)),  # 60 bytes
    ("b", torch.bfloat16, (7,)),  # 14 bytes
    ("c", torch.int64, ()),  # 8 bytes
    ("big", torch.float32, (40,)),  # 160 bytes: larger than the buffer
    ("d", torch.uint8, (0,)),
    ("e", torch.float16, (3,)),
]


def test_chunk_plan_packs_aligned_and_sends_large_tensors_alone():
    chunks = plan_chunks(SPECS, 128)
    assert [(c.first, c.offsets, c.nbytes) for c in chunks] == [
        (0, (0, 64, 80), 88),
        (3, (0,), 160),
        (4, (0, 0), 6),
    ]
    assert all(offset % ALIGN == 0 for c in chunks for offset in c.offsets)
    unpacked = plan_chunks(SPECS, None)
    assert [(c.first, len(c.offsets)) for c in unpacked] == [(i, 1) for i in range(len(SPECS))]


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, dtype, shape in SPECS:
        if dtype.is_floating_point:
            out[name] = torch.randn(shape, generator=gen).to(dtype)
        else:
            out[name] = torch.randint(0, 100, shape, generator=gen).to(dtype)
    return out


def test_pack_unpack_round_trip():
    tensors = _tensors()
    names = list(tensors)
    for chunk in plan_chunks(SPECS, 128):
        batch = [tensors[n] for n in names[chunk.first : chunk.first + len(chunk.offsets)]]
        got = unpack(pack(batch, chunk, torch.device("cpu")), chunk, SPECS)
        for (name, tensor), sent in zip(got, batch, strict=True):
            assert tensor.dtype == sent.dtype and torch.equal(tensor, sent), name


def test_update_info_from_metadata():
    from vllm.distributed.weight_transfer.base import ParamMeta

    info = CollectiveUpdateInfo.from_meta([ParamMeta("w", torch.bfloat16, (2, 3))])
    assert (info.names, info.dtype_names, info.shapes) == (["w"], ["bfloat16"], [[2, 3]])
    assert info.specs() == [("w", torch.bfloat16, (2, 3))]


class _RecordingModel(torch.nn.Module):
    """Records what ``load_weights`` received (copies: the chunk buffers are views)."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: dict[str, torch.Tensor] = {}
        self.batches = 0

    def load_weights(self, weights):
        self.batches += 1
        for name, tensor in weights:
            self.loaded[name] = tensor.clone()


@pytest.mark.parametrize(("packed", "batches"), [(True, 3), (False, len(SPECS))])
def test_two_process_gloo_round_trip(tmp_path, packed, batches):
    """A trainer process (rank 0, vLLM's trainer factory → our gloo engine) sends a state dict twice; this
    process's worker engine (rank 1) receives every tensor bit for bit, packed in 128-byte chunks or one by one."""
    from vllm_ascend.testing.weight_sync import run_trainer

    sent = _tensors(seed=3)
    torch.save(sent, tmp_path / "state.pt")
    model = _RecordingModel()
    engine = _engine(model)
    handlers = {
        "init_weight_transfer_engine": lambda info: engine.init_transfer_engine(engine.parse_init_info(info)),
        "start_weight_update": lambda: None,
        "update_weights": lambda info: engine.receive_weights(engine.parse_update_info(info)),
        "finish_weight_update": lambda: None,
    }
    spec = {
        "backend": "gloo",
        "world_size": 2,
        "packed": packed,
        "packed_buffer_size_bytes": 128,
        "state_dict": str(tmp_path / "state.pt"),
        "rounds": 2,
    }
    try:
        report, output = run_trainer(spec, handlers, timeout_s=60, env={"VLLM_ASCEND_DEVICE": "reference"})
    finally:
        engine.shutdown()
    assert report == {"engine": "CollectiveTrainerWeightTransferEngine", "tensors": len(SPECS)}, output[
        -3000:
    ]
    assert model.batches == 2 * batches
    assert list(model.loaded) == list(sent)
    for name, tensor in sent.items():
        assert model.loaded[name].dtype == tensor.dtype and torch.equal(model.loaded[name], tensor), name
