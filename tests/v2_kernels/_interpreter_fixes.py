"""Two gaps of upstream Triton's interpreter that vLLM's sampling kernels hit when the oracle runs them
(for the ``sample_*`` / ``metrics_logits`` oracle tests; a candidate for ``vllm_oracle`` itself).

- ``tl.max``, ``tl.sum``, ``tl.cdiv``, ... (``triton.language.standard``) are JITFunctions when Triton
  was imported before ``TRITON_INTERPRET=1`` was set (vLLM imports it first), and a JITFunction cannot
  be called from interpreted code ("Cannot call @triton.jit'd outside of the scope of a kernel").
- A block mask combined with a scalar condition (``mask & is_valid``) comes out as int32 data, which
  the interpreter's load/store refuse ("mask has unsupported dtype"); the mask is read as bool.

``interpreter_fixes(monkeypatch)`` applies both for one test (the fixture of the test modules).
"""

from __future__ import annotations

import importlib

import numpy as np


def interpreter_fixes(monkeypatch) -> None:
    import triton.language as tl
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    importlib.import_module("triton.experimental.gluon")  # imports from tl.standard: before the swap
    # All swapped together: the interpreter recognises its combine functions by identity.
    swapped = {
        id(value): interpreter.InterpretedFunction(value.fn)
        for value in vars(tl.standard).values()
        if isinstance(value, JITFunction)
    }
    for module in (tl.standard, tl):
        for name, value in list(vars(module).items()):
            if id(value) in swapped:
                monkeypatch.setattr(module, name, swapped[id(value)])

    builder = interpreter.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store

    def as_bool(mask):
        if mask.data.dtype == np.bool_:
            return mask
        return interpreter.TensorHandle(mask.data.astype(np.bool_), tl.int1)

    monkeypatch.setattr(
        builder, "create_masked_load", lambda self, ptrs, mask, *rest: load(self, ptrs, as_bool(mask), *rest)
    )
    monkeypatch.setattr(
        builder,
        "create_masked_store",
        lambda self, ptrs, value, mask, *rest: store(self, ptrs, value, as_bool(mask), *rest),
    )
