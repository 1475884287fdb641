"""Every ``torch_npu`` call in the NPU adaptors names a documented op with documented parameters.

The signatures come from ``torch_npu/_op_plugin_docs.py`` inside the torch-npu 2.13.0 wheel, which
is downloaded once (``pip download --no-deps``) into a cache folder and read without installing it;
ops the docs do not cover (the MC2 dispatch/combine) are checked against the wheel's op schemas
(``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``).
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from vllm_ascend.core.device.adaptor import OPS
from vllm_ascend.kernels.device.a5 import A5DeviceAdaptor
from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor

TORCH_NPU_VERSION = "2.13.0"
REPO_ROOT = Path(__file__).resolve().parents[1]
ADAPTOR_DIR = REPO_ROOT / "packages" / "ascend-kernels" / "src" / "vllm_ascend" / "kernels" / "device"
NPU_ADAPTOR_FILES = [
    ADAPTOR_DIR / "npu.py",
    ADAPTOR_DIR / "a5.py",
    ADAPTOR_DIR / "mla.py",
    ADAPTOR_DIR / "sparse.py",
    REPO_ROOT / "packages" / "ascend-310p" / "src" / "vllm_ascend" / "ascend310p" / "overlay.py",
]


# -- the op signatures from the wheel --------------------------------------------------------------
@dataclass
class OpSignature:
    name: str
    positional: list[str] = field(default_factory=list)  # before '*', in order
    keyword_only: list[str] = field(default_factory=list)
    required: set[str] = field(default_factory=set)
    supported_products: str | None = (
        None  # the doc's 支持的型号 (supported products) section, when it has one
    )

    @property
    def names(self) -> set[str]:
        return set(self.positional) | set(self.keyword_only)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _balanced(text: str, start: int) -> str:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i]
    raise ValueError("unbalanced parentheses")


def parse_signature(name: str, doc: str) -> OpSignature | None:
    """The first ``[torch_npu.]name(...)`` prototype in ``doc``; None when the doc has none."""
    match = re.search(rf"(?<![\w.])(?:torch_npu\.)?{re.escape(name)}\s*\(", doc)
    if match is None:
        return None
    sig = OpSignature(name)
    keyword = False
    for token in _split_top_level(_balanced(doc, match.end() - 1)):
        if token == "*":
            keyword = True
            continue
        left, has_default, _ = token.partition("=")
        words = re.findall(r"[A-Za-z_]\w*", left)
        if not words:
            continue
        param = words[-1]
        (sig.keyword_only if keyword else sig.positional).append(param)
        if not has_default and "?" not in left:
            sig.required.add(param)
    return sig


def parse_op_docs(source: str) -> dict[str, OpSignature]:
    ops: dict[str, OpSignature] = {}
    with warnings.catch_warnings():  # the docs contain invalid escape sequences
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        tree = ast.parse(source)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "_add_torch_npu_docstr"):
            continue
        name, doc = (arg.value for arg in node.args[:2])  # type: ignore[attr-defined]
        sig = parse_signature(name, doc)
        if sig is not None and name not in ops:
            section = re.search(r"支持的型号[:：]?\s*\n(.*?)(?:\n\s*\n|调用示例|$)", doc, re.S)
            sig.supported_products = section.group(1) if section else None
            ops[name] = sig
    return ops


def parse_op_schemas(yaml_text: str) -> dict[str, OpSignature]:
    """``- func: name(Type arg, ..., *, Type kw=default) -> ...`` lines of the wheel's op schema file (also
    entries whose ``func:`` follows another key, as the ``exposed: true`` ones do)."""
    ops: dict[str, OpSignature] = {}
    for match in re.finditer(r"^[- ] func: (\w+)\((.*)\) ->", yaml_text, re.M):
        sig = OpSignature(match.group(1))
        keyword = False
        for token in _split_top_level(match.group(2)):
            if token == "*":
                keyword = True
                continue
            left, has_default, _ = token.partition("=")
            param = left.split()[-1]
            (sig.keyword_only if keyword else sig.positional).append(param)
            if not has_default:
                sig.required.add(param)
        ops.setdefault(sig.name, sig)
    return ops


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vllm-ascend-tests" / f"torch-npu-{TORCH_NPU_VERSION}"


def torch_npu_wheel() -> Path:
    folder = _cache_dir()
    wheels = sorted(folder.glob(f"torch_npu-{TORCH_NPU_VERSION}-*.whl"))
    if wheels:
        return wheels[0]
    folder.mkdir(parents=True, exist_ok=True)
    pip = shutil.which("pip") or shutil.which("pip3")
    cmd = [pip] if pip else [sys.executable, "-m", "pip"]
    cmd += [
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"torch-npu=={TORCH_NPU_VERSION}",
        "-d",
        str(folder),
    ]
    if sys.version_info[:2] != (3, 11):  # any 3.11 wheel carries the same docs
        cmd += ["--python-version", "3.11", "--platform", "manylinux_2_28_x86_64"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wheels = sorted(folder.glob(f"torch_npu-{TORCH_NPU_VERSION}-*.whl"))
    if proc.returncode != 0 or not wheels:
        pytest.fail(
            f"could not download torch-npu=={TORCH_NPU_VERSION} with {' '.join(cmd)}:\n{proc.stderr[-2000:]}"
        )
    return wheels[0]


@pytest.fixture(scope="module")
def npu_ops() -> dict[str, OpSignature]:
    with zipfile.ZipFile(torch_npu_wheel()) as wheel:
        source = wheel.read("torch_npu/_op_plugin_docs.py").decode()
        schemas = wheel.read("torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml").decode()
    return {**parse_op_schemas(schemas), **parse_op_docs(source)}


# -- the calls in our adaptors ---------------------------------------------------------------------
@dataclass(frozen=True)
class NpuCall:
    where: str
    op: str
    num_positional: int
    keywords: tuple[str, ...]


def _is_torch_npu(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "torch_npu"
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "torch_npu_module"
    )


def npu_calls(source: str, filename: str) -> list[NpuCall]:
    calls = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and _is_torch_npu(node.func.value)
        ):
            if any(isinstance(a, ast.Starred) for a in node.args) or any(
                k.arg is None for k in node.keywords
            ):
                calls.append(NpuCall(f"{filename}:{node.lineno}", node.func.attr, -1, ()))
                continue
            calls.append(
                NpuCall(
                    f"{filename}:{node.lineno}",
                    node.func.attr,
                    len(node.args),
                    tuple(k.arg for k in node.keywords),
                )
            )
    return calls


def violations(call: NpuCall, ops: dict[str, OpSignature]) -> list[str]:
    sig = ops.get(call.op)
    if sig is None:
        return [f"{call.where}: torch_npu.{call.op} is not a documented torch_npu op"]
    if call.num_positional < 0:
        return [
            f"{call.where}: torch_npu.{call.op} is called with *args/**kwargs; arguments cannot be checked"
        ]
    problems = []
    if call.num_positional > len(sig.positional):
        problems.append(
            f"{call.where}: torch_npu.{call.op} takes {len(sig.positional)} positional arguments, got {call.num_positional}"
        )
    given = set(sig.positional[: call.num_positional])
    for kw in call.keywords:
        if kw not in sig.names:
            problems.append(
                f"{call.where}: torch_npu.{call.op} has no parameter {kw!r} (declared: {', '.join(sig.positional + sig.keyword_only)})"
            )
        elif kw in given:
            problems.append(f"{call.where}: torch_npu.{call.op} gets {kw!r} both positionally and by keyword")
        given.add(kw)
    missing = sorted(sig.required - given)
    if missing:
        problems.append(f"{call.where}: torch_npu.{call.op} is missing required parameters {missing}")
    return problems


def adaptor_calls() -> list[NpuCall]:
    calls = []
    for path in NPU_ADAPTOR_FILES:
        if path.exists():
            calls += npu_calls(path.read_text(), str(path.relative_to(REPO_ROOT)))
    return calls


# -- tests --------------------------------------------------------------------------------------------
def test_the_wheel_documents_the_ops_we_rely_on(npu_ops):
    assert len(npu_ops) > 150
    fia = npu_ops["npu_fused_infer_attention_score"]
    assert fia.positional == ["query", "key", "value"] and fia.required == {"query", "key", "value"}
    assert {"block_table", "actual_seq_lengths_kv", "num_key_value_heads", "sparse_mode"} <= set(
        fia.keyword_only
    )
    gating = npu_ops["npu_moe_gating_top_k"]  # documented without the torch_npu. prefix and without '*'
    assert gating.positional[:2] == ["x", "k"] and gating.required == {"x", "k"}
    quantize = npu_ops["npu_quantize"]  # the quant ops' calls pass these positionally
    assert quantize.positional == ["input", "scales", "zero_points", "dtype", "axis", "div_mode"]
    assert npu_ops["npu_format_cast"].positional == ["self", "acl_format"]
    assert npu_ops["npu_quant_matmul"].keyword_only == ["offset", "pertoken_scale", "bias", "output_dtype"]
    dispatch = npu_ops["npu_moe_distribute_dispatch"]  # from the op schemas: the docs do not cover it
    assert dispatch.positional == [
        "x",
        "expert_ids",
        "group_ep",
        "ep_world_size",
        "ep_rank_id",
        "moe_expert_num",
    ]
    assert {"x_active_mask", "global_bs", "expert_token_nums_type"} <= set(dispatch.keyword_only)
    indexer = npu_ops["npu_lightning_indexer"]  # an ``exposed: true`` schema entry; its doc says ``custom.``
    assert indexer.positional == ["query", "key", "weights"]
    assert {"block_table", "layout_key", "sparse_count", "sparse_mode"} <= set(indexer.keyword_only)
    sfa = npu_ops["npu_sparse_flash_attention"]
    assert sfa.required == {"query", "key", "value", "sparse_indices", "scale_value"}
    assert {"query_rope", "key_rope", "sparse_block_size", "layout_kv"} <= set(sfa.keyword_only)
    combine = npu_ops["npu_moe_distribute_combine"]
    assert combine.required == {
        "expand_x",
        "expert_ids",
        "expand_idx",
        "ep_send_counts",
        "expert_scales",
        "group_ep",
        "ep_world_size",
        "ep_rank_id",
        "moe_expert_num",
    }


def test_every_npu_adaptor_call_matches_the_documented_signature(npu_ops):
    calls = adaptor_calls()
    assert len(calls) >= 15, f"found only {len(calls)} torch_npu calls: the scan is broken"
    problems = [p for call in calls for p in violations(call, npu_ops)]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_wrong_calls(npu_ops):
    source = """
