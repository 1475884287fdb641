"""vLLM 0.32's own Triton sampling kernels as same-run peers of ``vllm_ascend.kernels``, without vLLM.

The benchmark machine has no vLLM, and vLLM's code must not enter this repository. So:

    python benchmarks/vllm_peer.py stage [DIR]      # here, where vLLM is installed

copies the kernel files listed in ``FILES`` from the installed vLLM, unchanged and under their package
paths, into ``DIR`` (default ``.peer/vllm_032``, git-ignored through ``.git/info/exclude``; carry it to
the device) with ``SOURCE.json`` (vLLM version, file hashes). :func:`load` then puts stand-in ``vllm``
modules in ``sys.modules`` for exactly the names those files import (``vllm.triton_utils`` is the real
triton; the launch dispatcher that the top-k/top-p and rejection launches go through binds arguments
by name as vLLM's does; ``compute_topk_scores`` returns a ``LogprobsTensors`` with vLLM's fields;
``init_logger`` is a ``logging`` adapter with vLLM's ``*_once`` methods; the rest are types and warm-up/state helpers that only
annotations and unused paths name: instantiating or calling one raises), imports the carried files
and takes the stand-ins out of ``sys.modules`` again. The ``vllm_*``
adapters call vLLM's kernels with inputs equivalent to what ours get in ``benchmarks/kernels.py``;
the ``check_*`` functions say whether vLLM's result agrees with ours where the semantics match.

    TRITON_INTERPRET=1 python benchmarks/vllm_peer.py selfcheck [DIR]

runs every adapter and our kernel under the Triton interpreter on CPU tensors at tiny shapes and
prints the checks (exit 1 on a disagreement beyond the documented semantic differences).

Rejection sampling (greedy, random, recovered tokens, expansion) is timed on vLLM's launch functions
with our inputs (its public entry draws the recovered tokens' noise from request generators first).
The chunked gated delta rule is timed on vLLM's FLA ``chunk_gated_delta_rule`` (its GDN prefill path) with
its chunk tables precomputed as vLLM's metadata builder does. No adapter: bad words (the benchmark has no row
for it), and the cache and sequence suites (slot mapping, KV-block zeroing, conv1d, GDN gating, q-RMS): their
vLLM counterparts are not staged.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import os
import shutil
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / ".peer" / "vllm_032"
VLLM_VERSION = "0.32.0"
_SAMPLE = "vllm/v1/worker/gpu/sample"
_FLA = "vllm/third_party/flash_linear_attention/ops"
_FLA_HELPERS = (
    "utils",
    "op",
    "index",
    "cumsum",
    "l2norm",
    "chunk_scaled_dot_kkt",
    "solve_tril",
    "wy_fast",
    "chunk_delta_h",
    "chunk_o",
)
FILES = {
    "gumbel": f"{_SAMPLE}/gumbel.py",
    "min_p": f"{_SAMPLE}/min_p.py",
    "logprob": f"{_SAMPLE}/logprob.py",
    "penalties": f"{_SAMPLE}/penalties.py",
    "topk_topp": "vllm/v1/sample/ops/topk_topp_triton.py",
    "rejection": "vllm/v1/sample/rejection_sampler.py",
    # multi-LoRA (punica): helpers first, so the two ops import them from sys.modules
    "lora_meta": "vllm/lora/ops/triton_ops/lora_kernel_metadata.py",
    "lora_kernel_utils": "vllm/lora/ops/triton_ops/kernel_utils.py",
    "lora_utils": "vllm/lora/ops/triton_ops/utils.py",
    "lora_shrink": "vllm/lora/ops/triton_ops/lora_shrink_op.py",
    "lora_expand": "vllm/lora/ops/triton_ops/lora_expand_op.py",
    # the chunked gated delta rule (FLA, vLLM's GDN prefill): helpers first, each importing the ones before it
    **{f"fla_{name}": f"{_FLA}/{name}.py" for name in _FLA_HELPERS},
    "gdn_chunk": f"{_FLA}/chunk.py",
}
MAX_LOGPROB_TOKEN_IDS = 128  # vllm.sampling_params' value; only LogprobTokenIdsState (unused) reads it


class PeerError(RuntimeError):
    """The vLLM peer cannot be staged, loaded or called as asked."""


# ---- stage (here) -------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stage(dest: Path) -> dict:
    """Copy ``FILES`` from the installed vLLM into ``dest`` and write ``dest/SOURCE.json``."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise PeerError("vllm is not installed here: stage where vLLM 0.32 is installed")
    site = Path(next(iter(spec.submodule_search_locations))).parent
    dists = importlib.metadata.packages_distributions().get("vllm", [])
    version = importlib.metadata.version(dists[0]) if dists else "unknown"
    if version != VLLM_VERSION:
        raise PeerError(f"installed vLLM is {version} ({dists}), expected {VLLM_VERSION}")
    if dest.exists():
        shutil.rmtree(dest)
    hashes = {}
    for rel in FILES.values():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site / rel, dest / rel)
        hashes[rel] = _sha256(dest / rel)
    source = {"vllm": version, "distribution": dists[0], "files": hashes}
    (dest / "SOURCE.json").write_text(json.dumps(source, indent=1))
    return source


def _exclude_peer_dir() -> None:
    """List ``/.peer/`` in ``.git/info/exclude`` so the staged copy is never committed."""
    exclude = ROOT / ".git" / "info" / "exclude"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if "/.peer/" not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        exclude.write_text("\n".join([*lines, "/.peer/"]) + "\n")


# ---- stand-ins (device) -------------------------------------------------------------------------


