"""NPUModelRunner: vLLM's V1 GPU model runner on the NPU or the reference device.

The inherited runner builds its collaborators by name; while it does, the names are bound to
the Ascend classes (input batch + block tables, sampler, rejection sampler, KV block zeroer) and ``torch.cuda``
streams/events are mapped onto the target device. No device-type branches live here.

Graphs: vLLM's runner wraps the model in its FULL-graph wrapper class by name (``CUDAGraphWrapper``), which is
bound to :class:`ACLGraphWrapper` while the model loads; compiled pieces get the same class from the platform's
``get_static_graph_wrapper_cls``. ``capture_model`` captures every batch descriptor vLLM's dispatcher lists
(largest first) through the device adaptor.

Speculative decoding drafts with the proposer class core's ``SPEC_DECODE_METHODS`` registry holds for
``speculative_config.method`` (``get_spec_decode_method``; a sibling distribution registers it, the
platform refuses methods nobody registered). Two kinds:

- proposers that name a vLLM drafter class in ``replaces`` (``vllm_drives``) take its place while
  vLLM's runner initialises and are driven by vLLM's runner: the model-based ones (draft model, EAGLE,
  EAGLE-3, MTP: vLLM loads their draft network, allocates their KV cache, makes the target return
  EAGLE-3's auxiliary hidden states and drives them through its padded drafting path) and the
  on-device n-gram drafter of ``ngram_gpu`` (vLLM keeps the token history on the device for it);
- CPU drafters (n-gram, suffix) are built with ``from_vllm_config(vllm_config)`` and called as vLLM
  calls its CPU n-gram drafter: ``propose(num_speculative_tokens, sampled_token_ids,
  num_tokens_no_spec, token_ids_cpu, slot_mappings=...) -> list[list[int]]``; one whose
  ``tracks_requests`` is true (suffix decoding keeps per-request state) also gets the rows' ``req_ids``
  and ``num_prompt_tokens``, from which it starts, extends and stops its requests.

Where the device has no pinned host memory (the reference device), vLLM code that pins host tensors
unconditionally (the ``ngram_gpu`` buffers and staging copies) runs with pinning left out
(``without_host_pinning``).

A row whose sampled token is thrown away (a prefill chunk that is not the prompt's last) samples
without its request's ``torch.Generator``, so a seeded request's generator advances only on steps
whose token is kept: its tokens are the same whether or not the prompt was chunked, and vLLM's
Philox-offset rewind (which CPU and other non-Philox generators do not have) never runs.
"""

from __future__ import annotations

import time
import types
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import numpy as np
import torch
from vllm.compilation.monitor import set_cudagraph_capturing_enabled
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.distributed.parallel_state import get_pp_group
from vllm.sequence import IntermediateTensors
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import AsyncModelRunnerOutput, DraftTokenIds, ModelRunnerOutput
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
from vllm.v1.worker import gpu_model_runner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_ascend.core.sdk import (
    SPEC_DECODE_METHODS,
    ConfigError,
    get_device_adaptor,
    get_section,
    init_logger,
)
from vllm_ascend.kernels import kernel_warmup
from vllm_ascend.runner import device_context
from vllm_ascend.runner.graph_wrapper import ACLGraphWrapper
from vllm_ascend.runner.input_batch import NPUInputBatch
from vllm_ascend.runner.kv_zeroer import AscendKVBlockZeroer
from vllm_ascend.runner.lora_adapters import load_lora_model
from vllm_ascend.runner.model_patches import apply_config_defaults, model_patches
from vllm_ascend.runner.patching import replaced_names
from vllm_ascend.runner.sample.rejection_sampler import AscendRejectionSampler
from vllm_ascend.runner.sample.sampler import AscendSampler

logger = init_logger(__name__)