def f(torch_npu, x):
    torch_npu.npu_rms_nrom(x, x)
    torch_npu.npu_rms_norm(x, x, eps=1e-6)
    torch_npu.npu_dynamic_quant(x, x)
    torch_npu_module().npu_scatter_pa_kv_cache(x, x, x, x)
    torch_npu.npu_swiglu(x, dim=-1)
"""
    problems = [p for call in npu_calls(source, "snippet") for p in violations(call, npu_ops)]
    assert problems == [
        "snippet:3: torch_npu.npu_rms_nrom is not a documented torch_npu op",
        "snippet:4: torch_npu.npu_rms_norm has no parameter 'eps' (declared: self, gamma, epsilon)",
        "snippet:5: torch_npu.npu_dynamic_quant takes 1 positional arguments, got 2",
        "snippet:6: torch_npu.npu_scatter_pa_kv_cache is missing required parameters ['slot_mapping']",
    ]


def _npu_adaptor_classes() -> list[type]:
    from vllm_ascend.ascend310p.overlay import Ascend310PDeviceAdaptor

    return [A2A3DeviceAdaptor, A5DeviceAdaptor, Ascend310PDeviceAdaptor]


@pytest.mark.parametrize("cls", _npu_adaptor_classes(), ids=lambda c: c.__name__)
def test_npu_adaptors_map_every_op_or_say_it_runs_torch(cls):
    """An NPU adaptor op whose code makes no torch_npu call is exactly one listed in TORCH_OPS."""
    from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor

    assert not issubclass(cls, ReferenceDeviceAdaptor)
    torch_only = {op for op in OPS if not _calls_reached_by(cls, op)}
    assert torch_only == set(cls.TORCH_OPS)


def _calls_reached_by(cls: type, op: str, seen: set[str] | None = None) -> list[NpuCall]:
    """The torch_npu calls in ``op``'s code and in the methods of ``cls`` it calls on ``self``."""
    seen = set() if seen is None else seen
    seen.add(op)
    fn = getattr(cls, op)
    fn = getattr(fn, "__wrapped__", fn)
    source = textwrap.dedent(inspect.getsource(fn))
    calls = npu_calls(source, f"{fn.__module__}.{fn.__qualname__}")
    for name in dict.fromkeys(re.findall(r"\bself\.(\w+)\(", source)):
        if name not in seen and callable(getattr(cls, name, None)):
            calls += _calls_reached_by(cls, name, seen)
    return calls


def test_310p_adaptor_reaches_only_ops_documented_for_310p(npu_ops):
    """Where an op's doc lists its supported products, it must list the Atlas inference series (310P)."""
    from vllm_ascend.ascend310p.attention.impl import OPS_310P
    from vllm_ascend.ascend310p.overlay import Ascend310PDeviceAdaptor as cls

    reached = [call for op in (*OPS, *OPS_310P) for call in _calls_reached_by(cls, op)]
    assert {c.op for c in reached} >= {
        "npu_prompt_flash_attention",
        "npu_incre_flash_attention",
        "npu_grouped_matmul",
    }
    unsupported = [
        f"{c.where}: torch_npu.{c.op} (supported: {' '.join(npu_ops[c.op].supported_products.split())})"
        for c in reached
        if npu_ops[c.op].supported_products is not None
        and "Atlas 推理系列" not in npu_ops[c.op].supported_products
    ]
    assert not unsupported, "\n".join(unsupported)
    scatter = npu_ops["npu_scatter_pa_kv_cache"].supported_products
    assert (
        scatter is not None and "Atlas 推理系列" not in scatter
    )  # why 310P keeps reshape_and_cache in torch