class _StandIn:
    """A vLLM type the carried files name (annotations, base classes, unused state classes)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise PeerError(f"{type(self).__name__} is a stand-in: the vLLM peer never constructs it")


def _stand_in_type(name: str) -> type:
    return type(name, (_StandIn,), {})


def _stand_in_function(name: str) -> Callable[..., Any]:
    def unavailable(*args: object, **kwargs: object) -> Any:
        raise PeerError(f"{name} is a stand-in: only vLLM's warm-up and state paths call it")

    unavailable.__name__ = name
    return unavailable


class LogprobsTensors(NamedTuple):
    """What ``compute_topk_scores`` returns (field names as in ``vllm.v1.outputs``)."""

    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor
    cu_num_generated_tokens: list[int] | None = None
    cu_num_generated_tokens_tensor: torch.Tensor | None = None


def _launch_kwargs(kernel: Any, inputs: dict[str, Any], launch: dict[str, Any]) -> dict[str, Any]:
    """Kernel keyword arguments of a vLLM dispatch: the dispatch's own launch arguments, then each
    dispatch input under the first kernel parameter named ``x``, ``x_ptr``, ``X`` or ``X_PTR`` unless the
    launch arguments already set that parameter, then each free ``<T>_stride[_d]`` / ``<T>_STRIDE[_d]`` parameter as
    ``T.stride(d)`` of the tensor bound to ``T`` (or ``T_ptr`` / ``T_PTR``)."""
    params = list(kernel.arg_names)
    kwargs = dict(launch)
    for name, value in inputs.items():
        for target in (name, f"{name}_ptr", name.upper(), f"{name.upper()}_PTR"):
            if target in params:
                kwargs.setdefault(target, value)
                break
    for param in params:
        if param in kwargs:
            continue
        for sep, ptr in (("_stride", "_ptr"), ("_STRIDE", "_PTR")):
            base, found, dim = param.rpartition(sep)
            dim = dim.removeprefix("_")
            if not found or (dim and not dim.isdigit()):
                continue
            source = base if base in kwargs else base + ptr
            if source in kwargs:
                kwargs[param] = kwargs[source].stride(int(dim or 0))
                break
    return kwargs


def _dispatcher_with_warmup(*, kernel: Any, warmup_inputs: Callable[..., Any]) -> Callable[..., Any]:
    """Stand-in of vLLM's ``triton_kernel_dispatcher_with_warmup`` without warm-up: calling the decorated
    dispatch function launches ``kernel`` on the grid it returns, arguments bound by name."""

    def decorate(dispatch: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(dispatch)

        def launch(*args: Any, **kwargs: Any) -> Any:
            spec = dispatch(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            kernel[spec[0]](**_launch_kwargs(kernel, dict(bound.arguments), spec[1]))
            return spec[2] if len(spec) == 3 else None

        launch.__name__ = dispatch.__name__
        return launch

    return decorate


def _num_compute_units(device_id: int | None = 0) -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device_id or 0).multi_processor_count
    return os.cpu_count() or 1


_LOGGED_ONCE: set[str] = set()


class _PeerLogger(logging.LoggerAdapter):
    """``logging`` logger with vLLM's ``*_once`` methods (each message logged once per process)."""

    def _once(self, level: int, msg: str, *args: Any) -> None:
        if msg not in _LOGGED_ONCE:
            _LOGGED_ONCE.add(msg)
            self.log(level, msg, *args)

    def warning_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once(logging.WARNING, msg, *args)

    def info_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once(logging.INFO, msg, *args)

    def debug_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once(logging.DEBUG, msg, *args)


def _init_logger(name: str) -> _PeerLogger:
    return _PeerLogger(logging.getLogger(name), {})


