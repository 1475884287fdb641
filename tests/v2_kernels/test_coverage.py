"""Every Triton kernel Model Runner V2 launches has an Ascend override registered with vLLM's dispatcher."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import vllm.v1.worker.gpu as v2_package

from vllm_ascend.kernels.v2 import v2_kernel_overrides


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "jit"


#: Modules outside ``vllm/v1/worker/gpu`` whose kernels V2 launches: V2's ``model_states/mamba_hybrid.py`` takes
#: the prefix-caching (``mamba_cache_mode="align"``) state bookkeeping and copies of hybrid models from
#: ``vllm/v1/worker/mamba_utils.py``. Their kernels count, except those V2 never launches here, each with why.
SHARED_MODULES: dict[str, dict[str, str]] = {
    "vllm.v1.worker.mamba_utils": {
        "batch_memcpy_kernel": "V1's align-mode copies (served by the runner's V1 table, runner/mamba_state.py)",
        "get_aligned_state_indices_multi_group_kernel": "launched for GDN metadata builders that opt into "
        "MRV2's aligned-index precompute, which vLLM allows on CUDA devices only",
    }
}


def _module_files() -> list[tuple[str, Path]]:
    root = Path(v2_package.__file__).parent
    files = [
        ("vllm.v1.worker.gpu." + ".".join(path.relative_to(root).with_suffix("").parts), path)
        for path in root.rglob("*.py")
    ]
    for module in SHARED_MODULES:
        files.append((module, Path(importlib.util.find_spec(module).origin)))
    return files


def launched_kernels() -> set[str]:
    """``module.kernel`` for every ``@triton.jit`` function of ``vllm/v1/worker/gpu`` (and of
    :data:`SHARED_MODULES`, but their exceptions) launched as ``kernel[grid](...)`` anywhere in those modules (a
    name launched where it is not defined is one a module imported: every module defining it counts)."""
    defined: dict[str, set[str]] = {}
    launches: set[tuple[str, str]] = set()
    for module, path in _module_files():
        module = module.removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(_is_triton_jit(d) for d in node.decorator_list):
                defined.setdefault(node.name, set()).add(module)
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Subscript)
                and isinstance(node.func.value, ast.Name)
            ):
                launches.add((module, node.func.value.id))
    kernels: set[str] = set()
    for module, name in launches:
        owners = defined.get(name, set())
        kernels.update(f"{owner}.{name}" for owner in ({module} if module in owners else owners))
    return {k for k in kernels if k.rsplit(".", 1)[1] not in SHARED_MODULES.get(k.rsplit(".", 1)[0], {})}


def test_every_launched_v2_kernel_has_an_override() -> None:
    """Every kernel has one, except V2's draft-verification kernels not done yet: while any of those is
    missing, the V2 runner refuses speculative decoding by name (``missing_verification_kernels``, asserted
    end to end in ``tests/e2e/test_runner_v2.py``)."""
    from vllm_ascend.runner.model_runner_v2 import VERIFICATION_KERNELS

    kernels = launched_kernels()
    assert len(kernels) > 50, sorted(kernels)  # the scan itself found V2's kernels
    assert set(VERIFICATION_KERNELS) <= kernels, sorted(set(VERIFICATION_KERNELS) - kernels)
    missing = sorted(kernels - v2_kernel_overrides().keys() - set(VERIFICATION_KERNELS))
    assert not missing, f"V2 kernels without an Ascend override: {missing}"


def test_no_override_names_a_kernel_vllm_does_not_launch() -> None:
    stale = sorted(v2_kernel_overrides().keys() - launched_kernels())
    assert not stale, f"overrides for kernels V2 does not launch: {stale}"


def test_every_shared_exception_is_a_kernel_vllm_still_launches() -> None:
    """An exception of :data:`SHARED_MODULES` names a kernel its module defines and launches (else it is stale)."""
    for module, exceptions in SHARED_MODULES.items():
        source = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
        jit = {
            n.name
            for n in ast.walk(source)
            if isinstance(n, ast.FunctionDef) and any(map(_is_triton_jit, n.decorator_list))
        }
        launched = {
            n.func.value.id
            for n in ast.walk(source)
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Subscript)
            and isinstance(n.func.value, ast.Name)
        }
        assert set(exceptions) <= jit & launched, sorted(set(exceptions) - (jit & launched))
        assert {
            f"{module}.preprocess_mamba_align_fused_kernel",
            f"{module}.precopy_mamba_align_fused_kernel",
        } <= (launched_kernels())
