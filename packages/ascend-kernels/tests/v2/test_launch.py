"""How a V2 override picks its code: the Triton kernel, or a torch reference, which on the cpu is served by
its host form where its module has one (found by name: ``<x>_torch`` -> ``<x>_host``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_ascend.kernels._backend import ENV_BACKEND
from vllm_ascend.kernels.v2 import block_table, input_batch, sample_gumbel
from vllm_ascend.kernels.v2._launch import dispatch_v2, host_flat, lanes


@pytest.mark.parametrize(
    ("module", "name"),
    [
        (block_table, "gather_block_tables"),
        (block_table, "compute_slot_mappings"),
        (input_batch, "prepare_pos_seq_lens"),
        (input_batch, "post_update"),
        (sample_gumbel, "gumbel_sample"),
    ],
)
def test_the_cpu_serves_a_reference_by_its_host_form(
    monkeypatch: pytest.MonkeyPatch, module, name: str
) -> None:
    monkeypatch.setenv(ENV_BACKEND, "torch")  # the references, whatever Triton this lane has
    short = module.__name__.rsplit(".", 1)[-1]
    reference = getattr(module, f"{name}_torch")
    assert dispatch_v2(short, name, reference, torch.device("cpu")) is getattr(module, f"{name}_host")
    assert dispatch_v2(short, name, reference, torch.device("meta")) is reference  # not the host: the spec


def test_a_reference_without_a_host_form_serves_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_BACKEND, "torch")
    reference = input_batch.prepare_prefill_inputs_torch
    assert hasattr(input_batch, "prepare_prefill_inputs_host")

    def nothing_torch() -> None:
        """A reference whose module has no host form."""

    assert dispatch_v2("block_table", "nothing", nothing_torch, torch.device("cpu")) is nothing_torch
    # A host form passed as the reference (the tests' "host" form) is served as it is.
    host = input_batch.prepare_prefill_inputs_host
    assert dispatch_v2("input_batch", "prepare_prefill_inputs", host, torch.device("cpu")) is host
    assert dispatch_v2("input_batch", "prepare_prefill_inputs", reference, torch.device("cpu")) is host


@pytest.mark.parametrize(
    ("counts", "cap", "rows", "lanes_"),
    [
        ([3], None, [0, 0, 0], [0, 1, 2]),
        ([3], 2, [0, 0], [0, 1]),
        ([-1], None, [], []),
        ([0], 4, [], []),
        ([2, -1, 0, 3], None, [0, 0, 3, 3, 3], [0, 1, 0, 1, 2]),
        ([2, 5, 1], 2, [0, 0, 1, 1, 2], [0, 1, 0, 1, 0]),
    ],
)
def test_lanes_flatten_each_rows_work_in_row_order(counts, cap, rows, lanes_) -> None:
    """One row (its own short path) and several give the same (row, lane) pairs, counts clamped to [0, cap]."""
    row, j = lanes(np.array(counts, dtype=np.int64), cap)
    assert row.tolist() == rows and j.tolist() == lanes_
    assert row.dtype == j.dtype == np.intp


def test_host_flat_is_a_view_or_refused() -> None:
    table = torch.arange(12, dtype=torch.int64).view(4, 3)
    flat = host_flat(table[:, :1])  # a column of stride 3: viewable as 1-D
    flat[1] = -7
    assert table[1, 0] == -7 and flat.tolist() == [0, -7, 6, 9]
    with pytest.raises(ValueError, match="copy"):
        host_flat(table[:, :2])  # no 1-D view exists: refused, as torch's view(-1) refuses
