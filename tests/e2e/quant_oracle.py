"""Independent fake-quant forward of Qwen3 / Qwen3-MoE model directories: what the e2e tests compare vLLM to.

Reads ``config.json``, ``*.safetensors`` and, when present, ``quant_model_description.json`` (the
ModelSlim layout of issue 15, contract §1) and runs the whole sequence in plain PyTorch: RMSNorm,
q/k norm, rotary (``rope_parameters`` or legacy ``rope_theta``), GQA causal attention, SwiGLU MLP or
the Qwen3-MoE block (softmax router, top-k, ``norm_topk_prob``, SwiGLU experts), tied or untied head.

Every quantized linear is dequantised from the checkpoint's own tensors and its input is fake-quantised
as its type says: static per-tensor (W8A8: ``input_scale``/``input_offset``, then the int32 accumulator
plus ``quant_bias`` times ``deq_scale``), per-token dynamic int8 (W8A8_DYNAMIC, W4A8_DYNAMIC and the MoE
experts, whose ``silu(gate) * up`` is re-quantised before ``down_proj``), none for W8A16/W4A16.

The maths is float64 throughout: integer products of int8 values are exact there (so the "int32
accumulate" of the device is reproduced exactly) and the oracle's own rounding error is far below the
fp32 engine's, so a mismatch points at the engine. It is written from the contract text and imports
neither vLLM nor ``vllm_ascend.quant``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

COMPUTE_DTYPE = torch.float64
DESCRIPTION_FILE = "quant_model_description.json"
MODEL_TYPES = ("qwen3", "qwen3_moe")
LINEAR_TYPES = ("FLOAT", "W8A8", "W8A8_DYNAMIC", "W8A16", "W4A16", "W4A8_DYNAMIC")
EXPERT_TYPES = ("FLOAT", "W8A8_DYNAMIC", "W4A8_DYNAMIC")
#: Integer range of the stored weight values per type.
_WEIGHT_RANGE = {"W8A8": (-128, 127), "W8A8_DYNAMIC": (-128, 127), "W8A16": (-128, 127)}
_WEIGHT_RANGE |= {"W4A16": (-8, 7), "W4A8_DYNAMIC": (-8, 7)}


class OracleError(ValueError):
    """A model directory the oracle cannot read; the message names the file or tensor and what was expected."""


#: Smallest relative distance to a rounding tie seen by :func:`round_tracked` since the last reset.
_tie_margin = [math.inf]


def round_tracked(r: torch.Tensor) -> torch.Tensor:
    """``torch.round(r)``, remembering how close any value came to a tie (``|frac - 0.5| / max(|r|, 1)``).

    An fp32 engine computes the same ``r`` with a relative error near 1e-7; a value that close to a tie
    may round the other way there, moving one activation by a whole quantisation step.
    """
    if r.numel():
        margin = ((r - torch.floor(r) - 0.5).abs() / r.abs().clamp_min(1.0)).min()
        _tie_margin[0] = min(_tie_margin[0], float(margin))
    return torch.round(r)


def per_token_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: scale = max|row| / 127 (0 for a zero row), q = round(x / scale) in ±127."""
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return round_tracked(x / safe).clamp(-127, 127), scale


@dataclass(frozen=True)
class OracleLinear:
    """One linear layer: its type, the dequantised weight and what the quantized input path needs.

    ``qweight`` holds the stored integers (as float64; exact), ``weight`` the dequantised float weight.
    """

    prefix: str
    quant_type: str
    weight: torch.Tensor
    bias: torch.Tensor | None = None
    qweight: torch.Tensor | None = None
    weight_scale: torch.Tensor | None = None
    input_scale: float = 0.0
    input_offset: float = 0.0
    deq_scale: torch.Tensor | None = None
    quant_bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, activation_quant: bool) -> torch.Tensor:
        if not activation_quant or self.qweight is None:
            y = x @ self.weight.T
        elif self.quant_type == "W8A8":
            assert self.deq_scale is not None and self.quant_bias is not None
            xq = (round_tracked(x / self.input_scale) + self.input_offset).clamp(-128, 127)
            y = (xq @ self.qweight.T + self.quant_bias) * self.deq_scale
        else:
            assert self.weight_scale is not None
            xq, xs = per_token_quant(x)
            y = (xq @ self.qweight.T) * self.weight_scale * xs
        return y if self.bias is None else y + self.bias


