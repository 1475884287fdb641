"""``AscendMoERunner``: vLLM 0.32's ``MoERunner`` for every MoE model served on the Ascend platforms.

vLLM's runner keeps what it does around the experts (the gate, shared experts, the final tensor-parallel
all-reduce); this class replaces the routed-expert step: top-k routing (``moe_routing``: softmax or
sigmoid, grouped and score-bias top-k) → the communication method of the step (``moe_comm``: all-gather,
all-to-all or MC2) → this rank's experts, unquantized (``grouped_matmul`` → ``swiglu`` →
``grouped_matmul``) or a quant scheme's (``apply_experts``), all through the device adaptor. gpt-oss's
experts (unquantized) take the same path with their ``[E, 2I]`` / ``[E, H]`` biases in the grouped matmuls
and vLLM's ``swigluoai`` activation (``clipped_swiglu`` over the interleaved gate/up columns of w13).

Parallelism: with tensor parallel each rank holds every expert's slice of the intermediate size (the
all-gather method; vLLM's all-reduce sums the slices); with expert parallel (``enable_expert_parallel``)
each rank holds its experts (vLLM's expert map) and the step's method moves tokens to them. All-gather
leaves partial outputs for vLLM's combine/all-reduce; all-to-all and MC2 return every token's full
output (vLLM's data-parallel dispatch and final all-reduce are skipped for that step). An
expert-placement schedule (core's ``MOE_PLACEMENTS``, e.g. EPLB) may lay experts out in physical slots
(with replicas on one rank; moved between ranks over several); it sees the rows computed per slot.

Fused-MoE LoRA (``ops/moe_lora.py``): vLLM's MoE LoRA layer wrapping this runner sets ``expert_lora``; the
unquantized expert path then adds each (token, expert) row's adapter delta after each grouped matmul.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.config import CUDAGraphMode, get_current_vllm_config
from vllm.distributed import get_ep_group, get_tp_group
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map
from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner, SharedExpertsOrder
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from vllm_ascend.core.sdk import (
    MOE_PLACEMENTS,
    envs,
    get_current_hardware_profile,
    get_device_adaptor,
    init_logger,
)
from vllm_ascend.runner.ops.moe_comm import (
    MoECommConfig,
    MoECommType,
    allgather_experts,
    alltoall_experts,
    gather_tokens,
    mc2_capacity,
    mc2_experts,
    select_moe_comm_method,
    split_tokens,
)
from vllm_ascend.runner.ops.moe_routing import check_router, select_experts

if TYPE_CHECKING:
    from vllm_ascend.runner.ops.moe_lora import ExpertLoRA

logger = init_logger(__name__)

#: Communication methods this process has announced in its log (once each).
_ANNOUNCED: set[MoECommType] = set()

#: vLLM 0.32's ``swigluoai`` constants (its ``SwigluOAIAndMul`` defaults and fused kernels): gpt-oss's
#: sigmoid scale and clamp limit, and the +1 on ``up``. A model's ``swiglu_alpha``/``swiglu_limit`` in its
#: MoE config override the first two.
SWIGLUOAI_ALPHA = 1.702
SWIGLUOAI_LIMIT = 7.0
SWIGLUOAI_UP_BIAS = 1.0
#: Expert activations this runner computes.
SUPPORTED_ACTIVATIONS = (MoEActivation.SILU, MoEActivation.SWIGLUOAI)


def _placement_schedule(vllm_config: Any, ep_size: int) -> Any:
    """The expert-placement schedule of the model being built (``None`` without one)."""
    if "default" not in MOE_PLACEMENTS:
        return None
    return MOE_PLACEMENTS.get("default")(vllm_config, get_ep_group() if ep_size > 1 else None)


def _forward_metadata() -> Any:
    """The current forward's attention metadata (``None`` outside a forward and in dummy/profile runs).

    In a hybrid model the first attention layer's: mamba-style layers' metadata has no ``max_query_len``.
    """
    if not is_forward_context_available():
        return None
    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, dict):
        return next((m for m in metadata.values() if hasattr(m, "max_query_len")), None)
    return metadata


def _real_forward_phase(decode_query_len: int) -> str | None:
    """``decode`` for a real forward whose requests bring at most ``decode_query_len`` new tokens each (1 +
    speculative tokens), else ``prefill``; ``None`` for dummy/profile runs (no attention metadata)."""
    metadata = _forward_metadata()
    if metadata is None:
        return None
    return "prefill" if int(metadata.max_query_len) > decode_query_len else "decode"


def _max_tokens_across_dp(num_tokens: int) -> int:
    """The step's largest data-parallel rank's token count (every rank derives the same number)."""
    if is_forward_context_available():
        dp = get_forward_context().dp_metadata
        if dp is not None:
            return int(dp.num_tokens_across_dp_cpu.max())
    return num_tokens


def comm_config(vllm_config: Any, moe_config: Any, decode_query_len: int) -> MoECommConfig:
    """The per-step selection's inputs for one MoE layer (the profile's MoE data, ranks, MC2 capacity, forcing)."""
    raw = envs.VLLM_ASCEND_MOE_COMM_METHOD
    forced = MoECommType(raw) if raw else None
    profile = get_current_hardware_profile()
    scheduler = vllm_config.scheduler_config
    capacity = mc2_capacity(
        scheduler.max_num_seqs,
        decode_query_len,
        scheduler.max_num_batched_tokens,
        forced is MoECommType.MC2,
    )
    parallel = vllm_config.parallel_config
    return MoECommConfig.for_profile(
        profile,
        ep_size=moe_config.ep_size,
        tp_size=parallel.tensor_parallel_size if moe_config.ep_size > 1 else 1,
        capacity=capacity,
        even=moe_config.num_experts % moe_config.ep_size == 0,
        forced=forced,
    )


class AscendMoERunner(MoERunner):
    """Top-k routing over gated experts (SiLU, or gpt-oss's biased ``swigluoai``) through the device adaptor,
    on one rank or many.

    With a placement schedule (set on the first forward): ``expert_map [ranks, n]`` (local slot or -1),
    ``log2phy [ranks, n]`` (the physical slot each rank routes each logical expert to) and ``moe_load``
    (rows computed per held physical slot). ``comm_steps`` counts the forwards run by each method.
    ``expert_lora``: the adapters of the LoRA layer wrapping this runner (``None`` without LoRA).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._check_supported()
        vllm_config = get_current_vllm_config()
        spec = vllm_config.speculative_config
        self.decode_query_len = 1 + (spec.num_speculative_tokens or 0) if spec is not None else 1
        self.comm = comm_config(vllm_config, self.moe_config, self.decode_query_len)
        self.step_comm = MoECommType.ALLGATHER
        self.comm_steps: dict[MoECommType, int] = dict.fromkeys(MoECommType, 0)
        self._physical_map: torch.Tensor | None = None
        self.eplb = _placement_schedule(vllm_config, self.moe_config.ep_size)
        self.moe_index = self.eplb.register(self) if self.eplb is not None else -1
        self._expert_map: torch.Tensor | None = None
        self.log2phy: torch.Tensor | None = None
        self.moe_load: torch.Tensor | None = None
        #: The ``[ranks, slots]`` placement this layer routes by (its weights are laid out for it).
        self.placement: np.ndarray | None = None
        self._placed: list[torch.nn.Parameter] = []
        #: The held expert tensors while a weight update loads into loaded-layout buffers (one process).
        self._parked: list[torch.Tensor] = []
        self.expert_lora: ExpertLoRA | None = None

    def _check_supported(self) -> None:
        check_router(self.router, self.layer_name)
        activation = self.routed_experts.activation
        unsupported = {
            "routed_input_transform": self.routed_input_transform is not None,
            "routed_output_transform": self.routed_output_transform is not None,
            "activation": activation not in SUPPORTED_ACTIVATIONS,
        }
        bad = [name for name, flag in unsupported.items() if flag]
        if bad:
            allowed = ", ".join(a.value for a in SUPPORTED_ACTIVATIONS)
            raise NotImplementedError(
                f"{self.layer_name}: the Ascend MoE runner supports gated experts with activation {allowed} "
                f"and no routed input/output transforms; unsupported here: {bad} (activation {activation})"
            )
        quant_method = self.routed_experts.quant_method
        gpt_oss_style = activation is not MoEActivation.SILU or self.moe_config.has_bias
        if gpt_oss_style and not isinstance(quant_method, UnquantizedFusedMoEMethod):
            raise NotImplementedError(
                f"{self.layer_name}: quantized experts with activation {activation.value} or expert biases "
                f"(gpt-oss style) are not supported by the Ascend MoE runner (quant method "
                f"{type(quant_method).__name__}); serve the unquantized (bf16/fp32) checkpoint"
            )

    def _activation(self, x: torch.Tensor) -> torch.Tensor:
        """The experts' gated activation on the first grouped matmul's ``[rows, 2I]`` output."""
        ad = get_device_adaptor()
        if self.routed_experts.activation is MoEActivation.SILU:
            return ad.swiglu(x)
        alpha, limit = self.moe_config.swiglu_alpha, self.moe_config.swiglu_limit
        return ad.clipped_swiglu(
            x,
            alpha=SWIGLUOAI_ALPHA if alpha is None else alpha,
            limit=SWIGLUOAI_LIMIT if limit is None else limit,
            bias=SWIGLUOAI_UP_BIAS,
            interleaved=True,
        )

    def _expert_bias(self, name: str) -> torch.Tensor | None:
        """The experts' ``w13_bias``/``w2_bias`` (``[E, N]``, in the placement's slot order), or None."""
        return getattr(self.routed_experts, name, None) if self.moe_config.has_bias else None

    @property
    def is_monolithic(self) -> bool:
        return False

    @property
    def expert_map(self) -> torch.Tensor | None:
        """``[ranks, n]`` local slot of each logical expert on each rank of the placement, -1 where absent."""
        return self._expert_map

    # the step's communication (read by vLLM's MoERunner around the experts) ------------------------
    @property
    def do_naive_dispatch_combine(self) -> bool:
        """vLLM gathers data-parallel ranks' tokens only for the all-gather method."""
        return super().do_naive_dispatch_combine and self.step_comm is MoECommType.ALLGATHER

    @property
    def _reduces_inside(self) -> bool:
        """Expert parallel over the tensor-parallel ranks alone (one DP rank, no sequence parallelism): the
        routed output leaves the layer's op reduced whatever the step's method — all-gather's partial outputs
        are all-reduced inside it — so vLLM's reduction around the op (traced once under ``torch.compile``,
        where the step's choice would be frozen) is the same on every step."""
        config = self.moe_config
        return (
            config.ep_size > 1
            and config.dp_size == 1
            and not config.is_sequence_parallel
            and not config.skip_final_all_reduce
        )

    @property
    def _fused_output_is_reduced(self) -> bool:
        """All-to-all and MC2 return every token's full output (and all-gather's is reduced inside the op where
        :attr:`_reduces_inside`): vLLM must not all-reduce it again."""
        return self._reduces_inside or self.step_comm is not MoECommType.ALLGATHER

    def _forward_impl(
        self, hidden_states: torch.Tensor, router_logits: torch.Tensor, *args: Any, **kwargs: Any
    ):
        num_tokens = _max_tokens_across_dp(hidden_states.shape[0])
        # A captured step replays what it recorded: no all-to-all sized on the host there.
        captured = (
            is_forward_context_available()
            and get_forward_context().cudagraph_runtime_mode != CUDAGraphMode.NONE
        )
        self.step_comm = select_moe_comm_method(self.comm, num_tokens, captured)
        self.comm_steps[self.step_comm] += 1
        if self.step_comm not in _ANNOUNCED:
            _ANNOUNCED.add(self.step_comm)
            logger.info(
                "MoE communication %s first used (%d tokens, %d expert-parallel ranks, on %s%s)",
                self.step_comm.value,
                num_tokens,
                self.comm.ep_size,
                self.comm.device,
                ", forced" if self.comm.forced is not None else "",
            )
        return super()._forward_impl(hidden_states, router_logits, *args, **kwargs)

    # placement (what a schedule drives) ----------------------------------------------------
    def _expert_params(self) -> list[torch.nn.Parameter]:
        """Every per-expert tensor of this rank's experts (weights, and a quant scheme's scales/offsets)."""
        experts = self.routed_experts.w13_weight.shape[0]
        return [
            p for p in self.routed_experts.parameters(recurse=False) if p.dim() > 0 and p.shape[0] == experts
        ]

    def install_placement(self, rank_table: np.ndarray) -> None:
        """Hold this rank's physical slots of the ``[ranks, slots]`` placement. One process: each slot
        (``rank * slots + slot``) gets a copy of its expert's tensors. Expert parallel: the rank's loaded
        experts are its slots (the table is where they were loaded)."""
        self._placed = self._expert_params()
        if self.moe_config.ep_size == 1:
            phys = torch.as_tensor(rank_table.reshape(-1), dtype=torch.long)
            for param in self._placed:
                param.data = param.data[phys].clone()
        self.moe_load = torch.zeros(self.routed_experts.w13_weight.shape[0], dtype=torch.int64)

    def loaded_placement(self) -> np.ndarray:
        """``[ranks, slots]``: the logical expert each rank loaded into each local slot (vLLM's expert map)."""
        ep_size, n = self.moe_config.ep_size, self.moe_config.num_logical_experts
        table = np.empty((ep_size, n // ep_size), dtype=np.int64)
        for rank in range(ep_size):
            _, rank_map, _ = determine_expert_map(ep_size, rank, n, self.expert_placement_strategy)
            assert rank_map is not None
            held = (rank_map >= 0).nonzero().flatten()
            table[rank, rank_map[held].long().numpy()] = held.numpy()
        return table

    def expert_weights(self) -> list[torch.Tensor]:
        return [param.data for param in self._placed]

    def begin_weight_update(self) -> None:
        """Before a weight update (vLLM's layerwise reload): the model's ``load_weights`` puts checkpoint experts
        where vLLM loaded them (its expert map), not in this layer's placement. A move in flight is finished
        first (it carries old weights). One process: the held tensors are parked and the parameters point at
        buffers of the loaded layout (one row per logical expert) until :meth:`end_weight_update`."""
        if self.placement is None:
            return
        assert self.eplb is not None
        self.eplb.settle()
        if self.moe_config.ep_size == 1:
            n = self.moe_config.num_logical_experts
            for param in self._placed:
                self._parked.append(param.data)
                param.data = torch.empty((n, *param.shape[1:]), dtype=param.dtype, device=param.device)

    def end_weight_update(self) -> None:
        """After the update: the new experts go into this layer's placement, in the held tensors (their
        addresses unchanged). One process: each physical slot copies its logical expert's row; expert parallel:
        the placement schedule moves them from vLLM's loaded layout (``relayout``)."""
        if self.placement is None:
            return
        assert self.eplb is not None
        if self.moe_config.ep_size == 1:
            phys = torch.as_tensor(self.placement.reshape(-1), dtype=torch.long)
            for param, held in zip(self._placed, self._parked, strict=True):
                held.copy_(param.data[phys])
                param.data = held
            self._parked = []
            return
        self.eplb.relayout(self.moe_index, self.loaded_placement())

    def set_placement(self, rank_table: np.ndarray) -> None:
        assert self.eplb is not None
        expert_map, log2phy = self.eplb.rank_maps(rank_table)
        self.placement = np.array(rank_table, copy=True)
        self._expert_map = torch.as_tensor(expert_map, dtype=torch.int64)
        self.log2phy = torch.as_tensor(log2phy, dtype=torch.int64)

    # forward ---------------------------------------------------------------------------------
    def _apply_quant_method(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        shared_experts_input: torch.Tensor | None,
        input_ids: torch.Tensor | None = None,
        shared_experts_overlapping: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        self._maybe_apply_shared_experts(shared_experts_input, SharedExpertsOrder.NO_OVERLAP)
        routed = self._routed_experts(hidden_states, router_logits)
        if shared_experts_overlapping:
            assert self._shared_experts is not None
            self._shared_experts.wait()
        return (self._shared_experts.output if self._shared_experts is not None else None), routed

    def _routed_experts(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """The routed experts' output: this rank's share (all-gather) or every token's (all-to-all, MC2)."""
        if self.eplb is not None and not self.eplb.started:
            loaded = self.loaded_placement() if self.moe_config.ep_size > 1 else None
            self.eplb.begin(self.moe_config.num_logical_experts, loaded)
        num_local = self.routed_experts.w13_weight.shape[0]
        if self.step_comm is MoECommType.ALLGATHER:
            weights, logical = select_experts(self.router, router_logits)
            local = self._local_ids(logical.long(), hidden_states.shape[0])
            experts = self._expert_rows
            lora_rows = (
                None if self.expert_lora is None else self.expert_lora.row_slots(local, logical, num_local)
            )
            if lora_rows is not None:
                experts = functools.partial(self._expert_rows, lora_rows=lora_rows)
            out = allgather_experts(hidden_states, local, weights, num_local, experts)
            if self._reduces_inside:
                out = get_tp_group().all_reduce(out)
        else:
            tp_group = get_tp_group()
            x = split_tokens(hidden_states, tp_group.rank_in_group, self.comm.tp_size)
            logits = split_tokens(router_logits, tp_group.rank_in_group, self.comm.tp_size)
            weights, logical = select_experts(self.router, logits)
            physical = self._physical_ids(logical.long())
            ep_group = get_ep_group().device_group
            if self.step_comm is MoECommType.ALLTOALL:
                part = alltoall_experts(x, physical, weights, num_local, self._expert_rows, ep_group)
            else:
                part = mc2_experts(
                    x, physical, weights, num_local, self._expert_rows, ep_group, self.comm.rank_capacity
                )
            out = gather_tokens(part, hidden_states.shape[0], tp_group.device_group, self.comm.tp_size)
        if self.eplb is not None and self.moe_index == len(self.eplb.layers) - 1:
            self.eplb.forward_end(_real_forward_phase(self.decode_query_len))
        return out.to(hidden_states.dtype)

    def _expert_rows(
        self, rows: torch.Tensor, counts: torch.Tensor, lora_rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """This rank's experts on ``rows`` grouped by local expert (``counts`` rows each); with ``lora_rows``
        (each row's ``slot * E + expert``, -1 without an adapter) plus the adapters' deltas."""
        if self.moe_load is not None and _real_forward_phase(self.decode_query_len) is not None:
            self.moe_load += counts.to(self.moe_load.device)
        quant_method = self.routed_experts.quant_method
        if not isinstance(quant_method, UnquantizedFusedMoEMethod):
            return quant_method.apply_experts(self.routed_experts, rows, counts)
        ad = get_device_adaptor()
        w13 = self.routed_experts.w13_weight.transpose(1, 2)
        w2 = self.routed_experts.w2_weight.transpose(1, 2)
        hidden = ad.grouped_matmul(rows, w13, counts, bias=self._expert_bias("w13_bias"))
        if lora_rows is None:
            return ad.grouped_matmul(self._activation(hidden), w2, counts, bias=self._expert_bias("w2_bias"))
        assert self.expert_lora is not None
        self.expert_lora.add_w13(hidden, rows, lora_rows)
        activated = self._activation(hidden)
        out = ad.grouped_matmul(activated, w2, counts, bias=self._expert_bias("w2_bias"))
        self.expert_lora.add_w2(out, activated, lora_rows)
        return out

    def _local_ids(self, logical: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Local slot of each token copy (-1 where another rank computes it): the placement's physical
        slots (a token's replica chosen by token index, the same on every rank), vLLM's expert-parallel
        map, or the logical ids."""
        if self.log2phy is not None and self.moe_load is not None:
            ranks, held = self.log2phy.shape[0], self.moe_load.numel()
            token_rank = torch.arange(num_tokens, device=logical.device) % ranks
            local = self.log2phy[token_rank[:, None], logical] - self.moe_config.ep_rank * held
            return torch.where((local >= 0) & (local < held), local, -1)
        if self.moe_config.ep_size > 1:
            ep_map = self.routed_experts.expert_map_manager.expert_map
            assert ep_map is not None
            return ep_map.to(logical.device)[logical]
        return logical

    def _physical_ids(self, logical: torch.Tensor) -> torch.Tensor:
        """Physical expert ``rank * L + local slot`` of each token copy: this rank's row of the placement's
        log2phy, else from vLLM's expert placement."""
        if self.log2phy is not None:
            return self.log2phy[self.moe_config.ep_rank].to(logical.device)[logical]
        if self._physical_map is None:
            table = torch.as_tensor(self.loaded_placement())
            physical = torch.empty(table.numel(), dtype=torch.long)
            physical[table.reshape(-1)] = torch.arange(table.numel())
            self._physical_map = physical.to(logical.device)
        return self._physical_map[logical]