#: The vLLM names rebound while inherited code constructs collaborators.
ASCEND_COMPONENTS = {
    "InputBatch": NPUInputBatch,
    "Sampler": AscendSampler,
    "RejectionSampler": AscendRejectionSampler,
    "KVBlockZeroer": AscendKVBlockZeroer,
    "CUDAGraphWrapper": ACLGraphWrapper,
}


def check_region_split_caches(kv_cache_config: KVCacheConfig, static_forward_context: dict[str, Any]) -> None:
    """Refuse layouts where a layer whose blocks live in regions of its allocation (the MLA latent cache:
    ``cache_block_views``) shares bytes with another layer: vLLM overlays cache groups of hybrid models in one
    allocation, block by block, and a region split would write across other groups' blocks."""
    ranges: list[tuple[int, int, str]] = []
    for tensor in kv_cache_config.kv_cache_tensors:
        size = kv_cache_config.num_blocks_of(tensor) * tensor.block_stride
        for index, name in enumerate(tensor.layers):
            start = tensor.offset + index * tensor.layer_stride
            ranges.append((start, start + size, name))
    for start, end, name in ranges:
        impl = getattr(static_forward_context.get(name), "impl", None)
        if getattr(impl, "cache_block_views", None) is None:
            continue
        shared = [other for s, e, other in ranges if other != name and s < end and start < e]
        if shared:
            raise ValueError(
                f"{name}: the MLA latent cache keeps its c_kv and k_pe in two regions of its allocation and "
                f"cannot share memory with {', '.join(sorted(shared)[:3])} (hybrid models whose cache groups "
                "overlay each other are not supported with MLA by vllm-ascend)"
            )


@contextmanager
def ascend_components() -> Iterator[None]:
    """Inherited runner code builds the Ascend collaborators (:data:`ASCEND_COMPONENTS`) and uses the target's
    streams/events. Every family shares them: what differs per family goes through the device adaptor and
    the kernels' per-device dispatch."""
    with device_context.torch_device_wrapper(), replaced_names(gpu_model_runner, ASCEND_COMPONENTS):
        yield


def get_spec_decode_method(vllm_config: VllmConfig) -> Any:
    """The proposer class core's registry holds for ``speculative_config.method`` (None without
    speculative decoding). The platform has already refused methods nobody registered."""
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    return SPEC_DECODE_METHODS.get(spec.method)


def vllm_drives(proposer_cls: Any) -> bool:
    """Proposers naming a vLLM drafter class in ``replaces`` are built and driven by vLLM's runner code,
    in place of that class (model-based ones, the on-device n-gram drafter)."""
    return getattr(proposer_cls, "replaces", None) is not None


@contextmanager
def vllm_builds_our_drafter(vllm_config: VllmConfig, proposer_cls: Any) -> Iterator[Any]:
    """While vLLM's runner initialises, the name it builds its drafter from means ``proposer_cls``.

    A proposer naming a vLLM class in ``replaces`` takes its place (same constructor), so vLLM builds
    and calls it (loading a model-based one's draft network, giving it KV-cache layers). A CPU drafter
    is built here (``from_vllm_config``) and handed out for the class vLLM would build: for ``ngram``
    vLLM's numba ``NgramProposer`` (JIT-compiled on creation), for ``suffix`` arctic-inference's
    proposer. Yields the CPU drafter (None for the others)."""
    if proposer_cls is None:
        yield None
        return
    if vllm_drives(proposer_cls):
        with replaced_names(gpu_model_runner, {proposer_cls.replaces: proposer_cls}):
            yield None
        return
    drafter = proposer_cls.from_vllm_config(vllm_config)
    method = vllm_config.speculative_config.method
    with ExitStack() as stack:
        if method == "ngram":
            from vllm.v1.spec_decode import ngram_proposer

            stack.enter_context(replaced_names(ngram_proposer, {"NgramProposer": lambda config: drafter}))
        if method == "suffix":
            stack.enter_context(
                replaced_names(gpu_model_runner, {"SuffixDecodingProposer": lambda config: drafter})
            )
        yield drafter