class _Checkpoint:
    """The tensors and description of one model directory; remembers which tensors were read."""

    def __init__(self, model_dir: Path):
        from safetensors.torch import load_file

        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise OracleError(f"{model_dir}: no *.safetensors file")
        self.tensors: dict[str, torch.Tensor] = {}
        for file in files:
            self.tensors.update(load_file(file))
        self.used: set[str] = set()
        self.types: dict[str, str] | None = None
        self.model_quant_type: str | None = None
        self.group_size = 0
        path = model_dir / DESCRIPTION_FILE
        if path.exists():
            self._read_description(path)

    def _read_description(self, path: Path) -> None:
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise OracleError(f"{path}: not JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise OracleError(f"{path}: expected a JSON object, got {type(raw).__name__}")
        quant_type = raw.pop("model_quant_type", None)
        if quant_type not in LINEAR_TYPES[1:]:
            raise OracleError(
                f"{path}: model_quant_type is {quant_type!r}; allowed: {', '.join(LINEAR_TYPES[1:])}"
            )
        raw.pop("version", None)
        group_size = raw.pop("group_size", 0)
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 0:
            raise OracleError(f"{path}: group_size is {group_size!r}; expected an integer >= 0")
        if group_size and quant_type == "W4A8_DYNAMIC":
            raise OracleError(
                f"{path}: group_size {group_size} with W4A8_DYNAMIC; it is per channel only (0)"
            )
        for name, value in raw.items():
            if value not in LINEAR_TYPES:
                raise OracleError(f"{path}: {name} has type {value!r}; allowed: {', '.join(LINEAR_TYPES)}")
        self.types, self.model_quant_type, self.group_size = raw, quant_type, group_size

    def type_of(self, name: str) -> str:
        if self.types is None:
            return "FLOAT"
        if name not in self.types:
            raise OracleError(f"{name} is not in {DESCRIPTION_FILE}")
        return self.types[name]

    def raw(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        if name not in self.tensors:
            raise OracleError(f"checkpoint tensor {name} is missing")
        tensor = self.tensors[name]
        if shape is not None and tuple(tensor.shape) != shape:
            raise OracleError(f"{name} has shape {tuple(tensor.shape)}; expected {shape}")
        self.used.add(name)
        return tensor

    def floating(self, name: str, shape: tuple[int, ...], optional: bool = False) -> torch.Tensor | None:
        """A tensor that must be FLOAT in the description and floating point in the file."""
        if optional and name not in self.tensors:
            return None
        if self.type_of(name) != "FLOAT":
            raise OracleError(f"{name} has type {self.type_of(name)!r}; expected 'FLOAT'")
        tensor = self.raw(name, shape)
        if not tensor.is_floating_point():
            raise OracleError(f"{name} has dtype {tensor.dtype}; expected a floating dtype")
        return tensor.to(COMPUTE_DTYPE)

    def linear(
        self, prefix: str, out_features: int, in_features: int, allowed: Sequence[str]
    ) -> OracleLinear:
        quant_type = self.type_of(f"{prefix}.weight")
        if quant_type not in allowed:
            raise OracleError(f"{prefix}.weight has type {quant_type!r}; allowed here: {', '.join(allowed)}")
        bias = self.floating(f"{prefix}.bias", (out_features,), optional=True)
        if quant_type == "FLOAT":
            weight = self.floating(f"{prefix}.weight", (out_features, in_features))
            assert weight is not None
            return OracleLinear(prefix, quant_type, weight, bias)
        qweight = self._integers(f"{prefix}.weight", (out_features, in_features), torch.int8, quant_type)
        groups = self._groups(prefix, quant_type, in_features)
        scale = self._float(f"{prefix}.weight_scale", (out_features, groups))
        offset = self._float(f"{prefix}.weight_offset", (out_features, groups))
        if quant_type in ("W8A8", "W8A8_DYNAMIC", "W4A8_DYNAMIC") and bool(offset.any()):
            raise OracleError(f"{prefix}.weight_offset must be all 0 for {quant_type} (symmetric weights)")
        width = in_features // groups
        weight = (qweight - offset.repeat_interleave(width, dim=1)) * scale.repeat_interleave(width, dim=1)
        if quant_type in ("W8A16", "W4A16"):
            return OracleLinear(prefix, quant_type, weight, bias)
        if quant_type != "W8A8":
            return OracleLinear(prefix, quant_type, weight, bias, qweight, scale[:, 0])
        input_scale = self._float(f"{prefix}.input_scale", (1,)).item()
        input_offset = self._float(f"{prefix}.input_offset", (1,)).item()
        if not input_scale > 0:
            raise OracleError(f"{prefix}.input_scale is {input_scale}; expected > 0")
        if input_offset != round(input_offset) or not -128 <= input_offset <= 127:
            raise OracleError(f"{prefix}.input_offset is {input_offset}; expected an integer in [-128, 127]")
        return OracleLinear(
            prefix,
            quant_type,
            weight,
            bias,
            qweight,
            scale[:, 0],
            input_scale,
            input_offset,
            self._deq_scale(f"{prefix}.deq_scale", out_features),
            self._integers(f"{prefix}.quant_bias", (out_features,), torch.int32, None),
        )

    def _groups(self, prefix: str, quant_type: str, in_features: int) -> int:
        """Scale columns: 1 (per channel) or in/group_size for a per-group weight-only layer."""
        scale = self.raw(f"{prefix}.weight_scale")
        if scale.dim() != 2 or scale.shape[1] == 1 or quant_type not in ("W8A16", "W4A16"):
            return 1
        if not self.group_size or in_features % self.group_size:
            raise OracleError(
                f"{prefix}.weight_scale has {scale.shape[1]} columns but group_size is {self.group_size} "
                f"(in features {in_features}); expected 1 column or in_features / group_size"
            )
        return in_features // self.group_size

    def _float(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        tensor = self.raw(name, shape)
        if not tensor.is_floating_point():
            raise OracleError(f"{name} has dtype {tensor.dtype}; expected a floating dtype")
        return tensor.to(COMPUTE_DTYPE)

    def _integers(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, quant_type: str | None
    ) -> torch.Tensor:
        tensor = self.raw(name, shape)
        if tensor.dtype != dtype:
            raise OracleError(f"{name} has dtype {tensor.dtype}; expected {dtype}")
        if quant_type is not None:
            low, high = _WEIGHT_RANGE[quant_type]
            if int(tensor.min()) < low or int(tensor.max()) > high:
                raise OracleError(f"{name} holds values outside [{low}, {high}] required by {quant_type}")
        return tensor.to(COMPUTE_DTYPE)

    def _deq_scale(self, name: str, out_features: int) -> torch.Tensor:
        """float32 ``deq_scale``, or int64 whose low 32 bits are the float32 bits."""
        tensor = self.raw(name, (out_features,))
        if tensor.dtype == torch.int64:
            low = (tensor & 0xFFFFFFFF).to(torch.int64)
            tensor = torch.where(low >= 2**31, low - 2**32, low).to(torch.int32).view(torch.float32)
        elif tensor.dtype != torch.float32:
            raise OracleError(f"{name} has dtype {tensor.dtype}; expected torch.float32 or torch.int64")
        return tensor.to(COMPUTE_DTYPE)


@dataclass(frozen=True)
class _Attention:
    q: OracleLinear
    k: OracleLinear
    v: OracleLinear
    o: OracleLinear
    q_norm: torch.Tensor
    k_norm: torch.Tensor


@dataclass(frozen=True)
class _Mlp:
    gate: OracleLinear
    up: OracleLinear
    down: OracleLinear

    def __call__(self, x: torch.Tensor, activation_quant: bool) -> torch.Tensor:
        hidden = F.silu(self.gate(x, activation_quant)) * self.up(x, activation_quant)
        return self.down(hidden, activation_quant)


@dataclass(frozen=True)
class _Moe:
    router: torch.Tensor
    experts: tuple[_Mlp, ...]
    top_k: int
    norm_topk_prob: bool

    def __call__(self, x: torch.Tensor, activation_quant: bool) -> torch.Tensor:
        probs = torch.softmax(x @ self.router.T, dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for expert in ids.unique().tolist():
            rows, slots = torch.where(ids == expert)
            y = self.experts[expert](x[rows], activation_quant)
            out.index_add_(0, rows, y * weights[rows, slots, None])
        return out


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor
    attention: _Attention
    post_norm: torch.Tensor
    mlp: _Mlp | _Moe


class Oracle:
    """The float64 forward of one model directory; ``activation_quant=False`` keeps only the dequantised weights."""

    def __init__(self, model_dir: Path | str, *, activation_quant: bool = True):
        self.model_dir = Path(model_dir)
        self.activation_quant = activation_quant
        #: After :meth:`logits`: the smallest relative distance of a quantised activation to a rounding tie.
        self.tie_margin = math.inf
        config_path = self.model_dir / "config.json"
        if not config_path.exists():
            raise OracleError(f"{config_path} is missing")
        self.config: dict[str, Any] = json.loads(config_path.read_text())
        cfg = self.config
        if cfg.get("model_type") not in MODEL_TYPES:
            raise OracleError(
                f"{config_path}: model_type is {cfg.get('model_type')!r}; allowed: {', '.join(MODEL_TYPES)}"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise OracleError(f"{config_path}: hidden_act is {cfg['hidden_act']!r}; expected 'silu'")
        if cfg.get("use_sliding_window"):
            raise OracleError(f"{config_path}: use_sliding_window is set; only full attention is supported")
        self.hidden = cfg["hidden_size"]
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg.get("num_key_value_heads", self.num_heads)
        self.head_dim = cfg.get("head_dim") or self.hidden // self.num_heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.vocab = cfg["vocab_size"]
        self.rope_theta = self._rope_theta(config_path)
        ckpt = _Checkpoint(self.model_dir)
        #: The description's scheme (``None`` for a float checkpoint) and each linear layer's type.
        self.model_quant_type = ckpt.model_quant_type
        self.linear_types: dict[str, str] = {}
        self.embed = ckpt.floating("model.embed_tokens.weight", (self.vocab, self.hidden))
        self.layers = [self._layer(ckpt, i) for i in range(cfg["num_hidden_layers"])]
        self.norm = ckpt.floating("model.norm.weight", (self.hidden,))
        tied = cfg.get("tie_word_embeddings", "lm_head.weight" not in ckpt.tensors)
        head = ckpt.floating("lm_head.weight", (self.vocab, self.hidden), optional=tied)
        self.lm_head = self.embed if tied else head
        unused = sorted(set(ckpt.tensors) - ckpt.used)
        if unused:
            raise OracleError(f"{self.model_dir}: checkpoint tensors not used by the model: {unused[:8]}")

    def _rope_theta(self, config_path: Path) -> float:
        params = self.config.get("rope_parameters") or self.config.get("rope_scaling") or {}
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise OracleError(f"{config_path}: rope_type is {rope_type!r}; only 'default' is supported")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise OracleError(f"{config_path}: partial_rotary_factor must be 1.0")
        return float(params.get("rope_theta", self.config.get("rope_theta", 10000.0)))

    def _layer(self, ckpt: _Checkpoint, index: int) -> _Layer:
        cfg, p = self.config, f"model.layers.{index}"
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim

        def linear(name: str, out_features: int, in_features: int, allowed=LINEAR_TYPES) -> OracleLinear:
            layer = ckpt.linear(name, out_features, in_features, allowed)
            self.linear_types[name] = layer.quant_type
            return layer

        attention = _Attention(
            linear(f"{p}.self_attn.q_proj", q_size, self.hidden),
            linear(f"{p}.self_attn.k_proj", kv_size, self.hidden),
            linear(f"{p}.self_attn.v_proj", kv_size, self.hidden),
            linear(f"{p}.self_attn.o_proj", self.hidden, q_size),
            ckpt.floating(f"{p}.self_attn.q_norm.weight", (self.head_dim,)),
            ckpt.floating(f"{p}.self_attn.k_norm.weight", (self.head_dim,)),
        )
        num_experts = cfg.get("num_experts", cfg.get("num_local_experts", 0))
        sparse = (
            cfg["model_type"] == "qwen3_moe"
            and num_experts > 0
            and index not in cfg.get("mlp_only_layers", [])
            and (index + 1) % cfg.get("decoder_sparse_step", 1) == 0
        )
        mlp: _Mlp | _Moe
        if sparse:
            size = cfg["moe_intermediate_size"]

            def expert(e: int) -> _Mlp:
                q = f"{p}.mlp.experts.{e}"
                return _Mlp(
                    linear(f"{q}.gate_proj", size, self.hidden, EXPERT_TYPES),
                    linear(f"{q}.up_proj", size, self.hidden, EXPERT_TYPES),
                    linear(f"{q}.down_proj", self.hidden, size, EXPERT_TYPES),
                )

            router = ckpt.floating(f"{p}.mlp.gate.weight", (num_experts, self.hidden))
            mlp = _Moe(
                router,
                tuple(expert(e) for e in range(num_experts)),
                cfg["num_experts_per_tok"],
                bool(cfg.get("norm_topk_prob", False)),
            )
        else:
            size = cfg["intermediate_size"]
            mlp = _Mlp(
                linear(f"{p}.mlp.gate_proj", size, self.hidden),
                linear(f"{p}.mlp.up_proj", size, self.hidden),
                linear(f"{p}.mlp.down_proj", self.hidden, size),
            )
        return _Layer(
            ckpt.floating(f"{p}.input_layernorm.weight", (self.hidden,)),
            attention,
            ckpt.floating(f"{p}.post_attention_layernorm.weight", (self.hidden,)),
            mlp,
        )

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * weight

    def _rotary(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[T, 1, D]``, tabulated in float32 as HF and vLLM do, then widened to float64.

        A float64 table would differ from every engine's by ~1e-7, enough to flip the rounding of some
        fake-quantised activations downstream.
        """
        half = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
        inv_freq = 1.0 / self.rope_theta**half
        angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)[:, None, :]
        return angles.cos().to(COMPUTE_DTYPE), angles.sin().to(COMPUTE_DTYPE)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-second, first], dim=-1) * sin

    def _attention(self, attn: _Attention, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        length, aq = x.shape[0], self.activation_quant
        q = self._rms(attn.q(x, aq).view(length, self.num_heads, self.head_dim), attn.q_norm)
        k = self._rms(attn.k(x, aq).view(length, self.num_kv_heads, self.head_dim), attn.k_norm)
        v = attn.v(x, aq).view(length, self.num_kv_heads, self.head_dim)
        q, k = self._rotate(q, *rope), self._rotate(k, *rope)
        group = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(self.head_dim)
        future = torch.ones(length, length, dtype=torch.bool).triu(1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        out = torch.einsum("hts,shd->thd", probs, v).reshape(length, -1)
        return attn.o(out, aq)

    @torch.inference_mode()
    def logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Float64 logits ``[T, vocab]`` of a full-sequence forward (position t predicts token t + 1)."""
        ids = torch.as_tensor(list(token_ids), dtype=torch.long)
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.vocab:
            raise OracleError(
                f"token_ids must be non-empty ids in [0, {self.vocab}); got {list(token_ids)[:8]}"
            )
        _tie_margin[0] = math.inf
        rope = self._rotary(ids.numel())
        h = self.embed[ids]
        for layer in self.layers:
            h = h + self._attention(layer.attention, self._rms(h, layer.input_norm), rope)
            h = h + layer.mlp(self._rms(h, layer.post_norm), self.activation_quant)
        self.tie_margin = _tie_margin[0]
        return self._rms(h, self.norm) @ self.lm_head.T

    def greedy(self, prompt_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Greedy continuation (full recomputation each step, EOS ignored like ``ignore_eos=True``)."""
        ids = list(prompt_ids)
        for _ in range(max_tokens):
            ids.append(int(self.logits(ids)[-1].argmax()))
        return ids[len(prompt_ids) :]

    def perplexity(self, token_ids: Sequence[int]) -> float:
        """exp(mean negative log-likelihood of tokens 1..T-1 given their prefixes)."""
        if len(token_ids) < 2:
            raise OracleError(f"perplexity needs at least 2 tokens; got {len(token_ids)}")
        logprobs = torch.log_softmax(self.logits(token_ids)[:-1], dim=-1)
        targets = torch.as_tensor(list(token_ids[1:]), dtype=torch.long)
        return math.exp(-logprobs[torch.arange(targets.numel()), targets].mean().item())


def load_oracle(model_dir: Path | str, *, activation_quant: bool = True) -> Oracle:
    """Read ``model_dir`` (float HF or ModelSlim-quantized Qwen3 / Qwen3-MoE) into an :class:`Oracle`."""
    return Oracle(model_dir, activation_quant=activation_quant)