def _async_tensor_h2d(
    data: Any, device: Any = None, dtype: torch.dtype | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """A host list/array/tensor on ``device`` (what vLLM's helper of that name returns; pointer tables of
    the LoRA weights, built once per weight set)."""
    tensor = torch.as_tensor(
        data, dtype=dtype if dtype is not None else (out.dtype if out is not None else None)
    )
    if out is not None:
        return out.copy_(tensor, non_blocking=True)
    return tensor.to(device, non_blocking=True)


def _no_custom_op(**kwargs: Any) -> None:
    """Registers nothing: the carried LoRA files then call their Python functions directly (their own
    fallback when ``torch.ops.vllm`` lacks the op)."""


def _stand_in_modules() -> dict[str, types.ModuleType]:
    """The ``vllm`` modules the carried files import, holding only the names they import."""
    import triton
    import triton.language as tl

    def module(name: str, package: bool = False, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name, "vLLM peer stand-in (benchmarks/vllm_peer.py)")
        if package:
            mod.__path__ = []
        mod.__dict__.update(attrs)
        return mod

    def has_device_capability(capability: int) -> bool:
        if not torch.cuda.is_available():
            return False
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor >= capability

    platform = types.SimpleNamespace(
        is_cuda_alike=torch.cuda.is_available,
        is_cuda=torch.cuda.is_available,
        is_rocm=lambda: False,
        has_device_capability=has_device_capability,
    )
    try:
        import triton.language.extra.libdevice as tldevice
    except ImportError:  # only FLA's opt-in fast math (FLA_USE_FAST_OPS=1) reads it
        tldevice = None
    # vLLM 0.32's defaults of the variables the LoRA files read (unset in its environment)
    env = module(
        "vllm.envs",
        VLLM_BATCH_INVARIANT=False,
        VLLM_LORA_ENABLE_DUAL_STREAM=False,
        VLLM_TUNED_CONFIG_FOLDER=None,
        VLLM_LORA_DISABLE_PDL=False,
    )
    mods = [
        module("vllm", True, envs=env),
        env,
        module("vllm.config", True),
        module("vllm.config.model", PROCESSED_LOGPROBS_MODES=("processed_logits", "processed_logprobs")),
        module("vllm.logger", init_logger=_init_logger),
        module("vllm.triton_utils", triton=triton, tl=tl, tldevice=tldevice),
        module("vllm.platforms", current_platform=platform),
        module(
            "vllm.sampling_params",
            SamplingParams=_stand_in_type("SamplingParams"),
            MAX_LOGPROB_TOKEN_IDS=MAX_LOGPROB_TOKEN_IDS,
        ),
        module("vllm.utils", True),
        module(
            "vllm.utils.math_utils",
            cdiv=triton.cdiv,
            next_power_of_2=triton.next_power_of_2,
        ),
        module(
            "vllm.utils.torch_utils",
            async_tensor_h2d=_async_tensor_h2d,
            direct_register_custom_op=_no_custom_op,
        ),
        module("vllm.lora", True),
        module("vllm.lora.ops", True),
        module("vllm.lora.ops.triton_ops", True),
        module("vllm.utils.gpu_sync_debug", gpu_sync_allowed=contextlib.nullcontext),
        module("vllm.utils.platform_utils", num_compute_units=_num_compute_units),
        module("vllm.model_executor", True),
        module("vllm.model_executor.warmup", True),
        module(
            "vllm.model_executor.warmup.jit_warmup",
            WarmupChoices=_stand_in_type("WarmupChoices"),
            WarmupIntRange=_stand_in_type("WarmupIntRange"),
            _when=_stand_in_function("_when"),
        ),
        module(
            "vllm.model_executor.warmup.jit_warmup_triton_helper",
            DispatchSpec=tuple,
            TritonWarmupTensor=_stand_in_type("TritonWarmupTensor"),
            triton_kernel_dispatcher_with_warmup=_dispatcher_with_warmup,
        ),
        module("vllm.third_party", True),
        module("vllm.third_party.flash_linear_attention", True),
        module("vllm.third_party.flash_linear_attention.ops", True),
        module("vllm.v1", True),
        module(
            "vllm.v1.outputs",
            LogprobsTensors=LogprobsTensors,
            LogprobsLists=_stand_in_type("LogprobsLists"),
            SamplerOutput=_stand_in_type("SamplerOutput"),
        ),
        module("vllm.v1.sample", True),
        module("vllm.v1.sample.logits_processor", True),
        module(
            "vllm.v1.sample.logits_processor.builtin",
            MinTokensLogitsProcessor=_stand_in_type("MinTokensLogitsProcessor"),
        ),
        module("vllm.v1.sample.metadata", SamplingMetadata=_stand_in_type("SamplingMetadata")),
        module("vllm.v1.sample.ops", True),
        module(
            "vllm.v1.sample.ops.bad_words",
            apply_bad_words_with_drafts=_stand_in_function("apply_bad_words_with_drafts"),
        ),
        module("vllm.v1.sample.ops.penalties", apply_all_penalties=_stand_in_function("apply_all_penalties")),
        module(
            "vllm.v1.sample.ops.topk_topp_sampler", apply_top_k_top_p=_stand_in_function("apply_top_k_top_p")
        ),
        module("vllm.v1.sample.sampler", Sampler=_stand_in_type("Sampler")),
        module("vllm.v1.spec_decode", True),
        module("vllm.v1.spec_decode.metadata", SpecDecodeMetadata=_stand_in_type("SpecDecodeMetadata")),
        module(
            "vllm.v1.spec_decode.utils",
            unconditional_to_conditional_rates=_stand_in_function("unconditional_to_conditional_rates"),
        ),
        module("vllm.v1.worker", True),
        module("vllm.v1.worker.gpu", True),
        module(
            "vllm.v1.worker.gpu.buffer_utils",
            StagedWriteTensor=_stand_in_type("StagedWriteTensor"),
            UvaBackedTensor=_stand_in_type("UvaBackedTensor"),
        ),
        module("vllm.v1.worker.gpu.sample", True),
        module("vllm.v1.worker.gpu.sample.logits_processor", True),
        module(
            "vllm.v1.worker.gpu.sample.logits_processor.interface",
            LogitsContext=_stand_in_type("LogitsContext"),
            LogitsProcessor=_stand_in_type("LogitsProcessor"),
            LogitsProcRequestState=_stand_in_type("LogitsProcRequestState"),
        ),
    ]
    return {m.__name__: m for m in mods}


@contextlib.contextmanager
def _installed(mods: dict[str, types.ModuleType]) -> Iterator[None]:
    """``mods`` in ``sys.modules`` for the duration (and any ``vllm`` imported before hidden)."""
    saved = {name: mod for name, mod in sys.modules.items() if name == "vllm" or name.startswith("vllm.")}
    for name in saved:
        del sys.modules[name]
    sys.modules.update(mods)
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]
        sys.modules.update(saved)


_LOADED: dict[str, types.ModuleType] = {}
SOURCE: dict = {}


def load(peer_dir: Path) -> dict[str, str]:
    """Import the carried vLLM kernel files through the stand-ins; ``{op: error}`` for the files that
    failed (the others stay usable)."""
    peer_dir = Path(peer_dir)
    source_file = peer_dir / "SOURCE.json"
    if not source_file.exists():
        raise PeerError(f"{source_file} missing: run `python benchmarks/vllm_peer.py stage` where vLLM is")
    source = json.loads(source_file.read_text())
    changed = [rel for rel, digest in source["files"].items() if _sha256(peer_dir / rel) != digest]
    if changed:
        raise PeerError(f"carried vLLM files differ from the staged copy: {changed}")
    SOURCE.clear()
    SOURCE.update(source)
    _LOADED.clear()
    errors = {}
    mods = _stand_in_modules()
    with _installed(mods):
        for op, rel in FILES.items():
            name = rel.removesuffix(".py").replace("/", ".")
            spec = importlib.util.spec_from_file_location(name, peer_dir / rel)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            try:
                spec.loader.exec_module(mod)
            except Exception as exc:  # one file failing (e.g. an older triton) leaves the others usable
                errors[op] = f"{type(exc).__name__}: {exc}"
                continue
            _LOADED[op] = mod
    return errors


def available(op: str) -> bool:
    """Whether vLLM's kernel file for ``op`` (a key of ``FILES``) is loaded."""
    return op in _LOADED


