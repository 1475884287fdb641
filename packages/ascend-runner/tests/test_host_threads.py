"""The serving thread count: the rank's share of the usable CPUs where the device computes on the host, vLLM's
one thread elsewhere, the user's OMP_NUM_THREADS always."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.utils.torch_utils import OMP_NUM_THREADS_SET_BY_VLLM, available_cpu_count

from vllm_ascend.kernels.device import A2A3DeviceAdaptor, ReferenceDeviceAdaptor
from vllm_ascend.runner.host_threads import apply_serving_threads, serving_threads


def test_a_host_computing_device_gets_its_share_of_the_cpus():
    assert ReferenceDeviceAdaptor.computes_on_host and not A2A3DeviceAdaptor.computes_on_host
    reference = ReferenceDeviceAdaptor()
    assert serving_threads(reference, 1, {}) == available_cpu_count()
    assert serving_threads(reference, 2, {}) == max(1, available_cpu_count() // 2)
    assert serving_threads(reference, 10_000, {}) == 1  # never none
    # vLLM's own OMP_NUM_THREADS for its worker processes is not the user's choice.
    assert serving_threads(reference, 1, {"OMP_NUM_THREADS": "1", OMP_NUM_THREADS_SET_BY_VLLM: "1"}) == (
        available_cpu_count()
    )


def test_the_users_threads_and_other_devices_keep_vllms_count():
    reference = ReferenceDeviceAdaptor()
    assert serving_threads(reference, 1, {"OMP_NUM_THREADS": "1"}) is None
    assert serving_threads(reference, 1, {"OMP_NUM_THREADS": "4", OMP_NUM_THREADS_SET_BY_VLLM: "0"}) is None
    npu = SimpleNamespace(computes_on_host=A2A3DeviceAdaptor.computes_on_host, family="A2/A3")
    assert serving_threads(npu, 1, {}) is None  # type: ignore[arg-type]


def test_apply_sets_torchs_threads(monkeypatch):
    original = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        torch.set_num_threads(1)
        apply_serving_threads(ReferenceDeviceAdaptor(), 1)
        assert torch.get_num_threads() == available_cpu_count()
        torch.set_num_threads(1)
        npu = SimpleNamespace(computes_on_host=False, family="A2/A3")
        apply_serving_threads(npu, 1)  # type: ignore[arg-type]
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(original)
