"""ModelSlim export: round-to-nearest quantization of a Hugging Face checkpoint.

:func:`export_modelslim` reads a HF model directory (``config.json``, ``*.safetensors`` sharded or
not, tokenizer files) and writes the ModelSlim layout the ``ascend`` quantization method loads:
the same config and tokenizer files, quantized ``*.safetensors`` (one output shard per source
shard, with an index when the source had one or several shards) and ``quant_model_description.json``.
Every 2-D ``*.weight`` of a linear layer under ``model.layers.*`` is quantized; embeddings, norms,
routers (``mlp.gate``), ``lm_head`` and biases stay ``FLOAT``. MoE experts are quantized only for
the schemes with a MoE variant (W8A8_DYNAMIC, W4A8_DYNAMIC) and stay ``FLOAT`` otherwise. Static
W8A8 runs the float model on a few calibration prompts to fix each layer's activation scale.

The Atlas 310P's sparse schemes (:data:`SPARSE_SCHEMES`) are static W8A8 with magnitude-pruned weights
(``sparsity``: the fraction of each output row's smallest-|w| weights set to 0 before quantization) and no
weight scale/offset tensors, as ModelSlim's sparse quantization writes them; W8A8SC also compresses each weight
(:mod:`vllm_ascend.quant.compress`) into ``weight``/``index``/``info``. Such checkpoints load only where the
device profile has the ``SPARSE_WEIGHT`` capability (310P).

The output is written to a temporary sibling of ``dst`` and renamed into place, so a failed export
leaves no partial directory behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_ascend.core.sdk import JsonInputError, read_json_file
from vllm_ascend.quant import types as qt
from vllm_ascend.quant.description import DESCRIPTION_FILE, json_type

SCHEMES: tuple[str, ...] = ("W8A8", "W8A8_DYNAMIC", "W8A16", "W4A16", "W4A8_DYNAMIC")
"""Schemes the exporter writes (``--scheme``)."""
MOE_SCHEMES: tuple[str, ...] = ("W8A8_DYNAMIC", "W4A8_DYNAMIC")
"""Schemes with a MoE variant: experts are quantized; for the other schemes they stay FLOAT."""
SPARSE_SCHEMES: tuple[str, ...] = ("W8A8S", "W8A8SC")
"""The 310P-only sparse static schemes the exporter also writes (``--scheme``)."""
STATIC_SCHEMES: tuple[str, ...] = ("W8A8", *SPARSE_SCHEMES)
"""Schemes with calibrated static activation quantization."""
DEFAULT_SPARSITY = 0.5
"""Fraction of each output row's weights the sparse schemes prune when no ``sparsity`` is given."""
GROUPED_SCHEMES: tuple[str, ...] = ("W8A16", "W4A16")
"""Schemes that accept a per-group ``group_size`` (> 0); the others are per channel only."""
DEFAULT_GROUP_SIZE: dict[str, int] = {"W4A16": 32}
"""``group_size`` used when none is given (0 = per channel)."""
INT4_SCHEMES: tuple[str, ...] = ("W4A16", "W4A8_DYNAMIC")
DESCRIPTION_VERSION = "1.0.0"
DEFAULT_CALIBRATION_PROMPTS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Large language models run on accelerators; quantized weights let them fit in less memory.",
    "def add(a, b):\n    return a + b\n",
    "In 1969 the first humans walked on the Moon, and millions watched the broadcast.",
)
"""Prompts the static W8A8 calibration runs when none are given."""