def _mod(op: str) -> types.ModuleType:
    if op not in _LOADED:
        raise PeerError(f"vLLM's {FILES[op]} is not loaded (call load() first)")
    return _LOADED[op]


# ---- adapters: vLLM's call for the inputs our kernel gets ---------------------------------------

_IDS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _identity_mapping(rows: int, device: torch.device) -> torch.Tensor:
    """vLLM's ``expanded_idx_mapping`` for one token per request, request ``i`` in state slot ``i``
    (built once: in vLLM it is an input of the step, not work of the kernel)."""
    key = (rows, device)
    if key not in _IDS:
        _IDS[key] = torch.arange(rows, dtype=torch.int32, device=device)
    return _IDS[key]


def vllm_temperature(logits: torch.Tensor, temp: torch.Tensor) -> torch.Tensor:
    """``logits /= temp`` in place by vLLM's ``apply_temperature`` (rows with T 0 or 1 skipped)."""
    _mod("gumbel").apply_temperature(logits, _identity_mapping(logits.shape[0], logits.device), temp)
    return logits


def vllm_gumbel(
    logits: torch.Tensor, temp: torch.Tensor, seeds: torch.Tensor, pos: torch.Tensor
) -> torch.Tensor:
    """One token per row from ``softmax(logits / T)`` by vLLM's ``gumbel_sample`` (T 0: argmax);
    its own noise (murmur3), so the draws differ from ours by design."""
    idx = _identity_mapping(logits.shape[0], logits.device)
    return _mod("gumbel").gumbel_sample(
        logits, idx, temp, seeds, pos, apply_temperature=True, is_drafting=False
    )


def vllm_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask ``x < max + log(min_p)`` to ``-inf`` in place by vLLM's ``apply_min_p``."""
    _mod("min_p").apply_min_p(logits, _identity_mapping(logits.shape[0], logits.device), min_p)
    return logits


def vllm_token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[row, ids[row]]`` by vLLM's ``compute_token_logprobs``."""
    return _mod("logprob").compute_token_logprobs(logits, ids.unsqueeze(1)).squeeze(1)


def vllm_topk_logprobs(
    logits: torch.Tensor, n: int, ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids [B, 1 + n], logprobs [B, 1 + n], ranks [B])`` by vLLM's ``compute_topk_scores`` (its
    sampler's path without per-request logprob token ids); rank = #{x >= chosen}."""
    out = _mod("logprob").compute_topk_scores(logits, n, ids)
    return out.logprob_token_ids, out.logprobs, out.selected_token_ranks


def vllm_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """Top-k then top-p mask by vLLM's ``apply_top_k_top_p_triton`` (float32 logits only: vLLM's
    sampler upcasts every dtype to float32 before it), in place."""
    if logits.dtype != torch.float32:
        raise PeerError(f"vLLM's top-k/top-p takes float32 logits only, got {logits.dtype}")
    return _mod("topk_topp").apply_top_k_top_p_triton(logits, k, p)


class PenaltyState(NamedTuple):
    """vLLM's per-request penalty state: prompt token bitmask and output token counts."""

    prompt_bin_mask: torch.Tensor
    output_bin_counts: torch.Tensor
    local_pos: torch.Tensor
    input_ids: torch.Tensor