def _unused_warmup_items(speculative_config: Any) -> tuple[str, ...]:
    """Warm-up items whose kernels this configuration never launches: verification without speculative
    decoding, the n-gram drafter's kernel unless the method is ``ngram_gpu``."""
    unused = [] if speculative_config is not None else ["rejection"]
    if getattr(speculative_config, "method", None) != "ngram_gpu":
        unused.append("ngram")
    return tuple(unused)


def dynamic_spec_scheduler(vllm_config: VllmConfig) -> Any:
    """The draft-length scheduler ``additional_config.dynamic_spec_config`` asks for (None when absent or
    disabled). It sets each request's draft length from its measured acceptance; the runner hands vLLM's
    scheduler the trimmed drafts, which it can only do when drafts travel through the host each step."""
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    try:
        config = get_section("dynamic_spec_config")
    except ConfigError:  # the section is served by vllm-ascend[specdecode]; not installed, not given
        return None
    if not config.enabled:
        return None
    if vllm_config.scheduler_config.async_scheduling:
        raise ConfigError(
            "additional_config.dynamic_spec_config.enabled = true needs synchronous scheduling (the drafts "
            "are trimmed on the host before vLLM schedules them); async_scheduling is on: start with "
            "--no-async-scheduling or disable dynamic_spec_config"
        )
    return config.build_scheduler(spec.num_speculative_tokens)


