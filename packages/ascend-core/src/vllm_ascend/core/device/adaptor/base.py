"""The device-op interface every family implements, with per-op call counting.

Each op is declared once here (name, signature, semantics). Concrete adaptors override the ops;
:meth:`BaseDeviceAdaptor.__init_subclass__` wraps every override so that one call to an op adds
one to ``adaptor.call_counts[op]`` (an override that calls ``super()`` still counts once).
Tests use the counter to prove which adaptor's code ran.
"""

from __future__ import annotations

import abc
import functools
import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar, Literal

import torch

from vllm_ascend.core.device.adaptor import kv_layout
from vllm_ascend.core.device.adaptor.kv_layout import TOKEN_MAJOR
from vllm_ascend.core.device.adaptor.memory_pool import TaggedMemoryPool

GroupListType = Literal["count", "cumsum"]
GROUP_LIST_TYPES: tuple[str, ...] = ("count", "cumsum")
WeightFormat = Literal["ND", "NZ"]
#: Storage formats of a quantized weight: ND (row-major) or NZ (Ascend's fractal layout, FRACTAL_NZ).
WEIGHT_FORMATS: tuple[str, ...] = ("ND", "NZ")
SCORING_FUNCS: tuple[str, ...] = ("softmax", "sigmoid")

OPS: tuple[str, ...] = (
    "reshape_and_cache",
    "fused_infer_attention",
    "kv_load",
    "packed_attention",
    "rms_norm",
    "add_rms_norm",
    "swiglu",
    "clipped_swiglu",
    "rotary_embedding",
    "mrope",
    "moe_gating_top_k",
    "moe_init_routing",
    "moe_finalize_routing",
    "moe_distribute_dispatch",
    "moe_distribute_combine",
    "grouped_matmul",
    "grouped_matmul_swiglu_quant",
    "grouped_quant_matmul",
    "quantize",
    "dynamic_quant",
    "quant_matmul",
    "weight_quant_matmul",
    "cast_weight_format",
)

#: Fused ops: each equals a sequence of the ops above (its docstring says which), as one kernel where the
#: device has one. Graph fusion passes rewrite the unfused sequences into these; counted like :data:`OPS`.
FUSED_OPS: tuple[str, ...] = (
    "add_rms_norm_quant",
    "add_rms_norm_dynamic_quant",
    "rms_norm_quant",
    "rms_norm_dynamic_quant",
    "swiglu_quant",
    "swiglu_dynamic_quant",
    "qk_rmsnorm_rope",
    "muls_add",
)

#: Ops of the runtime section counted like :data:`OPS` (the random draws samplers make).
RUNTIME_OPS: tuple[str, ...] = ("random_fill", "swap_blocks")
#: Above this many separate runs of consecutive rows, :meth:`BaseDeviceAdaptor.swap_blocks` gathers and
#: scatters once instead of one copy per run (for a pair of tensors on one device).
SWAP_BLOCKS_MAX_RUNS = 64
#: What :meth:`BaseDeviceAdaptor.random_fill` draws: ``uniform`` in ``[0, 1)``, ``exponential`` Exp(1) (at or
#: above the dtype's smallest normal, so reciprocals stay finite), ``seed`` integers in ``[0, 2**62)``.
RANDOM_DISTRIBUTIONS: tuple[str, ...] = ("uniform", "exponential", "seed")
RANDOM_SEED_BOUND = 1 << 62


class DeviceOpError(ValueError):
    """A device op called with arguments outside its contract (shape, dtype or option)."""


def _counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: BaseDeviceAdaptor, *args: Any, **kwargs: Any) -> Any:
        active = self._active_ops
        if name in active:  # an override calling super(): already counted
            return fn(self, *args, **kwargs)
        self.call_counts[name] += 1
        active.add(name)
        try:
            return fn(self, *args, **kwargs)
        finally:
            active.discard(name)

    wrapper.__counted__ = True  # type: ignore[attr-defined]
    return wrapper


def count_overrides(cls: type, names: tuple[str, ...]) -> None:
    """Wrap ``cls``'s own definitions of the ops ``names`` so each call adds one to ``call_counts`` (the op
    families' ``__init_subclass__``: the base ops here, the MLA and sparse-attention mixins)."""
    for name in names:
        fn = cls.__dict__.get(name)
        if fn is not None and not getattr(fn, "__counted__", False):
            setattr(cls, name, _counted(name, fn))


@dataclass(frozen=True)
class MoeDispatch:
    """What :meth:`BaseDeviceAdaptor.moe_distribute_dispatch` hands to the experts, and back to the combine.

    ``expand_x [A, H]``: the token copies this rank received, grouped by local expert (within an expert,
    by source rank, then by the sender's token order); rows past ``expert_token_nums.sum()`` are padding.
    ``expert_token_nums [L]`` (int64): rows per local expert, ``group_list_type="count"``. ``handle``: the
    adaptor's routing state for the combine (opaque to callers).
    """

    expand_x: torch.Tensor
    expert_token_nums: torch.Tensor
    handle: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class AttentionPlan:
    """One step's attention lengths, checked once against its block table (:meth:`BaseDeviceAdaptor.plan_attention`)
    and shared by every layer's ``fused_infer_attention`` of the step, which then checks only that it got the
    same tensors. ``starts`` / ``lens`` are the host values; ``state`` holds what a device derives from them
    once per step (filled by its first layer, read by the others)."""

    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_size: int
    causal: bool
    starts: tuple[int, ...]
    lens: tuple[int, ...]
    #: Requests with one query row, and those with more (a request with none is idle this step).
    decodes: tuple[int, ...]
    prefills: tuple[int, ...]
    state: dict[Any, Any] = field(default_factory=dict, compare=False)
    #: Each request's query rows (``starts[b + 1] - starts[b]``).
    q_lens: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "q_lens", tuple(end - start for start, end in itertools.pairwise(self.starts))
        )

    @property
    def num_tokens(self) -> int:
        """Query rows the step's requests own (``query_start_loc[-1]``)."""
        return self.starts[-1]