def vllm_penalty_state(prompt: torch.Tensor, output: torch.Tensor, vocab: int) -> PenaltyState:
    """The state vLLM builds once per request at admission (its ``bincount`` kernel) and keeps up to
    date in its post-step kernel; built here outside the timed region."""
    rows, plen = prompt.shape
    dev = prompt.device
    prompt_bin_mask = torch.zeros(rows, -(-vocab // 32), dtype=torch.int32, device=dev)
    output_bin_counts = torch.zeros(rows, vocab, dtype=torch.int32, device=dev)
    all_ids = torch.cat([prompt, output], dim=1).to(torch.int32).contiguous()
    prompt_len = torch.full((rows,), plen, dtype=torch.int32, device=dev)
    prefill_len = torch.full((rows,), all_ids.shape[1], dtype=torch.int32, device=dev)
    _mod("penalties").bincount(
        _identity_mapping(rows, dev),
        all_ids,
        prompt_len,
        prefill_len,
        prompt_bin_mask,
        output_bin_counts,
        all_ids.shape[1],
    )
    zeros = torch.zeros(rows, dtype=torch.int64, device=dev)
    return PenaltyState(prompt_bin_mask, output_bin_counts, zeros, zeros)


class OurPenaltyState(NamedTuple):
    """The kernels' kept penalty state (``vllm_ascend.kernels.penalties``) for rows ``0..B-1``."""

    slots: torch.Tensor
    counts: torch.Tensor
    seen: torch.Tensor
    num_seen: torch.Tensor
    max_seen: int


def our_penalty_state(prompt: torch.Tensor, output: torch.Tensor, vocab: int) -> OurPenaltyState:
    """What the sampler keeps per request (prompt marks, output counts, the seen-token index), built by
    the kernels' own add (at admission and after each step in a sampler; outside the timed region)."""
    import vllm_ascend.kernels as K

    rows = prompt.shape[0]
    dev = prompt.device
    history = prompt.shape[1] + output.shape[1]
    counts = torch.zeros(rows, vocab, dtype=torch.int32, device=dev)
    seen = torch.zeros(rows, min(vocab, history), dtype=torch.int32, device=dev)
    num_seen = torch.zeros(rows, dtype=torch.int32, device=dev)
    slots = torch.arange(rows, device=dev)
    tokens = torch.cat([prompt, output], dim=1)
    is_prompt = (torch.arange(history, device=dev) < prompt.shape[1]).expand(rows, -1)
    K.penalty_counts_add(
        counts, seen, num_seen, slots.repeat_interleave(history), tokens.flatten(), is_prompt.flatten()
    )
    return OurPenaltyState(slots, counts, seen, num_seen, seen.shape[1])


def our_penalties(
    logits: torch.Tensor, state: OurPenaltyState, rep: torch.Tensor, freq: torch.Tensor, pres: torch.Tensor
) -> torch.Tensor:
    """``K.apply_penalties`` over the kept state (one decode token per request)."""
    import vllm_ascend.kernels as K

    return K.apply_penalties(
        logits, state.slots, state.counts, state.seen, state.num_seen, rep, freq, pres, None, state.max_seen
    )


def vllm_penalties(
    logits: torch.Tensor,
    state: PenaltyState,
    rep: torch.Tensor,
    freq: torch.Tensor,
    pres: torch.Tensor,
) -> torch.Tensor:
    """Repetition/frequency/presence penalties in place by vLLM's ``apply_penalties`` (one decode token
    per request: no draft tokens to count)."""
    _mod("penalties").apply_penalties(
        logits,
        _identity_mapping(logits.shape[0], logits.device),
        state.input_ids,
        state.local_pos,
        rep,
        freq,
        pres,
        state.prompt_bin_mask,
        state.output_bin_counts,
    )
    return logits


def vllm_rejection_greedy_sample(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | None,
) -> torch.Tensor:
    """Greedy verification in place by vLLM's rejection sampler launch (not synthetic mode)."""
    _mod("rejection")._rejection_greedy_sample(
        output,
        cu_num_draft_tokens,
        draft_token_ids,
        target_argmax,
        bonus_token_ids,
        is_greedy,
        output.shape[1] - 1,
        None,
        None,
    )
    return output


def vllm_rejection_random_sample(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    is_greedy: torch.Tensor,
) -> torch.Tensor:
    """Probabilistic verification in place by vLLM's rejection sampler launch (not synthetic mode)."""
    _mod("rejection")._rejection_random_sample(
        output,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        bonus_token_ids,
        recovered_token_ids,
        uniform_probs,
        is_greedy,
        output.shape[1] - 1,
        None,
    )
    return output


def vllm_sample_recovered_tokens(
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    inv_q: torch.Tensor,
) -> torch.Tensor:
    """Recovered tokens by vLLM's launch, given the same ``inv_q`` as ours (vLLM's public
    ``sample_recovered_tokens`` draws it from the request generators first)."""
    out = torch.empty_like(draft_token_ids)
    _mod("rejection")._sample_recovered_tokens(
        out, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, inv_q, max_spec_len=max_spec_len
    )
    return out


def vllm_expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """vLLM's ``expand_batch_to_tokens`` (same signature as ours)."""
    return _mod("rejection").expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from, replace_to)


class GdnChunkMetadata(NamedTuple):
    """FLA's chunk tables for a batch's ``cu_seqlens``, which vLLM's GDN metadata builder precomputes on the
    host once per step (outside the layers' kernel calls)."""

    chunk_indices: torch.Tensor
    chunk_offsets: torch.Tensor


def vllm_gdn_chunk_metadata(cu_seqlens: torch.Tensor, chunk_size: int = 64) -> GdnChunkMetadata:
    index = _mod("fla_index")
    host = cu_seqlens.cpu()
    return GdnChunkMetadata(
        index.prepare_chunk_indices(host, chunk_size).to(cu_seqlens.device),
        index.prepare_chunk_offsets(host, chunk_size).to(cu_seqlens.device),
    )


def vllm_chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state_vk: torch.Tensor,
    meta: GdnChunkMetadata,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's FLA ``chunk_gated_delta_rule`` (its GDN prefill path) on our inputs: ``q``/``k`` ``[T, Hk, K]``,
    ``v`` ``[T, Hv, V]``, ``g``/``beta`` ``[T, Hv]`` as FLA's one-row batch, q and k l2-normalised in its
    kernel, ``initial_state_vk`` in vLLM's cache layout ``[N, Hv, V, K]``. Returns ``(out [T, Hv, V],
    final state [N, Hv, V, K])`` (16-bit inputs only: FLA refuses float32)."""
    out, final = _mod("gdn_chunk").chunk_gated_delta_rule(
        q=q[None],
        k=k[None],
        v=v[None],
        g=g[None],
        beta=beta[None],
        initial_state=initial_state_vk,
        output_final_state=True,
        cu_seqlens=cu_seqlens,
        chunk_indices=meta.chunk_indices,
        chunk_offsets=meta.chunk_offsets,
        use_qk_l2norm_in_kernel=True,
    )
    return out[0], final


# ---- agreement with ours: (text, ok) ------------------------------------------------------------

_MANTISSA = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}
DTYPES = (torch.float32, torch.bfloat16)  # the selfcheck's logits dtypes


def vllm_lora_meta(token_lora_indices: torch.Tensor, max_loras: int) -> Any:
    """vLLM's per-step LoRA kernel metadata (tokens sorted by adapter, counts, starts) for a mapping; built
    once per step in vLLM's punica wrapper, so outside the timed kernel calls."""
    meta = _mod("lora_meta").LoRAKernelMeta.make(
        max_loras, token_lora_indices.numel(), token_lora_indices.device
    )
    meta.prepare_tensors(token_lora_indices)
    return meta


def vllm_lora_shrink(
    x: torch.Tensor, lora_a: list[torch.Tensor], out: torch.Tensor, meta: Any, scale: float
) -> None:
    """``out[s, t] = scale * x[t] @ lora_a[s][l_t]^T`` for every slice ``s`` in one launch (vLLM's
    ``lora_shrink``; ``out`` ``[slices, T, rank]`` fp32, zeroed by it; padded active-adapter grid, vLLM's
    default ``specialize_active_lora=False``)."""
    _mod("lora_shrink").lora_shrink(x, lora_a, out, *meta.meta_args(x.size(0), False), scale)


def vllm_lora_expand(
    z: torch.Tensor, lora_b: list[torch.Tensor], out: torch.Tensor, meta: Any, add_inputs: bool
) -> None:
    """``out[t, slice s] (+)= z[s, t] @ lora_b[s][l_t]^T``, the slices side by side, in one launch (vLLM's
    ``lora_expand``)."""
    _mod("lora_expand").lora_expand(
        z, lora_b, out, *meta.meta_args(z.size(1), False), offset_start=0, add_inputs=add_inputs
    )