INDEX_SUFFIX = ".safetensors.index.json"
_SKIPPED_SUFFIXES = (".safetensors", INDEX_SUFFIX, ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
"""Source files not copied: float weights in any format (the safetensors ones are rewritten)."""
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
_LAYER_WEIGHT = re.compile(r"^model\.layers\.\d+\.(?P<rest>.+)\.weight$")
_EXPERT = re.compile(r"\.experts\.\d+\.")
_ROUTER_LEAVES = ("gate", "shared_expert_gate")


class ExportError(ValueError):
    """An export that cannot be done; ``problems`` lists every reason (tensor names, allowed values)."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        if len(self.problems) == 1:
            super().__init__(f"cannot export: {self.problems[0]}")
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            super().__init__(f"cannot export: {len(self.problems)} problem(s)\n{lines}")


@dataclass(frozen=True)
class ExportReport:
    """What one export did: tensor counts, tensor bytes read and written, wall time."""

    src: Path
    dst: Path
    scheme: str
    group_size: int
    tensors_quantized: int
    tensors_float: int
    bytes_in: int
    bytes_out: int
    seconds: float
    calibration_prompts: int

    @property
    def throughput_mb_s(self) -> float:
        """Source tensor megabytes (10^6 bytes) processed per second."""
        return self.bytes_in / 1e6 / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        granularity = f"group_size {self.group_size}" if self.group_size else "per channel"
        calibration = (
            f", calibrated on {self.calibration_prompts} prompt(s)" if self.calibration_prompts else ""
        )
        return (
            f"exported {self.src} -> {self.dst} as {self.scheme} ({granularity}{calibration}): "
            f"{self.tensors_quantized} tensors quantized, {self.tensors_float} left FLOAT; "
            f"{self.bytes_in / 2**20:.2f} MiB -> {self.bytes_out / 2**20:.2f} MiB "
            f"in {self.seconds:.2f} s ({self.throughput_mb_s:.1f} MB/s)"
        )


# -- quantization math (float32 in, ModelSlim tensors out) -------------------------------------


def _safe_scale(scale: torch.Tensor) -> torch.Tensor:
    """Scales of all-zero rows/groups become 1 (their values quantize to exactly 0 either way)."""
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quantize_symmetric(weight: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per output channel, symmetric: scale = max|w_row| / (2^(bits-1) - 1), q = round(w/scale) clamped."""
    qmax = 2 ** (bits - 1) - 1
    scale = _safe_scale(weight.abs().amax(dim=1, keepdim=True) / qmax)
    q = torch.round(weight / scale).clamp(-qmax - 1, qmax).to(torch.int8)
    return q, scale


def quantize_asymmetric(
    weight: torch.Tensor, bits: int, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per channel (``group_size`` 0) or per group, asymmetric; ``min <= 0 <= max`` so 0 is exact.

    scale = (max - min) / (2^bits - 1), offset = round(qmin - min/scale) clamped, q = round(w/scale) + offset
    clamped; returns q int8 [out, in] and scale/offset float32 [out, G].
    """
    out_features, in_features = weight.shape
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    size = group_size or in_features
    grouped = weight.reshape(out_features, in_features // size, size)
    lo = grouped.amin(dim=2).clamp(max=0)
    hi = grouped.amax(dim=2).clamp(min=0)
    scale = _safe_scale((hi - lo) / (qmax - qmin))
    offset = torch.round(qmin - lo / scale).clamp(qmin, qmax)
    q = (torch.round(grouped / scale[..., None]) + offset[..., None]).clamp(qmin, qmax)
    return q.reshape(out_features, in_features).to(torch.int8), scale, offset


def activation_qparams(observed_min: float, observed_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Static per-tensor int8 activation scale and offset (float32 [1]) covering ``[min, max]`` and 0."""
    lo = torch.tensor([min(observed_min, 0.0)], dtype=torch.float32)
    hi = torch.tensor([max(observed_max, 0.0)], dtype=torch.float32)
    scale = _safe_scale((hi - lo) / 255)
    offset = torch.round(-128 - lo / scale).clamp(-128, 127)
    return scale, offset


def prune_rows(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Magnitude pruning: the ``round(sparsity * in)`` smallest-|w| weights of every row set to 0."""
    count = round(sparsity * weight.shape[1])
    if count == 0:
        return weight
    drop = weight.abs().argsort(dim=1, stable=True)[:, :count]
    return weight.scatter(1, drop, 0.0)


def quantize_linear(
    name: str,
    weight: torch.Tensor,
    scheme: str,
    group_size: int,
    activation_range: tuple[float, float] | None = None,
    sparsity: float = 0.0,
) -> dict[str, torch.Tensor]:
    """The ModelSlim tensors of one linear weight, keyed by suffix (``weight``, ``weight_scale``, ...).

    ``name`` is the weight's tensor name (for errors); ``activation_range`` the calibrated input range
    (static schemes only); ``sparsity`` the pruned fraction of each row (sparse schemes only).
    """
    w = weight.detach().to(torch.float32)
    if scheme in SPARSE_SCHEMES:
        dense = quantize_linear(name, prune_rows(w, sparsity), "W8A8", group_size, activation_range)
        del dense["weight_scale"], dense["weight_offset"]
        if scheme == "W8A8SC":
            from vllm_ascend.quant.compress import compress_weight

            packed = compress_weight(dense["weight"])
            dense.update(weight=packed.weight, index=packed.index, info=packed.info)
        return dense
    if scheme in ("W8A8", "W8A8_DYNAMIC", "W4A8_DYNAMIC"):
        q, scale = quantize_symmetric(w, 4 if scheme == "W4A8_DYNAMIC" else 8)
        out = {"weight": q, "weight_scale": scale, "weight_offset": torch.zeros_like(scale)}
        if scheme == "W8A8":
            if activation_range is None:
                raise ExportError([f"{name}: static W8A8 needs the calibrated input range of its layer"])
            input_scale, input_offset = activation_qparams(*activation_range)
            bias = -input_offset.to(torch.int64) * q.to(torch.int64).sum(dim=1)
            if bias.abs().max() > torch.iinfo(torch.int32).max:
                raise ExportError([f"{name}: quant_bias does not fit in int32 (in_features {w.shape[1]})"])
            out.update(
                input_scale=input_scale,
                input_offset=input_offset,
                deq_scale=(input_scale * scale[:, 0]).to(torch.float32),
                quant_bias=bias.to(torch.int32),
            )
        return out
    if scheme in ("W8A16", "W4A16"):
        q, scale, offset = quantize_asymmetric(w, 4 if scheme == "W4A16" else 8, group_size)
        return {"weight": q, "weight_scale": scale, "weight_offset": offset}
    raise ExportError([f"unknown scheme {scheme!r}; allowed: {', '.join(SCHEMES + SPARSE_SCHEMES)}"])


# -- planning (headers only: every problem is found before anything is written) ----------------


@dataclass(frozen=True)
class _Tensor:
    file: Path
    quantize: bool


@dataclass(frozen=True)
class _Plan:
    files: list[Path]
    index_name: str | None
    tensors: dict[str, _Tensor]


def _is_floating(safetensors_dtype: str) -> bool:
    return safetensors_dtype.startswith("F") or safetensors_dtype == "BF16"


def is_quantized_tensor(name: str, shape: Sequence[int], scheme: str) -> bool:
    """Whether the exporter quantizes tensor ``name`` under ``scheme`` (everything else stays FLOAT)."""
    match = _LAYER_WEIGHT.match(name)
    if match is None or len(shape) != 2:
        return False
    leaf = match["rest"].rpartition(".")[2]
    if "norm" in leaf or leaf in _ROUTER_LEAVES or "embed" in leaf:
        return False
    return scheme in MOE_SCHEMES or _EXPERT.search(name) is None


def _resolve_group_size(scheme: str, group_size: int | None) -> int:
    if group_size is None:
        return DEFAULT_GROUP_SIZE.get(scheme, 0)
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 0:
        raise ExportError([f"group_size must be an integer >= 0 (0 = per channel), got {group_size!r}"])
    if group_size and scheme not in GROUPED_SCHEMES:
        raise ExportError(
            [
                f"{scheme} is per channel only: group_size must be 0 or unset, got {group_size} "
                f"(per-group schemes: {', '.join(GROUPED_SCHEMES)})"
            ]
        )
    return group_size


def _resolve_sparsity(scheme: str, sparsity: float | None) -> float:
    if scheme not in SPARSE_SCHEMES:
        if sparsity is not None:
            raise ExportError(
                [f"sparsity is used by the sparse schemes ({', '.join(SPARSE_SCHEMES)}) only, not {scheme}"]
            )
        return 0.0
    if sparsity is None:
        return DEFAULT_SPARSITY
    if isinstance(sparsity, bool) or not isinstance(sparsity, int | float) or not 0 <= sparsity < 1:
        raise ExportError(
            [f"sparsity must be a number in [0, 1) (the pruned fraction of each row), got {sparsity!r}"]
        )
    return float(sparsity)


def _read_json(path: Path) -> object:
    try:
        return read_json_file(path)
    except JsonInputError as exc:
        raise ExportError([f"{path} is {exc.problem}"]) from None


def _source_files(src: Path) -> tuple[list[Path], str | None]:
    indexes = sorted(src.glob(f"*{INDEX_SUFFIX}"))
    if len(indexes) > 1:
        raise ExportError([f"{src} holds several safetensors indexes: {', '.join(p.name for p in indexes)}"])
    if indexes:
        index = _read_json(indexes[0])
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if (
            not isinstance(weight_map, dict)
            or not weight_map
            or not all(isinstance(v, str) for v in weight_map.values())
        ):
            raise ExportError(
                [f"{indexes[0]}: expected a non-empty 'weight_map' of tensor name -> file name"]
            )
        files = [src / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ExportError([f"{indexes[0]} names missing shard(s): {', '.join(missing)}"])
        return files, indexes[0].name
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ExportError([f"{src} has no *.safetensors file (the exporter reads safetensors checkpoints)"])
    return files, (None if len(files) == 1 else f"model{INDEX_SUFFIX}")


def _check_source(src: Path) -> None:
    if not src.is_dir():
        raise ExportError([f"source {src} is not a directory"])
    config = src / "config.json"
    if not config.is_file():
        raise ExportError([f"{src} has no config.json (expected a Hugging Face model directory)"])
    if (src / DESCRIPTION_FILE).exists():
        raise ExportError([f"{src} is already a ModelSlim checkpoint ({DESCRIPTION_FILE} present)"])
    parsed = _read_json(config)
    if not isinstance(parsed, dict):
        raise ExportError([f"{config}: expected a JSON object, got {json_type(parsed)}"])
    if "quantization_config" in parsed:
        raise ExportError([f"{config} has a quantization_config: the source is already quantized"])


def _header(file: Path) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, safetensors dtype, shape) of every tensor in ``file``, from its header."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="pt") as reader:
            views = ((name, reader.get_slice(name)) for name in reader.keys())
            return [(name, view.get_dtype(), tuple(view.get_shape())) for name, view in views]
    except (SafetensorError, OSError) as exc:
        raise ExportError([f"{file} is not a readable safetensors file: {exc}"]) from None


def _plan(src: Path, scheme: str, group_size: int) -> _Plan:
    files, index_name = _source_files(src)
    tensors: dict[str, _Tensor] = {}
    problems: list[str] = []
    for file in files:
        for name, dtype, shape in _header(file):
            if name in tensors:
                problems.append(f"tensor {name} is in both {tensors[name].file.name} and {file.name}")
                continue
            if not _is_floating(dtype):
                problems.append(
                    f"tensor {name} ({file.name}) has dtype {dtype}: the exporter needs floating-point "
                    "source tensors (is the checkpoint already quantized?)"
                )
            quantize = is_quantized_tensor(name, shape, scheme)
            tensors[name] = _Tensor(file, quantize)
            if quantize:
                problems.extend(_shape_problems(name, shape, scheme, group_size))
    if not problems and not any(t.quantize for t in tensors.values()):
        problems.append(
            f"no tensor to quantize in {src}: expected 2-D linear weights named model.layers.<i>.<...>.weight"
        )
    if problems:
        raise ExportError(problems)
    return _Plan(files, index_name, tensors)


def _shape_problems(name: str, shape: tuple[int, ...], scheme: str, group_size: int) -> list[str]:
    in_features = shape[1]
    problems = []
    if scheme in INT4_SCHEMES and in_features % 8:
        problems.append(
            f"tensor {name} {list(shape)}: {scheme} packs 8 int4 values per int32, so in_features "
            f"{in_features} must be a multiple of 8"
        )
    if group_size and in_features % group_size:
        problems.append(
            f"tensor {name} {list(shape)}: in_features {in_features} is not a multiple of group_size {group_size}"
        )
    return problems


def _check_destination(src: Path, dst: Path, overwrite: bool) -> None:
    src_r, dst_r = src.resolve(), dst.resolve()
    if dst_r == src_r or src_r in dst_r.parents or dst_r in src_r.parents:
        raise ExportError([f"destination {dst} overlaps the source {src}; choose a separate directory"])
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        raise ExportError([f"destination {dst} exists and is not a directory"])
    if dst.is_dir() and any(dst.iterdir()) and not overwrite:
        raise ExportError(
            [f"destination {dst} is not empty; pass overwrite=True (--overwrite) to replace it"]
        )
    base = next(p for p in (dst.parent.absolute(), *dst.parent.absolute().parents) if p.exists())
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        raise ExportError([f"destination {dst} cannot be created: {base} is not a writable directory"])


# -- calibration --------------------------------------------------------------------------------


def calibrate(
    src: Path, weight_names: Sequence[str], prompts: Sequence[str], progress: bool
) -> dict[str, tuple[float, float]]:
    """Input (min, max) of every linear layer whose weight is in ``weight_names``, over ``prompts``.

    The float model runs in float32 on the CPU; a forward pre-hook on each ``nn.Linear`` records
    the range of its input. Module names map to checkpoint names as ``<module>.weight``.
    """
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not any((src / name).is_file() for name in _TOKENIZER_FILES):
        raise ExportError(
            [f"calibration needs the tokenizer of {src}: none of {', '.join(_TOKENIZER_FILES)} is there"]
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(src, local_files_only=True).to(torch.float32).eval()
    except (OSError, ValueError, KeyError) as exc:
        raise ExportError(
            [f"calibration could not load the float model and tokenizer from {src} with transformers: {exc}"]
        ) from exc
    wanted = set(weight_names)
    ranges: dict[str, tuple[float, float]] = {}
    handles = []

    def hook_for(weight_name: str):
        def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0].detach()
            lo, hi = float(x.min()), float(x.max())
            old = ranges.get(weight_name)
            ranges[weight_name] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))

        return hook

    for module_name, module in model.named_modules():
        weight_name = f"{module_name}.weight"
        if isinstance(module, torch.nn.Linear) and weight_name in wanted:
            handles.append(module.register_forward_pre_hook(hook_for(weight_name)))
    try:
        with torch.inference_mode():
            for prompt in tqdm(prompts, desc="calibrate", unit="prompt", disable=not progress):
                ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
                if ids.numel() == 0:
                    raise ExportError([f"calibration prompt {prompt!r} tokenizes to no tokens"])
                model(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    unseen = sorted(wanted - ranges.keys())
    if unseen:
        raise ExportError(
            [
                f"calibration recorded no input for {name}: no nn.Linear module of the transformers model "
                "with that weight ran"
                for name in unseen
            ]
        )
    return ranges


# -- export -------------------------------------------------------------------------------------


def _copy_side_files(src: Path, out: Path) -> None:
    for path in sorted(src.iterdir()):
        if path.is_file() and not path.name.endswith(_SKIPPED_SUFFIXES):
            shutil.copy2(path, out / path.name)


def export_modelslim(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    scheme: str,
    *,
    group_size: int | None = None,
    calibration_prompts: Sequence[str] | None = None,
    progress: bool = True,
    overwrite: bool = False,
    sparsity: float | None = None,
) -> ExportReport:
    """Export the HF checkpoint ``src`` as a ModelSlim ``scheme`` checkpoint in ``dst``.

    ``group_size``: None = the scheme's default (W4A16: 32, others per channel), 0 = per channel,
    > 0 = per group (W8A16 and W4A16 only). ``calibration_prompts``: static W8A8 only (default: a few
    built-in prompts). ``overwrite`` replaces a non-empty ``dst``. ``sparsity``: the sparse schemes only, the
    pruned fraction of each row in [0, 1) (default :data:`DEFAULT_SPARSITY`). Raises :class:`ExportError`.
    """
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    start = time.perf_counter()
    src, dst = Path(src), Path(dst)
    if scheme not in SCHEMES + SPARSE_SCHEMES:
        raise ExportError([f"unknown scheme {scheme!r}; allowed: {', '.join(SCHEMES + SPARSE_SCHEMES)}"])
    size = _resolve_group_size(scheme, group_size)
    prune = _resolve_sparsity(scheme, sparsity)
    if calibration_prompts is not None and scheme not in STATIC_SCHEMES:
        raise ExportError(
            [
                f"calibration prompts are used by the static schemes ({', '.join(STATIC_SCHEMES)}) only, not {scheme}"
            ]
        )
    prompts = tuple(DEFAULT_CALIBRATION_PROMPTS if calibration_prompts is None else calibration_prompts)
    if scheme in STATIC_SCHEMES and not prompts:
        raise ExportError([f"static {scheme} needs at least one calibration prompt"])
    _check_source(src)
    _check_destination(src, dst, overwrite)
    plan = _plan(src, scheme, size)
    ranges: dict[str, tuple[float, float]] = {}
    if scheme in STATIC_SCHEMES:
        ranges = calibrate(src, [n for n, t in plan.tensors.items() if t.quantize], prompts, progress)

    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    description: dict[str, str] = {}
    weight_map: dict[str, str] = {}
    bytes_in = bytes_out = quantized = 0
    try:
        tmp.mkdir(parents=True)
        with tqdm(
            total=len(plan.tensors), desc=f"quantize {scheme}", unit="tensor", disable=not progress
        ) as bar:
            for file in plan.files:
                written: dict[str, torch.Tensor] = {}
                with safe_open(file, framework="pt") as reader:
                    for name in [n for n, t in plan.tensors.items() if t.file == file]:
                        tensor = reader.get_tensor(name)
                        bytes_in += tensor.numel() * tensor.element_size()
                        if plan.tensors[name].quantize:
                            prefix = name[: -len(".weight")]
                            parts = quantize_linear(name, tensor, scheme, size, ranges.get(name), prune)
                            for suffix, value in parts.items():
                                written[f"{prefix}.{suffix}"] = value.contiguous()
                                description[f"{prefix}.{suffix}"] = scheme
                            quantized += 1
                        else:
                            written[name] = tensor
                            description[name] = qt.FLOAT
                        bar.update()
                save_file(written, str(tmp / file.name), metadata={"format": "pt"})
                for name, value in written.items():
                    weight_map[name] = file.name
                    bytes_out += value.numel() * value.element_size()
        header: dict[str, object] = {"model_quant_type": scheme, "version": DESCRIPTION_VERSION}
        if size:
            header["group_size"] = size
        (tmp / DESCRIPTION_FILE).write_text(
            json.dumps({**header, **dict(sorted(description.items()))}, indent=2)
        )
        if plan.index_name is not None:
            index = {"metadata": {"total_size": bytes_out}, "weight_map": dict(sorted(weight_map.items()))}
            (tmp / plan.index_name).write_text(json.dumps(index, indent=2))
        _copy_side_files(src, tmp)
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError | SafetensorError):
            where = getattr(exc, "filename", None) or tmp
            raise ExportError(
                [f"export to {dst} failed at {where}: {getattr(exc, 'strerror', None) or exc}"]
            ) from exc
        raise
    return ExportReport(
        src=src,
        dst=dst,
        scheme=scheme,
        group_size=size,
        tensors_quantized=quantized,
        tensors_float=len(plan.tensors) - quantized,
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        seconds=time.perf_counter() - start,
        calibration_prompts=len(prompts) if scheme in STATIC_SCHEMES else 0,
    )
