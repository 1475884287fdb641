"""Qwen3-Next's Gated DeltaNet layer with its core on ``vllm_ascend.kernels``.

Why this layer exists: vLLM's ``QwenGatedDeltaNetAttention`` computes its core (causal conv1d, gating and
the gated delta rule over the mamba-style state cache) with FLA Triton kernels written for CUDA, and warms
them up in the profile run. This subclass keeps vLLM's projections, gated norm and the opaque custom op
``vllm::qwen_gdn_attention_core`` (a graph splitting point under torch.compile) and replaces only the core
that op calls: ``causal_conv1d_fn`` / ``causal_conv1d_update``, ``fused_gdn_gating``, and
``chunk_gated_delta_rule`` (steps with prefills: the Triton kernel where Triton runs) /
``recurrent_gated_delta_rule`` (decode-only steps). Under prefix caching (``mamba_cache_mode="align"``) the
state lines are the blocks vLLM's metadata names for each step, into which the runner's state copies moved
the previous state. The platform refuses tensor parallelism and speculative decoding for these models at
config time.
"""

from __future__ import annotations

import torch
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata

from vllm_ascend.kernels import causal_conv1d_fn, causal_conv1d_update, fused_gdn_gating
from vllm_ascend.kernels.gated_delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule


class AscendQwenGatedDeltaNetAttention(QwenGatedDeltaNetAttention):
    """vLLM's layer (weights, projections, state shapes, custom op) with :meth:`_forward_core` on our kernels."""

    def _forward_core(
        self,
        mixed_qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        core_attn_out: torch.Tensor,
    ) -> None:
        """Fill ``core_attn_out`` from the projected ``mixed_qkv`` ``[T, 2*key_dim + value_dim]`` and the
        gate inputs ``b``, ``a`` ``[T, Hv]``; nothing to do in profile and dummy runs (no metadata)."""
        metadata = get_forward_context().attn_metadata
        layer_metadata = metadata.get(self.prefix) if isinstance(metadata, dict) else None
        if layer_metadata is not None:
            self._core(layer_metadata, mixed_qkv, b, a, core_attn_out)

    def _core(
        self,
        meta: GDNAttentionMetadata,
        mixed_qkv: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        out: torch.Tensor,
    ) -> None:
        """Conv1d, gating and the delta rule for the batch's sequences; writes ``out[:num_actual_tokens]``
        and advances each sequence's conv and recurrent state in the layer's cache."""
        tokens = meta.num_actual_tokens
        if tokens == 0:
            return
        conv_state = self.kv_cache[0] if is_conv_state_dim_first() else self.kv_cache[0].transpose(-1, -2)
        ssm_state = self.kv_cache[1]  # [slots, Hv, V, K]
        weight = self.conv1d.weight.view(self.conv1d.weight.size(0), self.conv1d.weight.size(2))
        start_loc = meta.non_spec_query_start_loc
        lines = meta.non_spec_state_indices_tensor
        assert start_loc is not None and lines is not None
        num_seqs = meta.num_prefills + meta.num_decodes
        start_loc, lines = start_loc[: num_seqs + 1], lines[:num_seqs]
        x = mixed_qkv[:tokens]
        if meta.num_prefills == 0:
            # Decode only: one token per sequence, every sequence continues from its state.
            x = causal_conv1d_update(x, conv_state, weight, self.conv1d.bias, self.activation, lines)
            has_state = torch.ones(num_seqs, dtype=torch.bool, device=x.device)
        else:
            assert meta.has_initial_state is not None
            has_state = meta.has_initial_state[:num_seqs]
            x = causal_conv1d_fn(
                x.transpose(0, 1).contiguous(),
                weight,
                self.conv1d.bias,
                conv_state,
                start_loc,
                lines,
                has_state,
                self.activation,
            ).transpose(0, 1)
        q, k, v = torch.split(x, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        g, beta = fused_gdn_gating(self.A_log, a[:tokens], b[:tokens], self.dt_bias)
        initial = ssm_state[lines].transpose(-1, -2).to(torch.float32)
        initial[~has_state] = 0
        rule = recurrent_gated_delta_rule if meta.num_prefills == 0 else chunk_gated_delta_rule
        core, final = rule(
            q.reshape(tokens, -1, self.head_k_dim),
            k.reshape(tokens, -1, self.head_k_dim),
            v.reshape(tokens, -1, self.head_v_dim),
            g[0],
            beta[0],
            start_loc,
            initial,
        )
        ssm_state[lines] = final.transpose(-1, -2).to(ssm_state.dtype)
        out[:tokens] = core
