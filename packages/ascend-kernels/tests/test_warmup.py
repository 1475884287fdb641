"""Warm-up runs every built-in item, tolerates and reports failures, and rejects unknown names."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from vllm_ascend.kernels import warmup


def test_kernel_warmup_runs_the_built_in_items():
    assert warmup.kernel_warmup("cpu", 64, (torch.float32, torch.bfloat16)) == {
        "sampling": True,
        "penalties": True,
        "rejection": True,
        "ngram": True,
    }


def test_qk_rms_warms_every_block_m_per_head_dim(monkeypatch):
    """Given the model's head sizes, ``qk_rms`` runs every ``BLOCK_M`` variant for each of them."""
    from vllm_ascend.kernels._triton import rms_norm as rms_triton

    seen = []
    real = rms_triton._q_rms_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append((kwargs["D"], kwargs["BLOCK_M"]))
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(rms_triton, "_q_rms_kernel", Spy())
    result = warmup.kernel_warmup("cpu", 32, (torch.bfloat16,), include=("qk_rms",), head_dims=(64, 96))
    assert result == {"qk_rms": True}
    assert sorted(seen) == sorted((d, b) for d in (64, 96) for b in (1, 2, 4, 8, 16))


def test_a_failing_item_is_logged_and_the_rest_continue(monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(warmup, "_REGISTERED", {})

    def broken(device, vocab_size, dtypes):
        raise RuntimeError("no kernel for you")

    warmup.register_warmup("rejection", broken)
    warmup.register_warmup(
        "qk_rms", lambda device, vocab_size, dtypes: calls.append((device.type, vocab_size))
    )
    plugin_logger = logging.getLogger("vllm_ascend")  # does not propagate to the root logger
    plugin_logger.addHandler(caplog.handler)
    try:
        result = warmup.kernel_warmup("cpu", 32, include=("rejection", "qk_rms"))
    finally:
        plugin_logger.removeHandler(caplog.handler)
    assert result == {"rejection": False, "qk_rms": True}
    assert calls == [("cpu", 32)]
    assert "kernel warm-up 'rejection' failed" in caplog.text


def test_unknown_items_are_rejected():
    with pytest.raises(ValueError, match=r"unknown warm-up items \['nope'\]"):
        warmup.kernel_warmup("cpu", 32, include=("nope",))
    with pytest.raises(
        ValueError,
        match=r"unknown warm-up items \['qk_rms'\].*known: \['ngram', 'penalties', 'rejection', 'sampling'\]",
    ):
        warmup.kernel_warmup("cpu", 32, exclude=("qk_rms",))  # only an item with head_dims given


def test_excluded_items_do_not_run(monkeypatch):
    monkeypatch.setattr(warmup, "_REGISTERED", {})
    assert warmup.kernel_warmup("cpu", 32, exclude=("rejection", "sampling", "ngram")) == {"penalties": True}


def test_compiled_triton_warms_every_tile_and_split_variant(monkeypatch):
    """On an H200-like geometry (132 SMs): both search tiles (up to and above SMALL_BATCH_ROWS), rows
    split and unsplit for the per-row kernels (below / from the SM count) and for top-k/top-p (below /
    from PROGRAMS_PER_SM programs per SM)."""
    from vllm_ascend.kernels import _geometry
    from vllm_ascend.kernels._triton import common

    cpu = torch.device("cpu")
    assert warmup._batch_sizes(cpu) == (2,)  # interpreter: one variant
    monkeypatch.setattr(common, "IS_INTERPRETED", False)
    monkeypatch.setattr(_geometry, "geometry", lambda device: _geometry.LaunchGeometry("cuda", 132))
    assert warmup._batch_sizes(cpu) == (2, common.SMALL_BATCH_ROWS, common.SMALL_BATCH_ROWS + 1, 132, 528)
    monkeypatch.setattr(_geometry, "geometry", lambda device: _geometry.LaunchGeometry("npu", 48, 192 * 1024))
    assert warmup._batch_sizes(cpu) == (2, 48, common.SMALL_BATCH_ROWS + 1)
    monkeypatch.setenv("VLLM_ASCEND_KERNEL_BACKEND", "torch")
    assert warmup._batch_sizes(cpu) == (2,)


def test_every_split_batch_shares_one_chunk_tile(monkeypatch):
    """The top-k/top-p search reads its chunk statistics with one tile width for every split batch
    (1 for unsplit rows), so batch sizes the warm-up did not run compile nothing new."""
    from vllm_ascend.kernels import _geometry
    from vllm_ascend.kernels._triton import top_k_top_p as tkp

    cpu = torch.device("cpu")
    monkeypatch.setattr(_geometry, "geometry", lambda device: _geometry.LaunchGeometry("cuda", 132))
    block = 2048
    tiles = {}
    for rows in (1, 2, 7, 64, 100, 128, 129, 132, 300, 527, 528, 1024):
        chunks = tkp.row_split(rows, 151936, block, cpu)[0]
        summary = tkp.Summary(block, chunks, 0, 0, None, 0, 0, None, None, None, None)
        tiles[rows] = tkp.search_settings(rows, 151936, summary, cpu)[1]["CHUNKS"]
    assert {rows: tile for rows, tile in tiles.items() if rows < 528} == dict.fromkeys(
        (1, 2, 7, 64, 100, 128, 129, 132, 300, 527), 128
    )
    assert tiles[528] == tiles[1024] == 1


def test_warmup_command_fills_the_cache_dir_it_names(tmp_path, monkeypatch, capsys):
    """``vllm-ascend warmup`` (registered by this package's extension) sets ``TRITON_CACHE_DIR`` to the
    directory it is given and reports every item; on the cpu the references run (nothing to cache)."""
    from vllm_ascend.core.cli import main

    monkeypatch.setenv("TRITON_CACHE_DIR", "/nonexistent")
    cache = tmp_path / "cache"
    status = main(["warmup", "--cache-dir", str(cache), "--vocab-size", "48", "--device", "cpu",
                   "--dtypes", "float32,bfloat16", "--head-dims", "64", "--exclude", "rejection"])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    report = json.loads(lines[0])
    assert status == 0
    assert os.environ["TRITON_CACHE_DIR"] == str(cache) == report["cache_dir"]
    assert report["items"] == {"sampling": True, "penalties": True, "ngram": True, "qk_rms": True}
    assert report["workers"] == 1 and report["cache_files"] == 0
    assert lines[1].startswith(f"export TRITON_CACHE_DIR={cache}")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dtypes", "float64"], "--dtypes 'float64': allowed values are float32, bfloat16, float16"),
        (["--workers", "0"], "expected comma-separated positive integers, got '0'"),
        (["--head-dims", "128,x"], "expected comma-separated positive integers, got '128,x'"),
    ],
)
def test_warmup_command_refuses_bad_arguments(tmp_path, capsys, argv, message):
    from vllm_ascend.core.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["warmup", "--cache-dir", str(tmp_path), "--vocab-size", "48", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