def _ulps_off(
    a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, ulps: int, magnitude: torch.Tensor | None = None
) -> int:
    """Elements farther apart than ``ulps`` units in the last place of ``dtype`` at the larger of the two
    values (or of ``magnitude``, the largest intermediate, when given); equal infinities agree."""
    a, b = a.float(), b.float()
    same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    scale = torch.maximum(a.abs(), b.abs())
    if magnitude is not None:
        scale = torch.maximum(scale, magnitude.float())
    tol = ulps * 2.0 ** -_MANTISSA[dtype] * scale
    return int((~(same_inf | ((a - b).abs() <= tol))).sum())


def check_elementwise(
    ours: torch.Tensor, theirs: torch.Tensor, dtype: torch.dtype, magnitude: torch.Tensor | None = None
) -> tuple[str, bool]:
    """Temperature, penalties: the same float32 formula rounded once to ``dtype``. vLLM's division is
    Triton's default fp32 ``/`` and its repetition penalty multiplies by ``1 / rep``: up to 2 ulps of
    the largest intermediate (``magnitude``: for penalties ``|x| * max(rep, 1 / rep)``, since the
    frequency and presence terms can cancel most of it)."""
    off = _ulps_off(ours, theirs, dtype, 2, magnitude)
    return f"ulp2-off={off}", off == 0


def penalty_magnitude(logits: torch.Tensor, rep: torch.Tensor) -> torch.Tensor:
    """``|x| * max(rep, 1 / rep)``: the largest value the penalties pass through (see ``check_elementwise``)."""
    r = rep.float().unsqueeze(1)
    return logits.float().abs() * torch.maximum(r, 1.0 / r)


def check_min_p(
    logits: torch.Tensor,
    ours: torch.Tensor,
    theirs: torch.Tensor,
    min_p: torch.Tensor,
    rounding: float = 4 * 2.0**-23,
) -> tuple[str, bool]:
    """Same kept set, except tokens within ``rounding`` (relative to the largest of the token, the row
    max and the threshold; default 4 float32 ulps) of the threshold ``max + log(min_p)`` (vLLM takes
    Triton's ``tl.log``; a coarser ``rounding`` where vLLM's input was rounded, as both max and token)."""
    x = logits.float()
    top = x.max(dim=1, keepdim=True).values
    thr = top + torch.log(min_p.float()).unsqueeze(1)
    diff = torch.isinf(ours) != torch.isinf(theirs)
    near = (x - thr).abs() <= rounding * torch.maximum(x.abs(), torch.maximum(thr.abs(), top.abs()))
    far = int((diff & ~near).sum())
    return f"mask-off={int(diff.sum())} beyond-ulps={far}", far == 0


def check_gumbel(
    logits: torch.Tensor, temp: torch.Tensor, ours: torch.Tensor, theirs: torch.Tensor
) -> tuple[str, bool]:
    """Draws differ by design (different noise): greedy rows (T 0) must both be the argmax, and every
    drawn token must be a valid id with a finite logit."""
    greedy = temp <= 0
    argmax = logits.float().argmax(dim=1)
    greedy_off = int(((theirs != argmax) & greedy).sum()) + int(((ours != argmax) & greedy).sum())
    rows, vocab = logits.shape
    invalid = 0
    for drawn in (ours, theirs):
        ok = (drawn >= 0) & (drawn < vocab)
        picked = logits.float().gather(1, drawn.clamp(0, vocab - 1).long().unsqueeze(1)).squeeze(1)
        invalid += int((~(ok & torch.isfinite(picked))).sum())
    same = int((ours == theirs).sum())
    text = f"greedy-off={greedy_off}/{int(greedy.sum())} invalid={invalid} same-draw={same}/{rows}"
    return text, greedy_off == 0 and invalid == 0


def check_kept_sets(logits: torch.Tensor, ours: torch.Tensor, theirs: torch.Tensor) -> tuple[str, bool]:
    """Top-k/top-p kept sets: equal, or differing only in tokens tied with our threshold (we keep every
    tie of the k-th value; vLLM keeps exactly k), else "other" (with the largest kept-count gap)."""
    kept_a, kept_b = torch.isfinite(ours), torch.isfinite(theirs)
    x = logits.float()
    thr = torch.where(kept_a, x, torch.full_like(x, float("inf"))).min(dim=1, keepdim=True).values
    diff = kept_a != kept_b
    rows_diff = diff.any(dim=1)
    tie_only = rows_diff & ~(diff & (x != thr)).any(dim=1)
    other = rows_diff & ~tie_only
    gap = (kept_a.sum(1) - kept_b.sum(1)).abs()
    max_gap = int(gap[other].max()) if bool(other.any()) else 0
    text = (
        f"same={int((~rows_diff).sum())} tie-only={int(tie_only.sum())} other={int(other.sum())}"
        f"{f' (kept gap <= {max_gap})' if max_gap else ''}"
    )
    return text, not bool(other.any())


def check_gdn(
    ours: tuple[torch.Tensor, torch.Tensor], theirs: tuple[torch.Tensor, torch.Tensor]
) -> tuple[str, bool]:
    """The chunked gated delta rule: the same math, FLA keeping its per-chunk ``w``, ``u`` and states in the
    inputs' 16-bit type where ours keeps float32, so outputs and final states agree to 16-bit rounding:
    the largest difference within 5 % of the largest value (``theirs``' state in vLLM's ``[N, H, V, K]``)."""
    out_a, state_a = ours
    out_b, state_b = theirs[0], theirs[1].transpose(-1, -2)
    rel_out = float((out_a.float() - out_b.float()).abs().max() / out_a.float().abs().max().clamp_min(1e-30))
    rel_state = float((state_a - state_b.float()).abs().max() / state_a.abs().max().clamp_min(1e-30))
    return f"out-rel={rel_out:.1e} state-rel={rel_state:.1e}", rel_out <= 5e-2 and rel_state <= 5e-2