class _TorchWithoutPinning(types.ModuleType):
    """``torch`` as vLLM's runner module sees it on a device without pinned host memory: ``zeros``
    ignores ``pin_memory`` (vLLM's ``ngram_gpu`` buffers ask for it unconditionally)."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*args, **kwargs)


def _unpinned(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


@contextmanager
def without_host_pinning(pinning: bool) -> Iterator[None]:
    """Unless ``pinning`` (the adaptor's ``pin_memory_available()``), vLLM's runner code runs with host
    pinning left out (``pin_memory=True`` factories in its module, ``Tensor.pin_memory()``): a device
    without pinned memory copies from ordinary host memory, where pinning would raise."""
    if pinning:
        yield
        return
    own = "pin_memory" in vars(torch.Tensor)
    saved = vars(torch.Tensor).get("pin_memory")
    torch.Tensor.pin_memory = _unpinned  # type: ignore[method-assign]
    try:
        with replaced_names(gpu_model_runner, {"torch": _TorchWithoutPinning()}):
            yield
    finally:
        if own:
            torch.Tensor.pin_memory = saved  # type: ignore[method-assign]
        else:
            del torch.Tensor.pin_memory


@contextmanager
def generators_held_back(generators: dict[int, torch.Generator], rows: Iterable[int]) -> Iterator[None]:
    """Take ``rows``' generators out of the batch's ``generators`` while the block runs, then put them back
    untouched: those rows sample from the global RNG and their generators neither advance nor rewind."""
    held = {row: generators.pop(row) for row in rows if row in generators}
    try:
        yield
    finally:
        generators.update(held)


class NPUModelRunner(GPUModelRunner):
    """The V1 model runner for Ascend (see the module docstring)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        adaptor = get_device_adaptor()
        adaptor.install_runtime_shims()
        self.pins_host_memory = adaptor.pin_memory_available()
        proposer_cls = get_spec_decode_method(vllm_config)
        with (
            ascend_components(),
            without_host_pinning(self.pins_host_memory),
            vllm_builds_our_drafter(vllm_config, proposer_cls) as cpu_drafter,
        ):
            super().__init__(vllm_config, device)
        if cpu_drafter is not None and hasattr(self, "drafter"):  # built on the last PP stage only
            self.drafter = cpu_drafter
        self.vllm_drives_drafter = vllm_drives(proposer_cls)
        self.dynamic_spec = dynamic_spec_scheduler(vllm_config)
        self.kernel_warmup_results: dict[str, bool] = {}  # item -> compiled cleanly, after warm_up()

    def load_lora_model(
        self, model: torch.nn.Module, vllm_config: VllmConfig, device: torch.device
    ) -> torch.nn.Module:
        """vLLM's LoRA manager, with each adapter checked against the model before it loads."""
        return load_lora_model(self, model, vllm_config, device)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        configs = [self.model_config.hf_text_config]
        if self.speculative_config is not None and self.speculative_config.draft_model_config is not None:
            configs.append(self.speculative_config.draft_model_config.hf_text_config)
        for hf_config in configs:
            for default in apply_config_defaults(hf_config):
                logger.info("model config: %s=%r (%s)", default.field, default.value, default.why)
        with ascend_components(), model_patches(self.model_config.hf_text_config):
            super().load_model(*args, **kwargs)

    def capture_model(self) -> int:
        """Capture a graph per batch descriptor vLLM's dispatcher lists (its FULL and PIECEWISE sets, each
        after a warm-up run); returns the device memory the graphs took."""
        if self.compilation_config.cudagraph_mode == CUDAGraphMode.NONE:
            return 0
        adaptor = get_device_adaptor()
        start, before = time.perf_counter(), adaptor.memory_in_use(self.device)
        set_cudagraph_capturing_enabled(True)
        try:
            with self._freeze_gc(), device_context.torch_device_wrapper():
                for runtime_mode, descriptors in self.cudagraph_dispatcher.get_capture_descs():
                    self._capture_cudagraphs(descriptors, cudagraph_runtime_mode=runtime_mode)
                    adaptor.synchronize()
        finally:
            set_cudagraph_capturing_enabled(False)
        taken = int(adaptor.memory_in_use(self.device) - before)
        logger.info(
            "Captured graphs (%s) in %.1f s, %d bytes",
            self.compilation_config.cudagraph_mode.name, time.perf_counter() - start, taken,
        )  # fmt: skip
        return taken

    def may_reinitialize_input_batch(self, kv_cache_config: KVCacheConfig) -> None:
        with ascend_components():
            super().may_reinitialize_input_batch(kv_cache_config)

    def _init_kv_zero_meta(self) -> None:
        with ascend_components():
            super()._init_kv_zero_meta()

    def initialize_kv_cache(
        self,
        kv_cache_config: KVCacheConfig,
        is_profiling: bool = False,
        kv_cache_allocation_context: AbstractContextManager | None = None,
    ) -> None:
        check_region_split_caches(kv_cache_config, self.compilation_config.static_forward_context)
        with ascend_components():
            super().initialize_kv_cache(
                kv_cache_config, is_profiling, kv_cache_allocation_context=kv_cache_allocation_context
            )

    def _update_states(self, scheduler_output: SchedulerOutput) -> Any:
        with without_host_pinning(self.pins_host_memory):
            return super()._update_states(scheduler_output)

    def propose_draft_token_ids(
        self,
        scheduler_output: SchedulerOutput,
        sampled_token_ids: torch.Tensor | list[list[int]],
        sampling_metadata: SamplingMetadata,
        hidden_states: torch.Tensor,
        sample_hidden_states: torch.Tensor,
        aux_hidden_states: list[torch.Tensor] | None,
        spec_decode_metadata: SpecDecodeMetadata | None,
        common_attn_metadata: CommonAttentionMetadata,
        slot_mappings: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]] | None,
    ) -> list[list[int]] | torch.Tensor:
        """Proposers vLLM's runner drives run its drafting path (our proposer class, built by vLLM's
        runner); CPU drafters are called as vLLM calls its n-gram drafter."""
        if self.vllm_drives_drafter:
            return super().propose_draft_token_ids(
                scheduler_output,
                sampled_token_ids,
                sampling_metadata,
                hidden_states,
                sample_hidden_states,
                aux_hidden_states,
                spec_decode_metadata,
                common_attn_metadata,
                slot_mappings,
            )
        self._draft_probs = None
        self._draft_prob_req_ids = None
        batch = self.input_batch
        requests: dict[str, Any] = {}
        if getattr(self.drafter, "tracks_requests", False):
            requests = {"req_ids": batch.req_ids, "num_prompt_tokens": batch.num_prompt_tokens}
        return self.drafter.propose(
            scheduler_output.num_spec_tokens_to_schedule,
            sampled_token_ids,
            batch.num_tokens_no_spec,
            batch.token_ids_cpu,
            slot_mappings=slot_mappings,
            **requests,
        )

    def execute_model(self, scheduler_output: SchedulerOutput, *args: Any, **kwargs: Any) -> Any:
        if self.dynamic_spec is not None:
            for req_id in scheduler_output.finished_req_ids:
                self.dynamic_spec.finish(req_id)
        return super().execute_model(scheduler_output, *args, **kwargs)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The step's drafts, each cut to the length the dynamic scheduler allots it (when enabled)."""
        drafts = super().take_draft_token_ids()
        if drafts is None or self.dynamic_spec is None:
            return drafts
        return DraftTokenIds(drafts.req_ids, self.dynamic_spec.trim(drafts.req_ids, drafts.draft_token_ids))

    def _observe_acceptance(self, scheduled: dict[str, list[int]], output: Any) -> None:
        """Tell the dynamic scheduler how many of each sampling request's verified drafts were accepted
        (0 drafts included: its unmeasured estimates drift back toward the batch's)."""
        if not isinstance(output, ModelRunnerOutput):
            return
        for req_id, sampled in zip(output.req_ids, output.sampled_token_ids, strict=True):
            if len(sampled):
                self.dynamic_spec.observe(req_id, len(scheduled.get(req_id, ())), len(sampled) - 1)

    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | IntermediateTensors:
        """vLLM's sampling step (and drafting, whose copies use ``torch.cuda`` streams), with the discarded
        rows' generators held back (see the module docstring)."""
        rows: list[int] = []
        scheduled: dict[str, list[int]] = {}
        if self.execute_model_state is not None:
            rows = np.flatnonzero(self.discard_request_mask.np[: self.input_batch.num_reqs]).tolist()
            scheduled = self.execute_model_state.scheduler_output.scheduled_spec_decode_tokens
        with generators_held_back(self.input_batch.generators, rows), device_context.torch_device_wrapper():
            output = super().sample_tokens(grammar_output)
        if self.dynamic_spec is not None:
            self._observe_acceptance(scheduled, output)
        return output

    def _sync_device(self) -> None:
        get_device_adaptor().synchronize()

    def warm_up(self) -> None:
        """One dummy forward at the largest batch of requests on every rank; on the last pipeline stage
        (the only one that samples) first compile every sampling-kernel variant a step can hit
        (``kernel_warmup``: failures are logged, not raised) and then run the sampler once (fills lazy
        state); a pooling model runs its pooler instead, once per task it serves. Earlier stages produce
        intermediate tensors, not hidden states to sample from."""
        is_last_stage = get_pp_group().is_last_rank
        if is_last_stage and not self.is_pooling_model:
            self.kernel_warmup_results = kernel_warmup(
                self.device,
                self.model_config.get_vocab_size(),
                (torch.float32,),  # the sampler works on float32 logits
                exclude=_unused_warmup_items(self.speculative_config),
            )
        num_reqs = min(self.scheduler_config.max_num_seqs, self.scheduler_config.max_num_batched_tokens)
        hidden_states, last_hidden_states = self._dummy_run(
            num_tokens=num_reqs, skip_eplb=True, cudagraph_runtime_mode=CUDAGraphMode.NONE
        )
        if is_last_stage and self.is_pooling_model:
            with device_context.torch_device_wrapper():
                self._dummy_pooler_run(hidden_states)
        elif is_last_stage:
            self._dummy_sampler_run(hidden_states=last_hidden_states)