def seq_blocks(block_table: torch.Tensor, b: int, seq_len: int, block_size: int) -> int:
    """The blocks request ``b``'s ``seq_len`` keys fill; refused where its ``block_table`` row is shorter."""
    num_blocks = -(-seq_len // block_size)
    if num_blocks > block_table.shape[1]:
        raise DeviceOpError(
            f"seq_lens[{b}]={seq_len} needs {num_blocks} blocks of {block_size} but block_table has "
            f"{block_table.shape[1]} columns"
        )
    return num_blocks


def check_attention_plan(
    plan: AttentionPlan,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    causal: bool,
) -> None:
    """Refuse a plan made for other tensors, another block size or the other causality."""
    if not (
        plan.block_table is block_table
        and plan.query_start_loc is query_start_loc
        and plan.seq_lens is seq_lens
    ):
        raise DeviceOpError(
            "plan was made for another block_table / query_start_loc / seq_lens; pass the tensors it was made "
            "for, or plan=None"
        )
    if plan.block_size != block_size or plan.causal != causal:
        raise DeviceOpError(
            f"plan was made for block_size={plan.block_size}, causal={plan.causal}; got block_size={block_size}, "
            f"causal={causal}"
        )


class BaseDeviceAdaptor(abc.ABC):
    """Every device op the plugin uses; one subclass per device family (and the reference)."""

    #: Family name shown by ``vllm-ascend doctor`` (``"reference"``, ``"A2/A3"``, ``"A5"``, ``"310P"``).
    family: ClassVar[str] = ""
    #: Whether a captured graph's ``fused_infer_attention`` takes new sequence lengths / query offsets written
    #: into its metadata tensors before a replay (what FULL graphs need). The reference graph re-runs the op
    #: on those tensors; on an NPU the op's host-side lengths are baked into the captured task and need
    #: torch_npu's graph task update, which this version does not issue: FULL graphs are refused there.
    replays_attention_params: ClassVar[bool] = False
    #: Whether the device's ops are torch's CPU ops (the reference device): torch's intra-op threads are then the
    #: device's compute, and a worker serves with its share of the host's CPUs rather than vLLM's one thread.
    computes_on_host: ClassVar[bool] = False
    #: vLLM's device communicator on this device (``Platform.get_device_communicator_cls``): a class path.
    communicator_cls: ClassVar[str] = ""
    #: Ops whose implementation here is plain torch code a compiler can trace into (on the reference device).
    #: Where a compile runs none of the plugin's graph passes (vLLM's ``DYNAMO_TRACE_ONCE`` mode), these are
    #: traced as that code instead of one opaque node, so Inductor fuses them with their neighbours.
    traceable_ops: ClassVar[frozenset[str]] = frozenset()

    def __init__(self) -> None:
        self.call_counts: Counter[str] = Counter()
        self._active_ops: set[str] = set()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        count_overrides(cls, OPS + FUSED_OPS + RUNTIME_OPS)

    def reset_counts(self) -> None:
        self.call_counts.clear()

    # -- runtime: devices, streams, memory -------------------------------------------------
    @abc.abstractmethod
    def torch_device(self, local_rank: int) -> torch.device:
        """The torch device a worker of ``local_rank`` runs on."""

    @abc.abstractmethod
    def set_device(self, device: torch.device) -> None:
        """Make ``device`` the current device of this process."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait until all work issued to the current device has finished."""

    @abc.abstractmethod
    def empty_cache(self) -> None:
        """Return cached, unused device memory to the driver."""

    @abc.abstractmethod
    def stream_api(self) -> dict[str, Any]:
        """The ``torch.cuda``-style stream/event API: ``Stream``, ``Event``, ``current_stream``, ``stream``,
        ``set_stream`` (Model Runner V2's async output copies switch streams with it); ``Tensor.<method>`` entries
        replace tensor methods while vLLM's code runs (``record_stream`` where streams order nothing);
        ``CUDAGraph`` and ``graph`` where the device captures graphs the CUDA way (Model Runner V2's FULL graphs)."""

    @abc.abstractmethod
    def capture_graph(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], pool: Any = None
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once as a graph capture; return a ``CapturedGraph`` (see
        ``adaptor/graph.py``): its ``output`` and ``replay()``, which recomputes that output in place
        from the buffers the capture read. ``pool``: the device's graph memory pool (or None)."""

    @abc.abstractmethod
    def graph_pool_handle(self) -> Any:
        """A handle of a new graph memory pool (captures given the same handle share its memory): vLLM's
        ``Platform.get_global_graph_pool`` and Model Runner V2's graph manager ask for it."""

    @abc.abstractmethod
    def memory_pool(self) -> TaggedMemoryPool:
        """This process's tagged memory pool (sleep mode): regions at fixed addresses whose physical memory
        sleep releases and wake-up backs again (``adaptor/memory_pool.py``)."""

    @abc.abstractmethod
    def install_runtime_shims(self) -> None:
        """Make vLLM's direct ``torch.accelerator`` calls valid on this device (idempotent)."""

    @abc.abstractmethod
    def device_name(self, device_id: int = 0) -> str:
        """Human-readable name of device ``device_id``."""

    @abc.abstractmethod
    def total_memory(self, device_id: int = 0) -> int:
        """Bytes of memory of device ``device_id``."""

    def core_counts(self, device_id: int = 0) -> tuple[int, int] | None:
        """``(cube cores, vector cores)`` of device ``device_id`` as its runtime reports them; None where
        it reports none (the reference device): launch geometry then uses the profile's counts."""
        return None

    @abc.abstractmethod
    def memory_in_use(self, device: torch.types.Device | None = None) -> float:
        """Bytes this process holds on the device (peak since the last query where the driver tracks it)."""

    @abc.abstractmethod
    def manual_seed_all(self, seed: int) -> None:
        """Seed the device's random generators."""

    @abc.abstractmethod
    def pin_memory_available(self) -> bool:
        """Whether host buffers may be pinned for faster copies to the device."""

    @abc.abstractmethod
    def stateless_process_group(
        self, backend: str, prefix_store: Any, group_rank: int, group_size: int, timeout: timedelta
    ) -> Any:
        """A ``torch.distributed`` ``ProcessGroup`` of the device's collective ``backend`` (``profile.dist_backend``)
        over ``prefix_store``, outside torch's global process-group state (vLLM's stateless groups: a weight
        transfer between a trainer and the workers). Another backend is refused by name."""

    def random_fill(
        self,
        out: torch.Tensor,
        distribution: str,
        generators: Mapping[int, torch.Generator] | None = None,
        counts: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Fill ``out`` in place with independent draws of ``distribution`` (:data:`RANDOM_DISTRIBUTIONS`;
        ``seed`` needs an int64 ``out``, the others a floating one) and return it: the samplers' random draws.

        ``out``'s rows (dim 0) form consecutive segments, ``counts[i]`` rows for segment ``i`` (default: one
        row each); segment ``i`` draws from ``generators[i]`` when given (a request's own generator, so a
        seeded request draws the same values whatever else its batch holds), every other row from the
        global RNG. Segments of zero rows draw nothing from their generator.

        Default: drawn on ``out``'s device with torch (the global RNG for every row, then each seeded segment
        again from its generator, which lives on that device). A family without a device random path draws
        on the host and copies (310P)."""
        segments = self.random_fill_segments(out, distribution, generators, counts)
        _draw(out, distribution, None)
        for index, (start, stop) in enumerate(segments):
            generator = (generators or {}).get(index)
            if generator is not None and stop > start:
                _draw(out[start:stop], distribution, generator)
        if distribution == "exponential":
            out.clamp_(min=torch.finfo(out.dtype).tiny)
        return out

    def swap_blocks(
        self,
        srcs: Sequence[torch.Tensor],
        dsts: Sequence[torch.Tensor],
        src_ids: torch.Tensor,
        dst_ids: torch.Tensor,
    ) -> int:
        """For each pair ``(srcs[t], dsts[t])``, copy row ``src[src_ids[i]]`` to ``dst[dst_ids[i]]`` for every
        ``i``; return the bytes copied.

        The KV offload's block copies between the device cache and host memory, one call per transfer for all
        the cache tensors it touches: each tensor is a 2-D int8 view ``[rows, page_bytes]`` (rows may be
        strided, a page is contiguous), a pair shares its page size; one side of a pair on the device or both on
        the host. ``src_ids`` / ``dst_ids`` are int64 host vectors of one length, in range, with no two
        ``dst_ids`` equal. Issued on the caller's current stream, asynchronous where the host side is pinned
        (the caller orders it with events).

        Default: the runs of ids consecutive on both sides are found once; each run of each pair is one
        ``copy_`` (no staging: host-side gathers and scatters are slower than row copies). Pairs on one device
        with more than :data:`SWAP_BLOCKS_MAX_RUNS` runs gather and scatter there instead. Any device torch
        copies on runs it."""
        check_swap_blocks(srcs, dsts, src_ids, dst_ids)
        count = src_ids.numel()
        if count == 0:
            return 0
        runs = _consecutive_runs(src_ids, dst_ids)
        copied = 0
        for src, dst in zip(srcs, dsts, strict=True):
            on_device = src.device == dst.device and src.device.type != "cpu"
            if on_device and len(runs) > SWAP_BLOCKS_MAX_RUNS:
                dst.index_copy_(0, dst_ids.to(dst.device), src.index_select(0, src_ids.to(src.device)))
            else:
                non_blocking = src.is_pinned() or dst.is_pinned()
                for s, d, n in runs:
                    dst[d : d + n].copy_(src[s : s + n], non_blocking=non_blocking)
            copied += count * src.shape[1]
        return copied

    @staticmethod
    def random_fill_segments(
        out: torch.Tensor,
        distribution: str,
        generators: Mapping[int, torch.Generator] | None,
        counts: Sequence[int] | None,
    ) -> list[tuple[int, int]]:
        """The checked arguments of :meth:`random_fill`: each segment's ``(start, stop)`` rows of ``out``."""
        check_choice("distribution", distribution, RANDOM_DISTRIBUTIONS)
        if distribution == "seed" and out.dtype != torch.int64:
            raise DeviceOpError(f"random_fill: distribution 'seed' needs an int64 out, got {out.dtype}")
        if distribution != "seed" and not out.is_floating_point():
            raise DeviceOpError(
                f"random_fill: distribution {distribution!r} needs a floating out, got {out.dtype}"
            )
        rows = out.shape[0] if out.dim() else 1
        sizes = [1] * rows if counts is None else [int(c) for c in counts]
        if any(c < 0 for c in sizes) or sum(sizes) != rows:
            raise DeviceOpError(
                f"random_fill: counts {sizes} must be non-negative and sum to out's {rows} rows"
            )
        unknown = sorted(i for i in (generators or {}) if not 0 <= i < len(sizes))
        if unknown:
            raise DeviceOpError(
                f"random_fill: generators for segments {unknown}; out has segments 0..{len(sizes) - 1}"
            )
        bounds = [0]
        for size in sizes:
            bounds.append(bounds[-1] + size)
        return list(itertools.pairwise(bounds))

    # -- attention and KV cache ------------------------------------------------------------
    def kv_block_layout(
        self, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...], head_size: int
    ) -> str:
        """How this device lays out the blocks of a layer's paged cache of this dtype, shape ``[blocks, Hkv,
        block_size, D + Dv]`` and stride (one of ``kv_layout.KV_BLOCK_LAYOUTS``): token-major here, the NPU's
        BSND paging. A device may choose another layout; the attention ops take the views
        ``kv_layout.kv_cache_views`` gives for it, and whole blocks stay the unit that moves between caches."""
        return TOKEN_MAJOR

    def kv_cache_views(self, kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The key / value caches ``[blocks, block_size, Hkv, D|Dv]`` the attention ops take, over a layer's
        cache laid out as :meth:`kv_block_layout` says."""
        layout = self.kv_block_layout(
            kv_cache.dtype, tuple(kv_cache.shape), tuple(kv_cache.stride()), head_size
        )
        return kv_layout.kv_cache_views(kv_cache, head_size, layout)

    @abc.abstractmethod
    def reshape_and_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Write ``key``/``value`` ``[T, Hkv, D|Dv]`` into paged caches ``[blocks, block_size, Hkv, D|Dv]`` in place.

        Slot ``s`` goes to block ``s // block_size``, offset ``s % block_size``; slots ``< 0`` are padding and skipped.
        """

    def plan_attention(
        self,
        block_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_size: int,
        *,
        causal: bool = True,
    ) -> AttentionPlan:
        """The step's lengths read to the host and checked once (``fused_infer_attention``'s contract on
        ``block_table [B', max_blocks]``, ``query_start_loc [B+1]``, ``seq_lens [B]``, ``B <= B'``): every
        request's query rows within ``[0, seq_len]`` and its ``seq_len`` keys within its table row. The
        tensors must not change while the plan is used."""
        if block_table.dim() != 2:
            raise DeviceOpError(f"block_table must be [B, max_blocks], got shape {tuple(block_table.shape)}")
        if block_size < 1:
            raise DeviceOpError(f"block_size must be >= 1, got {block_size}")
        starts = tuple(int(v) for v in query_start_loc.tolist())
        lens = tuple(int(v) for v in seq_lens.tolist())
        if len(starts) != len(lens) + 1:
            raise DeviceOpError(
                f"query_start_loc has {len(starts)} entries, expected len(seq_lens) + 1 = {len(lens) + 1}"
            )
        if len(lens) > block_table.shape[0]:
            raise DeviceOpError(f"{len(lens)} requests but block_table has {block_table.shape[0]} rows")
        decodes: list[int] = []
        prefills: list[int] = []
        for b, seq_len in enumerate(lens):
            q_len = starts[b + 1] - starts[b]
            if not 0 <= q_len <= seq_len:
                raise DeviceOpError(
                    f"request {b}: query length {q_len} must be within [0, seq_len={seq_len}]"
                )
            if not q_len:  # an idle request's blocks are not looked at
                continue
            seq_blocks(block_table, b, seq_len, block_size)
            (decodes if q_len == 1 else prefills).append(b)
        return AttentionPlan(
            block_table,
            query_start_loc,
            seq_lens,
            block_size,
            causal,
            starts,
            lens,
            tuple(decodes),
            tuple(prefills),
        )

    def attention_plan_for(
        self,
        plan: AttentionPlan | None,
        block_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_size: int,
        causal: bool,
    ) -> AttentionPlan:
        """``fused_infer_attention``'s plan: the caller's, checked against these tensors
        (:func:`check_attention_plan`), or made here where it passed none."""
        if plan is None:
            return self.plan_attention(block_table, query_start_loc, seq_lens, block_size, causal=causal)
        check_attention_plan(plan, block_table, query_start_loc, seq_lens, block_size, causal)
        return plan

    @abc.abstractmethod
    def fused_infer_attention(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        *,
        causal: bool = True,
        output: torch.Tensor | None = None,
        sliding_window: int | None = None,
        sinks: torch.Tensor | None = None,
        plan: AttentionPlan | None = None,
    ) -> torch.Tensor:
        """Paged attention for prefill, decode and chunked prefill; returns ``[T, Hq, Dv]``.

        Request ``b`` owns query rows ``query_start_loc[b]:query_start_loc[b+1]`` and ``seq_lens[b]`` keys
        (context + new tokens, already in the cache); with ``ctx = seq_len - q_len`` query ``j`` attends to
        keys ``0..ctx+j`` (all ``seq_len`` keys when ``causal`` is False). Query head ``h`` reads KV head
        ``h // (Hq // Hkv)``. Computed in fp32, returned in the query dtype; written into ``output[:T]``
        when ``output`` is given (rows past ``query_start_loc[-1]`` are left untouched).

        ``sliding_window = W`` (causal only, ``W >= 1``): query ``j`` (position ``p = ctx + j``) attends to
        keys ``max(0, p - W + 1)..p`` only, i.e. its last ``W`` keys, itself included (vLLM's and HF's
        window). Keys before ``ctx - W + 1`` are never read, so their block-table entries may be vLLM's null
        block (whatever it holds cannot reach the output). ``sinks [Hq]``: one learned logit per query head
        added to the softmax denominator, ``out = sum_k exp(s_k - m) v_k / (sum_k exp(s_k - m) +
        exp(sink_h - m))`` with ``m = max(max_k s_k, sink_h)``; the sink has no value.

        ``plan``: :meth:`plan_attention` of these very ``block_table`` / ``query_start_loc`` / ``seq_lens``
        (the step's attention metadata makes it once for all layers); None plans here.
        """

    @abc.abstractmethod
    def kv_load(
        self,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather each request's first ``seq_lens[b]`` cached tokens into packed ``[sum(seq_lens), Hkv, D|Dv]``."""

    @abc.abstractmethod
    def packed_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cu_seqlens: torch.Tensor,
        scale: float,
        *,
        causal: bool = False,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of packed sequences with no KV cache; returns ``[T, Hq, Dv]``.

        What encoders need: encoder-only models (BERT-style embedders and cross-encoders, no KV cache) and
        vision towers (vLLM's MM-encoder attention, one sequence per image / window). Sequence ``i`` owns
        rows ``cu_seqlens[i]:cu_seqlens[i+1]`` of ``query [T, Hq, D]``, ``key [T, Hkv, D]`` and
        ``value [T, Hkv, Dv]`` and attends to its own rows only: all of them, or rows ``0..j`` for its query
        ``j`` when ``causal``. Query head ``h`` reads KV head ``h // (Hq // Hkv)``. ``cu_seqlens`` is an int
        vector ``[N+1]`` starting at 0, non-decreasing, ending at most at ``T`` (later rows are padding and
        left untouched in ``output``). Computed in fp32, returned in the query dtype (into ``output[:T]``
        when given)."""

    # -- norms, activations, rotary --------------------------------------------------------
    @abc.abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``x / sqrt(mean(x**2, -1) + eps) * weight`` accumulated in fp32, in ``x``'s dtype."""

    @abc.abstractmethod
    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(x + residual), x + residual)``, the sum taken in fp32, both in ``x``'s dtype."""

    @abc.abstractmethod
    def swiglu(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(x[..., :d]) * x[..., d:]`` with ``d = x.shape[-1] // 2``."""

    @abc.abstractmethod
    def clipped_swiglu(
        self,
        x: torch.Tensor,
        *,
        alpha: float = 1.702,
        limit: float = 7.0,
        bias: float = 1.0,
        interleaved: bool = True,
    ) -> torch.Tensor:
        """The clamped SwiGLU of gpt-oss's experts (vLLM's ``swigluoai``), ``[..., 2d] -> [..., d]``.

        ``gate, up = x[..., 0::2], x[..., 1::2]`` (``interleaved``, gpt-oss's w13 layout) or the two halves;
        ``gate = gate.clamp(max=limit)``, ``up = up.clamp(-limit, limit)``, out
        ``gate * sigmoid(alpha * gate) * (up + bias)``, computed in fp32, returned in ``x``'s dtype. An odd
        last dim or ``limit <= 0`` raises :class:`DeviceOpError`.
        """

    @abc.abstractmethod
    def rotary_embedding(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None,
        head_size: int,
        cos_sin_cache: torch.Tensor,
        is_neox: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rotate the first ``rot_dim`` dims of every head of ``query [T, Hq*D]`` and ``key [T, Hkv*D]``.

        ``cos_sin_cache [max_pos, rot_dim]`` holds cos in its first half and sin in its second (vLLM's
        convention). Neox style rotates halves ``(x[:r/2], x[r/2:r])``; GPT-J style rotates interleaved
        pairs ``(x[0::2], x[1::2])``. Returns new tensors of the input shapes and dtypes.
        """

    @abc.abstractmethod
    def mrope(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        head_size: int,
        cos_sin_cache: torch.Tensor,
        mrope_section: list[int],
        is_neox: bool,
        interleaved: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Multimodal rotary embedding (Qwen2-VL family): :meth:`rotary_embedding` with per-frequency positions.

        ``positions`` is ``[T]`` (text only: exactly :meth:`rotary_embedding`) or ``[3, T]`` (temporal, height,
        width). ``mrope_section = [t, h, w]`` splits the ``rot_dim // 2`` frequencies of ``cos_sin_cache``
        (``t + h + w == rot_dim // 2``); frequency ``i`` takes its angle from the T, H or W position: chunked,
        the first ``t`` frequencies from T, the next ``h`` from H, the last ``w`` from W; ``interleaved``
        (Qwen3-VL), H where ``i % 3 == 1 and i < 3 * h``, W where ``i % 3 == 2 and i < 3 * w``, T elsewhere.
        Returns new ``query [T, Hq*D]`` and ``key [T, Hkv*D]`` of the input shapes and dtypes.
        """

    # -- MoE -------------------------------------------------------------------------------
    @abc.abstractmethod
    def moe_gating_top_k(
        self,
        router_logits: torch.Tensor,
        k: int,
        *,
        renormalize: bool = True,
        scoring: str = "softmax",
        bias: torch.Tensor | None = None,
        num_groups: int = 1,
        topk_groups: int = 1,
        routed_scaling_factor: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Score (softmax or sigmoid over experts) → top-k → renormalise; ``(weights fp32 [T,k], ids int32 [T,k])``.

        Grouped top-k as DeepSeek-V3 and vLLM define it. ``bias`` (``[E]``, e.g. ``e_score_correction_bias``)
        is added to the scores for selection only; the weights are the unbiased scores. With
        ``num_groups > 1`` the experts are split into equal consecutive groups, each group scored by the
        sum of its two best biased scores when ``bias`` is given, else by its best score, and only experts
        of the ``topk_groups`` best groups are eligible. Renormalising divides by the weights' sum; weights
        are multiplied by ``routed_scaling_factor`` last. Ids are sorted by descending selection score.
        Bad shapes or group counts (see :func:`check_moe_gating`) raise :class:`DeviceOpError`.
        """

    @abc.abstractmethod
    def moe_init_routing(
        self, x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Group token copies by expert: ``(sorted_x [T*k, H], expanded_row_idx [T*k] int32, tokens_per_expert [E] int64)``.

        Copies are ordered by expert id, ties by ``t*k + j`` (stable). ``expanded_row_idx[t*k + j]`` is the
        row of ``sorted_x`` that holds token ``t``'s ``j``-th choice (a scatter index);
        ``tokens_per_expert`` are counts (feed ``grouped_matmul`` with ``group_list_type="count"``).
        """

    @abc.abstractmethod
    def moe_finalize_routing(
        self,
        expert_output: torch.Tensor,
        expanded_row_idx: torch.Tensor,
        topk_weights: torch.Tensor,
    ) -> torch.Tensor:
        """Inverse of :meth:`moe_init_routing`: ``out[t] = sum_j topk_weights[t, j] * expert_output[expanded_row_idx[t*k + j]]``.

        Accumulated in fp32, returned in ``expert_output``'s dtype, shape ``[T, H]``.
        """

    @abc.abstractmethod
    def moe_distribute_dispatch(
        self,
        x: torch.Tensor,
        expert_ids: torch.Tensor,
        group: Any,
        *,
        num_experts: int,
        global_bs: int,
        active_mask: torch.Tensor | None = None,
    ) -> MoeDispatch:
        """MC2 dispatch over the expert-parallel process ``group`` (every rank calls it with the same sizes).

        ``x [BS, H]`` are this rank's tokens, ``expert_ids [BS, k]`` their physical experts among
        ``num_experts`` (rank ``r`` of the ``W`` ranks holds experts ``r*L .. r*L+L-1``, ``L = num_experts /
        W``); ``active_mask [BS]`` (bool) marks real tokens, padding is not sent. Buffers are sized for the
        capacity, not the routing: every rank may have at most ``global_bs / W`` tokens and receives into
        ``A = global_bs * min(L, k)`` rows.
        """

    @abc.abstractmethod
    def moe_distribute_combine(
        self,
        expert_output: torch.Tensor,
        dispatch: MoeDispatch,
        expert_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        group: Any,
        *,
        num_experts: int,
        global_bs: int,
        active_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Inverse of :meth:`moe_distribute_dispatch`: the experts' rows ``[A, H]`` go back to the ranks that
        sent them; ``out[t] = sum_j topk_weights[t, j] * row(t, j)`` (fp32 accumulation), ``[BS, H]`` in
        ``expert_output``'s dtype, zero for inactive tokens. Same arguments as the dispatch it inverts."""

    @abc.abstractmethod
    def grouped_matmul(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        group_list: torch.Tensor,
        *,
        group_list_type: GroupListType = "count",
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-group matmul: rows of group ``g`` of ``x [M, K]`` times ``weight[g] [K, N]`` → ``[M, N]``.

        ``group_list [G]`` holds row counts (``"count"``) or running ends (``"cumsum"``); rows past the last
        group are zero in the output. ``bias [G, N]`` (optional, e.g. gpt-oss's expert biases) adds
        ``bias[g]`` to every row of group ``g`` (in fp32 before the cast to ``x``'s dtype); a bias of
        another shape raises :class:`DeviceOpError`.
        """

    @abc.abstractmethod
    def grouped_matmul_swiglu_quant(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        group_list: torch.Tensor,
        weight_scale: torch.Tensor,
        x_scale: torch.Tensor,
        *,
        group_list_type: GroupListType = "cumsum",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """W8A8 (or W4A8) grouped matmul → dequant → swiglu → per-token int8 quant.

        ``x`` int8 ``[M, K]`` with per-row ``x_scale [M]``; ``weight`` int8 ``[G, K, 2N]`` or int4 packed
        in int32 ``[G, K, 2N/8]`` (see ``reference.pack_int4``) with per-channel ``weight_scale [G, 2N]``.
        Products are accumulated in int32. Returns ``(int8 [M, N], scale fp32 [M])``; rows past the last
        group are 0 with scale 0.
        """

    @abc.abstractmethod
    def grouped_quant_matmul(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        group_list: torch.Tensor,
        weight_scale: torch.Tensor,
        x_scale: torch.Tensor,
        *,
        group_list_type: GroupListType = "count",
        output_dtype: torch.dtype = torch.bfloat16,
    ) -> torch.Tensor:
        """Per-group W8A8 (or W4A8) matmul with per-channel and per-token dequantisation → ``[M, N]``.

        Rows of group ``g`` of int8 ``x [M, K]`` times ``weight[g]`` (int8 ``[G, K, N]`` or int4 packed in
        int32 ``[G, K, N/8]``), accumulated in int32, times ``weight_scale[g] [N]`` and ``x_scale[row]``;
        in ``output_dtype``. ``group_list`` as in :meth:`grouped_matmul`; rows past the last group are 0.
        """

    # -- quantization ----------------------------------------------------------------------
    @abc.abstractmethod
    def dynamic_quant(
        self, x: torch.Tensor, *, smooth_scales: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Symmetric per-token int8: ``scale = max|x*s| / 127``, ``q = round(x*s / scale)``; returns ``(q, scale fp32 [..])``.

        ``scale`` has ``x``'s shape without the last dim; an all-zero row gets scale 0 and q 0.
        """

    @abc.abstractmethod
    def quantize(self, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        """Static per-tensor int8: ``clamp(round(x / scale) + offset, -128, 127)`` (round half to even).

        ``scale`` is a one-element float tensor; ``offset`` a one-element tensor holding an integer in
        ``[-128, 127]`` (None = 0). Computed in fp32; returns int8 of ``x``'s shape.
        """

    @abc.abstractmethod
    def quant_matmul(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        *,
        pertoken_scale: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        output_dtype: torch.dtype = torch.bfloat16,
    ) -> torch.Tensor:
        """int8 ``x [..., K]`` @ ``weight`` accumulated in int32, then dequantised → ``[..., N]`` in ``output_dtype``.

        ``weight`` is int8 ``[K, N]`` or int4 packed in int32 ``[K, N/8]``. ``y = (acc + bias) * weight_scale
        * pertoken_scale`` for an int32 ``bias [N]`` (added to the accumulator before scaling), ``y = acc *
        weight_scale * pertoken_scale + bias`` for a float ``bias [N]``; ``weight_scale`` is ``[N]`` (or one
        element), ``pertoken_scale`` ``[M]`` (M = rows of ``x``) or None.
        """

    @abc.abstractmethod
    def weight_quant_matmul(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        antiquant_scale: torch.Tensor,
        *,
        antiquant_offset: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        group_size: int = 0,
    ) -> torch.Tensor:
        """Weight-only quant: ``x @ ((weight + offset) * scale) + bias``, result in ``x``'s dtype.

        ``weight`` is int8 ``[K, N]`` or int4 packed in int32 ``[K, N/8]``. ``antiquant_scale`` and
        ``antiquant_offset`` are ``[N]`` (per channel, one element per tensor also allowed) or
        ``[ceil(K / group_size), N]`` (per group, ``group_size > 0``): row block ``j`` of the weight uses
        row ``j``. Note the sign: a zero point ``z`` is passed as ``antiquant_offset = -z``.
        """

    @abc.abstractmethod
    def cast_weight_format(self, weight: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
        """``weight`` stored in format ``fmt`` (``"ND"`` or ``"NZ"``); the logical values and shape are unchanged.

        NZ is a device storage layout the NPU matmul kernels read faster; devices without it return ND.
        """

    # -- fused ops (graph fusion targets) --------------------------------------------------
    @abc.abstractmethod
    def add_rms_norm_quant(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        scale: torch.Tensor,
        offset: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``normed, total = add_rms_norm(x, residual, weight, eps)``; returns ``(quantize(normed, scale,
        offset), total)``: the int8 input of a static W8A8 linear and the new residual."""

    @abc.abstractmethod
    def add_rms_norm_dynamic_quant(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        smooth_scales: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``normed, total = add_rms_norm(...)``; returns ``(*dynamic_quant(normed, smooth_scales=...), total)``."""

    @abc.abstractmethod
    def rms_norm_quant(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        scale: torch.Tensor,
        offset: torch.Tensor | None,
    ) -> torch.Tensor:
        """``quantize(rms_norm(x, weight, eps), scale, offset)``."""

    @abc.abstractmethod
    def rms_norm_dynamic_quant(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, smooth_scales: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``dynamic_quant(rms_norm(x, weight, eps), smooth_scales=smooth_scales)``."""

    @abc.abstractmethod
    def swiglu_quant(self, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
        """``quantize(swiglu(x), scale, offset)``: the int8 down-projection input of a static W8A8 MLP."""

    @abc.abstractmethod
    def swiglu_dynamic_quant(
        self, x: torch.Tensor, smooth_scales: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``dynamic_quant(swiglu(x), smooth_scales=smooth_scales)``."""

    @abc.abstractmethod
    def qk_rmsnorm_rope(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        eps: float,
        head_size: int,
        cos_sin_cache: torch.Tensor,
        is_neox: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head RMSNorm of ``query [T, Hq*D]`` and ``key [T, Hkv*D]`` (``D = head_size``, weights ``[D]``),
        then :meth:`rotary_embedding` of both; the QK-norm attention input of Qwen3-style models."""

    @abc.abstractmethod
    def muls_add(self, x: torch.Tensor, scale: float, y: torch.Tensor) -> torch.Tensor:
        """``x * scale + y`` for tensors of one shape and dtype, each step rounded to that dtype (as eager
        torch computes it)."""


count_overrides(BaseDeviceAdaptor, RUNTIME_OPS)  # the default runtime ops are counted too


def check_swap_blocks(
    srcs: Sequence[torch.Tensor], dsts: Sequence[torch.Tensor], src_ids: torch.Tensor, dst_ids: torch.Tensor
) -> None:
    """Raise :class:`DeviceOpError` unless :meth:`BaseDeviceAdaptor.swap_blocks`'s arguments are in contract."""

    def require(cond: bool, message: str) -> None:
        if not cond:
            raise DeviceOpError(message)

    require(len(srcs) == len(dsts), f"{len(srcs)} source tensors but {len(dsts)} destination tensors")
    for index, (src, dst) in enumerate(zip(srcs, dsts, strict=True)):
        for name, t in ((f"srcs[{index}]", src), (f"dsts[{index}]", dst)):
            require(
                t.dim() == 2 and t.dtype == torch.int8,
                f"{name} must be 2-D int8, got {t.dtype} {tuple(t.shape)}",
            )
            require(
                t.shape[1] == 0 or t.stride(1) == 1,
                f"{name}'s pages must be contiguous, got strides {t.stride()}",
            )
        require(
            src.shape[1] == dst.shape[1],
            f"srcs[{index}] pages are {src.shape[1]} bytes, dsts[{index}] pages {dst.shape[1]}",
        )
    for name, ids, tensors in (("src_ids", src_ids, srcs), ("dst_ids", dst_ids, dsts)):
        require(
            ids.dim() == 1 and ids.dtype == torch.int64 and ids.device.type == "cpu",
            f"{name} must be a 1-D int64 host tensor, got {ids.dtype} {tuple(ids.shape)} on {ids.device}",
        )
        rows = min((t.shape[0] for t in tensors), default=0)
        require(
            ids.numel() == 0 or (int(ids.min()) >= 0 and int(ids.max()) < rows),
            f"{name} must lie in [0, {rows})",
        )
    require(src_ids.numel() == dst_ids.numel(), f"{src_ids.numel()} src_ids but {dst_ids.numel()} dst_ids")


def _consecutive_runs(src_ids: torch.Tensor, dst_ids: torch.Tensor) -> list[tuple[int, int, int]]:
    """``(src_start, dst_start, length)`` of the maximal runs where both id vectors step by one."""
    if src_ids.numel() == 1:
        return [(int(src_ids[0]), int(dst_ids[0]), 1)]
    breaks = ((src_ids[1:] - src_ids[:-1] != 1) | (dst_ids[1:] - dst_ids[:-1] != 1)).nonzero().flatten() + 1
    starts = [0, *breaks.tolist()]
    ends = [*starts[1:], src_ids.numel()]
    s_list, d_list = src_ids.tolist(), dst_ids.tolist()
    return [(s_list[a], d_list[a], b - a) for a, b in zip(starts, ends, strict=True)]


def _draw(t: torch.Tensor, distribution: str, generator: torch.Generator | None) -> None:
    """One :meth:`BaseDeviceAdaptor.random_fill` draw into ``t`` (any device torch draws on)."""
    if distribution == "uniform":
        t.uniform_(generator=generator)
    elif distribution == "exponential":
        t.exponential_(generator=generator)
    else:
        t.random_(0, RANDOM_SEED_BOUND, generator=generator)


def check_choice(field: str, value: Any, allowed: Sequence[str]) -> None:
    """Raise :class:`DeviceOpError` naming ``field`` and the allowed values."""
    if value not in allowed:
        raise DeviceOpError(f"{field}={value!r} is invalid; allowed values: {', '.join(allowed)}")


def check_group_bias(bias: torch.Tensor | None, weight: torch.Tensor) -> None:
    """Raise :class:`DeviceOpError` unless ``bias`` is ``None`` or ``[G, N]`` for ``weight [G, K, N]``."""
    if bias is None:
        return
    expected = (weight.shape[0], weight.shape[-1])
    if tuple(bias.shape) != expected:
        raise DeviceOpError(
            f"grouped_matmul bias must be [G, N] = {expected} for weight {tuple(weight.shape)}, "
            f"got {tuple(bias.shape)}"
        )


def check_clipped_swiglu(x: torch.Tensor, limit: float) -> None:
    """Raise :class:`DeviceOpError` unless ``clipped_swiglu`` can split ``x`` and ``limit`` is positive."""
    if x.shape[-1] % 2:
        raise DeviceOpError(f"clipped_swiglu needs an even last dim, got {x.shape[-1]}")
    if not limit > 0:
        raise DeviceOpError(f"clipped_swiglu limit must be > 0, got {limit}")


def check_moe_gating(
    router_logits: torch.Tensor,
    k: int,
    bias: torch.Tensor | None,
    num_groups: int,
    topk_groups: int,
) -> None:
    """Raise :class:`DeviceOpError` unless ``moe_gating_top_k``'s arguments describe a valid routing."""

    def require(cond: bool, message: str) -> None:
        if not cond:
            raise DeviceOpError(message)

    require(router_logits.dim() == 2, f"router_logits must be [T, E], got shape {tuple(router_logits.shape)}")
    num_experts = router_logits.shape[1]
    require(
        bias is None or tuple(bias.shape) == (num_experts,),
        f"bias must be [num_experts={num_experts}], got shape {tuple(bias.shape) if bias is not None else ()}",
    )
    require(num_groups >= 1, f"num_groups={num_groups} must be >= 1")
    require(
        num_experts % num_groups == 0,
        f"num_experts={num_experts} must be divisible by num_groups={num_groups}",
    )
    require(
        1 <= topk_groups <= num_groups,
        f"topk_groups={topk_groups} must be within [1, num_groups={num_groups}]",
    )
    per_group = num_experts // num_groups
    require(
        bias is None or num_groups == 1 or per_group >= 2,
        f"grouped top-k with a bias scores each group by its top-2 experts; num_experts={num_experts} / "
        f"num_groups={num_groups} leaves {per_group} per group",
    )
    eligible = topk_groups * per_group
    require(
        1 <= k <= eligible,
        f"k={k} must be within [1, {eligible}] (the experts of topk_groups={topk_groups} groups "
        f"of {per_group})",
    )


def check_window_sinks(
    sliding_window: int | None, sinks: torch.Tensor | None, num_heads: int, causal: bool
) -> None:
    """Raise :class:`DeviceOpError` unless ``fused_infer_attention``'s window and sinks are valid: a window
    is an int ``>= 1`` on causal attention; sinks are a floating ``[Hq]`` tensor."""
    if sliding_window is not None:
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
            raise DeviceOpError(f"sliding_window={sliding_window!r} is invalid; allowed: None or an int >= 1")
        if not causal:
            raise DeviceOpError(
                "sliding_window is only defined for causal attention; got causal=False (allowed: True)"
            )
    if sinks is not None and (
        not sinks.is_floating_point() or sinks.dim() != 1 or sinks.shape[0] != num_heads
    ):
        raise DeviceOpError(
            f"sinks must be a floating tensor of shape [num_heads={num_heads}], got "
            f"{sinks.dtype} of shape {tuple(sinks.shape)}"
        )


def check_mrope(
    positions: torch.Tensor, cos_sin_cache: torch.Tensor, head_size: int, mrope_section: list[int]
) -> None:
    """Raise :class:`DeviceOpError` unless :meth:`BaseDeviceAdaptor.mrope`'s positions, cache and sections agree."""
    if not (positions.dim() == 1 or (positions.dim() == 2 and positions.shape[0] == 3)):
        raise DeviceOpError(f"mrope: positions must be [T] or [3, T], got shape {tuple(positions.shape)}")
    rot_dim = cos_sin_cache.shape[-1]
    if rot_dim % 2 != 0 or rot_dim > head_size:
        raise DeviceOpError(
            f"mrope: cos_sin_cache rot_dim={rot_dim} must be even and <= head_size={head_size}"
        )
    if len(mrope_section) != 3 or min(mrope_section) < 0 or sum(mrope_section) != rot_dim // 2:
        raise DeviceOpError(
            f"mrope: mrope_section must be 3 non-negative ints summing to rot_dim // 2 = {rot_dim // 2}, "
            f"got {list(mrope_section)}"
        )


def check_packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    output: torch.Tensor | None,
) -> list[int]:
    """Raise :class:`DeviceOpError` unless :meth:`BaseDeviceAdaptor.packed_attention`'s arguments are in
    contract; return ``cu_seqlens`` as host ints."""
    if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
        raise DeviceOpError(
            "packed_attention: query/key/value must be [T, H, D], got shapes "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    num_tokens, num_heads, head_size = query.shape
    if key.shape[0] != num_tokens or value.shape[0] != num_tokens:
        raise DeviceOpError(
            f"packed_attention: key/value have {key.shape[0]}/{value.shape[0]} rows, query has {num_tokens}"
        )
    if key.shape[1] != value.shape[1] or num_heads % key.shape[1] != 0:
        raise DeviceOpError(
            f"packed_attention: query heads ({num_heads}) must be a multiple of KV heads "
            f"(key {key.shape[1]}, value {value.shape[1]})"
        )
    if key.shape[2] != head_size:
        raise DeviceOpError(f"packed_attention: key head size {key.shape[2]} != query head size {head_size}")
    if cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point() or cu_seqlens.numel() < 1:
        raise DeviceOpError(
            f"packed_attention: cu_seqlens must be a 1-D int vector [N+1], got {cu_seqlens.dtype} "
            f"{tuple(cu_seqlens.shape)}"
        )
    bounds = [int(v) for v in cu_seqlens.tolist()]
    if bounds[0] != 0 or any(b < a for a, b in itertools.pairwise(bounds)) or bounds[-1] > num_tokens:
        raise DeviceOpError(
            f"packed_attention: cu_seqlens must start at 0, not decrease and end at most at {num_tokens}, "
            f"got {bounds}"
        )
    if output is not None and (
        output.shape[0] < bounds[-1] or tuple(output.shape[1:]) != (num_heads, value.shape[2])
    ):
        raise DeviceOpError(
            f"packed_attention: output must be [>= {bounds[-1]}, {num_heads}, {value.shape[2]}], "
            f"got {tuple(output.shape)}"
        )
    return bounds