def check_exact(ours: torch.Tensor, theirs: torch.Tensor) -> tuple[str, bool]:
    """Token ids (rejection sampling, recovered tokens, expansion): the same definition, so equal."""
    off = int((ours != theirs).sum())
    return f"off={off}/{ours.numel()}", off == 0


def check_token_logprobs(ours: torch.Tensor, theirs: torch.Tensor) -> tuple[str, bool]:
    d = float((ours.float() - theirs.float()).abs().max()) if ours.numel() else 0.0
    return f"maxdiff={d:.1e}", d <= 1e-4


def check_topk_logprobs(
    logits: torch.Tensor,
    ids: torch.Tensor,
    ours: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    theirs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[str, bool]:
    """Same chosen column, same top-n logits (ids may differ among equal logits: vLLM's ``torch.topk``
    orders ties arbitrarily), log-probs within 1e-4, and ranks equal once vLLM's definition
    (#{x >= chosen}) is mapped to ours (1 + #{x > chosen})."""
    x = logits.float()
    col0_off = int((ours[0][:, 0] != theirs[0][:, 0]).sum())
    top_a = x.gather(1, ours[0][:, 1:].long()).sort(dim=1).values
    top_b = x.gather(1, theirs[0][:, 1:].long()).sort(dim=1).values
    ids_off = int((top_a != top_b).any(dim=1).sum())
    lp_a = ours[1][:, 1:].float().sort(dim=1).values
    lp_b = theirs[1][:, 1:].float().sort(dim=1).values
    lp_diff = max(
        float((lp_a - lp_b).abs().max()) if lp_a.numel() else 0.0,
        float((ours[1][:, 0].float() - theirs[1][:, 0].float()).abs().max()),
    )
    chosen = x.gather(1, ids.long().unsqueeze(1))
    ties = (x == chosen).sum(dim=1)
    ranks_off = int((theirs[2] != ours[2] + ties - 1).sum())
    text = f"col0-off={col0_off} ids-off={ids_off} ranks-off={ranks_off} lp-diff={lp_diff:.1e}"
    return text, col0_off == 0 and ids_off == 0 and ranks_off == 0 and lp_diff <= 1e-4


# ---- self-check on CPU under the Triton interpreter ---------------------------------------------


@contextlib.contextmanager
def _interpreter_range_of_tensors() -> Iterator[None]:
    """The interpreter's ``tl.range`` yields Python ints, and vLLM's top-k/top-p kernel calls ``.to`` on
    its loop variable (valid compiled, where it is a tensor): inside, the loop yields int32 scalars."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_core

    def patched(lang: Any, scope: Any) -> None:
        original(lang, scope)
        plain = lang.range
        scope.set_attr(
            lang, "range", lambda *a, **kw: (interpreter._implicit_cvt(i) for i in plain(*a, **kw))
        )

    interpreter._patch_lang_core = patched
    try:
        yield
    finally:
        interpreter._patch_lang_core = original


def _vllm_top_k_top_p_interpreted(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None):
    with _interpreter_range_of_tensors():
        return vllm_top_k_top_p(logits, k, p)


def _vllm_top_p_split_interpreted(logits: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """vLLM's split-row top-p pipeline, which its entry point takes for top-p alone on CUDA at B <= 64
    (never on CPU): called directly, with an H200's 132 SMs, so its three kernels' launches through
    the stand-in dispatcher run here too."""
    with _interpreter_range_of_tensors():
        _mod("topk_topp")._apply_topp_split(logits, None, p, float("-inf"), 132)
    return logits


def _selfcheck_cases(
    K: Any, dtype: torch.dtype, rows: int, vocab: int
) -> list[tuple[str, Callable[[], Any]]]:
    """(label, check) per adapter: our kernel and vLLM's on the same random inputs."""
    logits = (torch.randn(rows, vocab) * 3).to(dtype)
    temp = torch.rand(rows) * 1.5 + 0.25
    temp[::3] = 0.0
    seeds = torch.randint(0, 2**62, (rows,))
    pos = torch.randint(0, 4096, (rows,))
    mp = torch.rand(rows) * 0.2 + 0.01
    k = torch.randint(1, 60, (rows,), dtype=torch.int32)
    p = torch.rand(rows) * 0.2 + 0.79
    ids = torch.randint(0, vocab, (rows,))
    prompt = torch.randint(0, vocab, (rows, 40))
    output = torch.randint(0, vocab, (rows, 12))
    rep, freq, pres = torch.rand(rows) + 0.5, torch.rand(rows) * 0.5, torch.rand(rows) * 0.5
    # vLLM's rank kernel compares the logits as loaded, and the interpreter compares bfloat16 tensors as
    # raw bits (an interpreter gap, not vLLM's): there vLLM's top-k logprobs get the exact float32 copy
    lp_input = logits if dtype == torch.float32 else logits.float()
    cases: list[tuple[str, Callable[[], Any]]] = [
        (
            "temperature",
            lambda: check_elementwise(
                K.apply_temperature(logits.clone(), temp), vllm_temperature(logits.clone(), temp), dtype
            ),
        ),
        (
            "gumbel",
            lambda: check_gumbel(
                logits, temp, K.gumbel_sample(logits, temp, seeds, pos), vllm_gumbel(logits, temp, seeds, pos)
            ),
        ),
        (
            "min_p",
            lambda: check_min_p(
                logits, K.apply_min_p(logits.clone(), mp), vllm_min_p(logits.clone(), mp), mp
            ),
        ),
        (
            "token_logprobs",
            lambda: check_token_logprobs(
                K.compute_token_logprobs(logits, ids), vllm_token_logprobs(logits, ids)
            ),
        ),
        (
            "topk_logprobs" + ("" if dtype == torch.float32 else "(vLLM on fp32 copy)"),
            lambda: check_topk_logprobs(
                logits, ids, K.compute_topk_logprobs(logits, 20, ids), vllm_topk_logprobs(lp_input, 20, ids)
            ),
        ),
        (
            "penalties",
            lambda: check_elementwise(
                our_penalties(logits.clone(), our_penalty_state(prompt, output, vocab), rep, freq, pres),
                vllm_penalties(logits.clone(), vllm_penalty_state(prompt, output, vocab), rep, freq, pres),
                dtype,
                penalty_magnitude(logits, rep),
            ),
        ),
    ]
    for label, kk, pp in (("topk_topp", k, p), ("topk_only", k, None), ("topp_only", None, p)):
        cases.append(
            (
                label,
                lambda kk=kk, pp=pp: check_kept_sets(
                    logits,
                    K.apply_top_k_top_p(logits.clone(), kk, pp),
                    _vllm_top_k_top_p_interpreted(logits.float(), kk, pp),
                ),
            )
        )
    cases.append(
        (
            "topp_only(split path)",
            lambda: check_kept_sets(
                logits,
                K.apply_top_k_top_p(logits.clone(), None, p),
                _vllm_top_p_split_interpreted(logits.float(), p),
            ),
        )
    )
    return cases


def _selfcheck_rejection_cases(
    K: Any, requests: int = 6, drafts: int = 3, vocab: int = 300
) -> list[tuple[str, Callable[[], Any]]]:
    """(label, check) for the speculative-decoding launches, inputs as in ``kernels.specdecode_suite``."""
    n = requests * drafts
    cu = torch.full((requests,), drafts).cumsum(0).to(torch.int32)
    target = torch.softmax(torch.randn(n, vocab) * 3, -1)
    q = torch.softmax(torch.randn(n, vocab) * 3, -1)
    draft = torch.randint(0, vocab, (n,), dtype=torch.int32)
    draft[::3] = target[::3].argmax(-1).to(torch.int32)
    inv_q = 1.0 / torch.empty(requests, vocab).exponential_()
    bonus = torch.randint(0, vocab, (requests,), dtype=torch.int32)
    uniform = torch.rand(n, dtype=torch.float64)
    is_greedy = torch.rand(requests) < 0.5
    out = torch.full((requests, drafts + 1), K.PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
    recovered = K.sample_recovered_tokens(drafts, cu, draft, None, target, inv_q)
    greedy_args = (cu, draft, target.argmax(-1), bonus, is_greedy)
    random_args = (cu, draft, None, target, bonus, recovered, uniform, is_greedy)
    temps = torch.rand(requests)
    cases: list[tuple[str, Callable[[], Any]]] = [
        (
            f"sample_recovered_tokens{'(q)' if probs is not None else ''}",
            lambda probs=probs: check_exact(
                K.sample_recovered_tokens(drafts, cu, draft, probs, target, inv_q),
                vllm_sample_recovered_tokens(drafts, cu, draft, probs, target, inv_q),
            ),
        )
        for probs in (None, q)
    ]
    cases += [
        (
            "rejection_greedy_sample",
            lambda: check_exact(
                K.rejection_greedy_sample(out.clone(), *greedy_args),
                vllm_rejection_greedy_sample(out.clone(), *greedy_args),
            ),
        ),
        (
            "rejection_random_sample",
            lambda: check_exact(
                K.rejection_random_sample(out.clone(), *random_args),
                vllm_rejection_random_sample(out.clone(), *random_args),
            ),
        ),
        (
            "expand_batch_to_tokens",
            lambda: check_exact(
                K.expand_batch_to_tokens(temps, cu, n, 0, 1), vllm_expand_batch_to_tokens(temps, cu, n, 0, 1)
            ),
        ),
    ]
    return cases


def selfcheck(peer_dir: Path, rows: int = 5, vocab: int = 2500) -> bool:
    """Every adapter vs our Triton kernel (forced: ``VLLM_ASCEND_KERNEL_BACKEND=triton``) on CPU."""
    for src in ("packages/ascend-kernels/src", "packages/ascend-core/src"):
        if str(ROOT / src) not in sys.path:
            sys.path.insert(0, str(ROOT / src))
    os.environ["VLLM_ASCEND_KERNEL_BACKEND"] = "triton"
    import vllm_ascend.kernels as K

    warnings.filterwarnings("ignore", category=RuntimeWarning)  # numpy on -inf lanes in the interpreter
    errors = load(peer_dir)
    for op, err in errors.items():
        print(f"LOAD FAILED {op}: {err}")
    all_ok = not errors
    torch.manual_seed(0)
    groups = [(f"{dtype!s:15s} {rows}x{vocab}", _selfcheck_cases(K, dtype, rows, vocab)) for dtype in DTYPES]
    groups.append(("specdecode", _selfcheck_rejection_cases(K)))
    for where, cases in groups:
        for label, run in cases:
            try:
                text, ok = run()
            except Exception as exc:
                text, ok = f"FAILED {type(exc).__name__}: {exc}", False
            all_ok &= ok
            print(f"{'ok  ' if ok else 'DIFF'} {label:34s} {where}: {text}", flush=True)
    return all_ok


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("stage", "selfcheck"):
        raise SystemExit(f"usage: {sys.argv[0]} stage|selfcheck [DIR]  (default DIR {DEFAULT_DIR})")
    peer_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_DIR
    if sys.argv[1] == "stage":
        source = stage(peer_dir)
        if peer_dir.resolve().is_relative_to(ROOT / ".peer"):
            _exclude_peer_dir()
        print(
            f"staged vLLM {source['vllm']}: {len(source['files'])} files, {_size(peer_dir)} bytes in {peer_dir}"
        )
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("selfcheck runs on CPU under the Triton interpreter: set TRITON_INTERPRET=1")
    if not selfcheck(peer_dir):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
