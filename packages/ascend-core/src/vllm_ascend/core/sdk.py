"""The core surface siblings build on: every name a sibling distribution imports from ``vllm_ascend.core``.

Like Airflow's ``airflow.sdk`` for providers: siblings import from this module only
(``from vllm_ascend.core.sdk import get_device_adaptor``), so core's modules can move without breaking them;
everything else in core is private to core (``tests/test_core_surface.py``). Names load lazily on first use,
so importing the surface costs nothing; the ``TYPE_CHECKING`` imports give type checkers the real
signatures. Adding a name here makes it public API: keep it stable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.core import envs
from vllm_ascend.core.lazy import lazy_exports

if TYPE_CHECKING:
    from vllm_ascend.core.child import run_module as run_module
    from vllm_ascend.core.child import signal_death as signal_death
    from vllm_ascend.core.config import ConfigError as ConfigError
    from vllm_ascend.core.config import Section as Section
    from vllm_ascend.core.config import get_ascend_config as get_ascend_config
    from vllm_ascend.core.config import get_section as get_section
    from vllm_ascend.core.config.jsonio import JsonInputError as JsonInputError
    from vllm_ascend.core.config.jsonio import read_json_file as read_json_file
    from vllm_ascend.core.config.schema import INT_MAX as INT_MAX
    from vllm_ascend.core.config.schema import option as option
    from vllm_ascend.core.config.schema import unknown_key_message as unknown_key_message
    from vllm_ascend.core.device.adaptor.base import FUSED_OPS as FUSED_OPS
    from vllm_ascend.core.device.adaptor.base import GROUP_LIST_TYPES as GROUP_LIST_TYPES
    from vllm_ascend.core.device.adaptor.base import RANDOM_SEED_BOUND as RANDOM_SEED_BOUND
    from vllm_ascend.core.device.adaptor.base import SCORING_FUNCS as SCORING_FUNCS
    from vllm_ascend.core.device.adaptor.base import WEIGHT_FORMATS as WEIGHT_FORMATS
    from vllm_ascend.core.device.adaptor.base import AttentionPlan as AttentionPlan
    from vllm_ascend.core.device.adaptor.base import BaseDeviceAdaptor as BaseDeviceAdaptor
    from vllm_ascend.core.device.adaptor.base import DeviceOpError as DeviceOpError
    from vllm_ascend.core.device.adaptor.base import GroupListType as GroupListType
    from vllm_ascend.core.device.adaptor.base import MoeDispatch as MoeDispatch
    from vllm_ascend.core.device.adaptor.base import WeightFormat as WeightFormat
    from vllm_ascend.core.device.adaptor.base import check_attention_plan as check_attention_plan
    from vllm_ascend.core.device.adaptor.base import check_choice as check_choice
    from vllm_ascend.core.device.adaptor.base import check_clipped_swiglu as check_clipped_swiglu
    from vllm_ascend.core.device.adaptor.base import check_group_bias as check_group_bias
    from vllm_ascend.core.device.adaptor.base import check_moe_gating as check_moe_gating
    from vllm_ascend.core.device.adaptor.base import check_mrope as check_mrope
    from vllm_ascend.core.device.adaptor.base import check_packed_attention as check_packed_attention
    from vllm_ascend.core.device.adaptor.base import check_window_sinks as check_window_sinks
    from vllm_ascend.core.device.adaptor.base import seq_blocks as seq_blocks
    from vllm_ascend.core.device.adaptor.graph import CapturedGraph as CapturedGraph
    from vllm_ascend.core.device.adaptor.graph import GraphCaptureError as GraphCaptureError
    from vllm_ascend.core.device.adaptor.graph import captured_tensors as captured_tensors
    from vllm_ascend.core.device.adaptor.kv_layout import CPU_KERNEL as CPU_KERNEL
    from vllm_ascend.core.device.adaptor.kv_layout import KV_BLOCK_LAYOUTS as KV_BLOCK_LAYOUTS
    from vllm_ascend.core.device.adaptor.kv_layout import TOKEN_MAJOR as TOKEN_MAJOR
    from vllm_ascend.core.device.adaptor.kv_layout import are_cpu_kernel_views as are_cpu_kernel_views
    from vllm_ascend.core.device.adaptor.kv_layout import block_compact as block_compact
    from vllm_ascend.core.device.adaptor.kv_layout import held_views as held_views
    from vllm_ascend.core.device.adaptor.kv_layout import kv_cache_views as kv_cache_views
    from vllm_ascend.core.device.adaptor.memory_pool import MEMORY_TAGS as MEMORY_TAGS
    from vllm_ascend.core.device.adaptor.memory_pool import MemoryPoolError as MemoryPoolError
    from vllm_ascend.core.device.adaptor.memory_pool import Region as Region
    from vllm_ascend.core.device.adaptor.memory_pool import TaggedMemoryPool as TaggedMemoryPool
    from vllm_ascend.core.device.adaptor.memory_pool import track_region_lifetime as track_region_lifetime
    from vllm_ascend.core.device.adaptor.mla import MLADeviceOps as MLADeviceOps
    from vllm_ascend.core.device.adaptor.mla import check_latent_cache as check_latent_cache
    from vllm_ascend.core.device.adaptor.mla import latent_cache_parts as latent_cache_parts
    from vllm_ascend.core.device.adaptor.sparse import SparseAttentionDeviceOps as SparseAttentionDeviceOps
    from vllm_ascend.core.device.config import DeviceConfigError as DeviceConfigError
    from vllm_ascend.core.device.config import get_current_hardware_profile as get_current_hardware_profile
    from vllm_ascend.core.device.config import get_device_adaptor as get_device_adaptor
    from vllm_ascend.core.device.config import get_hardware_profile as get_hardware_profile
    from vllm_ascend.core.device.detection import detect as detect
    from vllm_ascend.core.device.family import AscendDeviceType as AscendDeviceType
    from vllm_ascend.core.device.host import host_isa as host_isa
    from vllm_ascend.core.device.host import loaded_kernel_libraries as loaded_kernel_libraries
    from vllm_ascend.core.device.overlay import DeviceOverlay as DeviceOverlay
    from vllm_ascend.core.device.profile import BUILTIN_PROFILES as BUILTIN_PROFILES
    from vllm_ascend.core.device.profile import CPUBindingMode as CPUBindingMode
    from vllm_ascend.core.device.profile import HardwareCapability as HardwareCapability
    from vllm_ascend.core.device.profile import HardwareProfile as HardwareProfile
    from vllm_ascend.core.extensions import ExtensionDescriptor as ExtensionDescriptor
    from vllm_ascend.core.logger import init_logger as init_logger
    from vllm_ascend.core.lora import InvalidLoRAAdapterError as InvalidLoRAAdapterError
    from vllm_ascend.core.platform import SLEEP_MODE_BACKEND as SLEEP_MODE_BACKEND
    from vllm_ascend.core.registry import CLI_COMMANDS as CLI_COMMANDS
    from vllm_ascend.core.registry import CONFIG_SECTIONS as CONFIG_SECTIONS
    from vllm_ascend.core.registry import DEVICE_ADAPTORS as DEVICE_ADAPTORS
    from vllm_ascend.core.registry import DEVICE_OVERLAYS as DEVICE_OVERLAYS
    from vllm_ascend.core.registry import DOCTOR_PROBES as DOCTOR_PROBES
    from vllm_ascend.core.registry import KV_CONNECTORS as KV_CONNECTORS
    from vllm_ascend.core.registry import KV_OFFLOAD_SPECS as KV_OFFLOAD_SPECS
    from vllm_ascend.core.registry import MODEL_LOADERS as MODEL_LOADERS
    from vllm_ascend.core.registry import MOE_PLACEMENTS as MOE_PLACEMENTS
    from vllm_ascend.core.registry import QUANT_METHODS as QUANT_METHODS
    from vllm_ascend.core.registry import SPEC_DECODE_METHODS as SPEC_DECODE_METHODS
    from vllm_ascend.core.registry import WEIGHT_TRANSFER_ENGINES as WEIGHT_TRANSFER_ENGINES
    from vllm_ascend.core.registry import WORKERS as WORKERS
    from vllm_ascend.core.registry import CliCommand as CliCommand
    from vllm_ascend.core.registry import CliError as CliError
    from vllm_ascend.core.registry import Registry as Registry
    from vllm_ascend.core.registry import registering_as as registering_as

_EXPORTS: dict[str, str] = {
    # extensions and registries (how a sibling plugs in)
    "ExtensionDescriptor": "vllm_ascend.core.extensions",
    "CLI_COMMANDS": "vllm_ascend.core.registry",
    "CliCommand": "vllm_ascend.core.registry",
    "CliError": "vllm_ascend.core.registry",
    "CONFIG_SECTIONS": "vllm_ascend.core.registry",
    "DEVICE_ADAPTORS": "vllm_ascend.core.registry",
    "DEVICE_OVERLAYS": "vllm_ascend.core.registry",
    "DOCTOR_PROBES": "vllm_ascend.core.registry",
    "KV_CONNECTORS": "vllm_ascend.core.registry",
    "KV_OFFLOAD_SPECS": "vllm_ascend.core.registry",
    "MODEL_LOADERS": "vllm_ascend.core.registry",
    "MOE_PLACEMENTS": "vllm_ascend.core.registry",
    "QUANT_METHODS": "vllm_ascend.core.registry",
    "registering_as": "vllm_ascend.core.registry",
    "Registry": "vllm_ascend.core.registry",
    "SPEC_DECODE_METHODS": "vllm_ascend.core.registry",
    "WEIGHT_TRANSFER_ENGINES": "vllm_ascend.core.registry",
    "WORKERS": "vllm_ascend.core.registry",
    # configuration (additional_config sections, JSON inputs)
    "ConfigError": "vllm_ascend.core.config",
    "InvalidLoRAAdapterError": "vllm_ascend.core.lora",
    "get_ascend_config": "vllm_ascend.core.config",
    "get_section": "vllm_ascend.core.config",
    "Section": "vllm_ascend.core.config",
    "INT_MAX": "vllm_ascend.core.config.schema",
    "option": "vllm_ascend.core.config.schema",
    "unknown_key_message": "vllm_ascend.core.config.schema",
    "JsonInputError": "vllm_ascend.core.config.jsonio",
    "read_json_file": "vllm_ascend.core.config.jsonio",
    # device: profile, family, dispatch to the active adaptor
    "DeviceConfigError": "vllm_ascend.core.device.config",
    "get_current_hardware_profile": "vllm_ascend.core.device.config",
    "get_device_adaptor": "vllm_ascend.core.device.config",
    "get_hardware_profile": "vllm_ascend.core.device.config",
    "BUILTIN_PROFILES": "vllm_ascend.core.device.profile",
    "CPUBindingMode": "vllm_ascend.core.device.profile",
    "HardwareCapability": "vllm_ascend.core.device.profile",
    "HardwareProfile": "vllm_ascend.core.device.profile",
    "AscendDeviceType": "vllm_ascend.core.device.family",
    "detect": "vllm_ascend.core.device.detection",
    "DeviceOverlay": "vllm_ascend.core.device.overlay",
    "host_isa": "vllm_ascend.core.device.host",
    "loaded_kernel_libraries": "vllm_ascend.core.device.host",
    # device adaptors: the op contract (declarations, argument checks, formats) the implementations follow
    "BaseDeviceAdaptor": "vllm_ascend.core.device.adaptor.base",
    "check_moe_gating": "vllm_ascend.core.device.adaptor.base",
    "DeviceOpError": "vllm_ascend.core.device.adaptor.base",
    "FUSED_OPS": "vllm_ascend.core.device.adaptor.base",
    "RANDOM_SEED_BOUND": "vllm_ascend.core.device.adaptor.base",
    "WeightFormat": "vllm_ascend.core.device.adaptor.base",
    "latent_cache_parts": "vllm_ascend.core.device.adaptor.mla",
    "MLADeviceOps": "vllm_ascend.core.device.adaptor.mla",
    "SparseAttentionDeviceOps": "vllm_ascend.core.device.adaptor.sparse",
    "GROUP_LIST_TYPES": "vllm_ascend.core.device.adaptor.base",
    "SCORING_FUNCS": "vllm_ascend.core.device.adaptor.base",
    "WEIGHT_FORMATS": "vllm_ascend.core.device.adaptor.base",
    "GroupListType": "vllm_ascend.core.device.adaptor.base",
    "MoeDispatch": "vllm_ascend.core.device.adaptor.base",
    "AttentionPlan": "vllm_ascend.core.device.adaptor.base",
    "check_attention_plan": "vllm_ascend.core.device.adaptor.base",
    "check_choice": "vllm_ascend.core.device.adaptor.base",
    "check_clipped_swiglu": "vllm_ascend.core.device.adaptor.base",
    "check_group_bias": "vllm_ascend.core.device.adaptor.base",
    "check_window_sinks": "vllm_ascend.core.device.adaptor.base",
    "check_mrope": "vllm_ascend.core.device.adaptor.base",
    "check_packed_attention": "vllm_ascend.core.device.adaptor.base",
    "seq_blocks": "vllm_ascend.core.device.adaptor.base",
    "CapturedGraph": "vllm_ascend.core.device.adaptor.graph",
    "CPU_KERNEL": "vllm_ascend.core.device.adaptor.kv_layout",
    "KV_BLOCK_LAYOUTS": "vllm_ascend.core.device.adaptor.kv_layout",
    "TOKEN_MAJOR": "vllm_ascend.core.device.adaptor.kv_layout",
    "are_cpu_kernel_views": "vllm_ascend.core.device.adaptor.kv_layout",
    "block_compact": "vllm_ascend.core.device.adaptor.kv_layout",
    "held_views": "vllm_ascend.core.device.adaptor.kv_layout",
    "kv_cache_views": "vllm_ascend.core.device.adaptor.kv_layout",
    "GraphCaptureError": "vllm_ascend.core.device.adaptor.graph",
    "captured_tensors": "vllm_ascend.core.device.adaptor.graph",
    "MEMORY_TAGS": "vllm_ascend.core.device.adaptor.memory_pool",
    "SLEEP_MODE_BACKEND": "vllm_ascend.core.platform",
    "MemoryPoolError": "vllm_ascend.core.device.adaptor.memory_pool",
    "Region": "vllm_ascend.core.device.adaptor.memory_pool",
    "TaggedMemoryPool": "vllm_ascend.core.device.adaptor.memory_pool",
    "track_region_lifetime": "vllm_ascend.core.device.adaptor.memory_pool",
    "check_latent_cache": "vllm_ascend.core.device.adaptor.mla",
    # process helpers and logging
    "run_module": "vllm_ascend.core.child",
    "signal_death": "vllm_ascend.core.child",
    "init_logger": "vllm_ascend.core.logger",
}

__all__ = ["envs", "lazy_exports", *sorted(_EXPORTS)]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
