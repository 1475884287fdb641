"""``additional_config.enable_cpu_binding`` through vLLM on the reference device: the worker binds its
process to its share of the allowed CPUs (the reference profile's ``average`` mode; one local rank
gets the whole allowed set). Without the option nothing is bound."""

from __future__ import annotations

import os


def test_enable_cpu_binding_binds_the_worker(make_llm, tiny_qwen3, monkeypatch):
    from vllm import SamplingParams

    from vllm_ascend.core.device.config import get_current_hardware_profile
    from vllm_ascend.core.device.profile import CPUBindingMode
    from vllm_ascend.runner.cpu_binding import plan_cpus

    before = os.sched_getaffinity(0)
    calls: list[tuple[int, set[int]]] = []
    real = os.sched_setaffinity

    def spy(pid, cpus):
        calls.append((pid, set(cpus)))
        real(pid, cpus)

    monkeypatch.setattr(os, "sched_setaffinity", spy)
    try:
        make_llm(tiny_qwen3)
        assert calls == []  # binding is off by default

        llm = make_llm(tiny_qwen3, additional_config={"enable_cpu_binding": True})
        assert get_current_hardware_profile().cpu_binding is CPUBindingMode.AVERAGE
        expected = set(plan_cpus(CPUBindingMode.AVERAGE, 0, 1, before))
        assert calls == [(0, expected)]  # applied once, by the worker's init_device
        assert os.sched_getaffinity(0) == expected
        out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 4  # the bound worker serves
    finally:
        real(0, before)


def test_the_reference_device_serves_with_its_share_of_the_cpus(make_llm, tiny_qwen3, monkeypatch):
    """vLLM's worker drops torch to one thread after loading; on the reference device (torch's CPU ops are the
    device) the worker gives the rank its share of the usable CPUs, unless the user set OMP_NUM_THREADS."""
    import torch
    from vllm import SamplingParams
    from vllm.utils.torch_utils import OMP_NUM_THREADS_SET_BY_VLLM, startup_omp_num_threads

    original = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.delenv(OMP_NUM_THREADS_SET_BY_VLLM, raising=False)
        llm = make_llm(tiny_qwen3)
        assert torch.get_num_threads() == startup_omp_num_threads(1)  # this process's usable CPUs, one rank
        out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 4

        torch.set_num_threads(3)
        monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice: vLLM keeps it, so does the worker
        make_llm(tiny_qwen3)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(original)
