"""The platform names vLLM the device communicator of the current adaptor (the adaptor's ``communicator_cls``)."""

from __future__ import annotations


def test_the_platform_names_the_adaptors_communicator(adaptor):
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from vllm_ascend.core.platform import ReferencePlatform
    from vllm_ascend.kernels.device.communicator import AscendDeviceCommunicator

    path = ReferencePlatform.get_device_communicator_cls()
    assert path == type(adaptor).communicator_cls
    assert resolve_obj_by_qualname(path) is AscendDeviceCommunicator
