"""The two forms of the V2 kernel references that have both (``kernels.v2``: ``<name>_torch``, the torch spec on
the whole (request, lane) grid, and ``<name>_host``, the same on numpy views of host tensors, which the cpu
device serves): tests run each case under both, so the form serving does not pick for a case is checked too."""

from __future__ import annotations

import pytest

FORMS = ("grid", "host")


def use_reference_form(monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """``"host"``: every ``<name>_torch`` with a host form is that form for the test; ``"grid"``: the torch
    references as they are."""
    from vllm_ascend.kernels.v2 import block_table, input_batch, sample_gumbel

    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if form == "grid":
        return
    for module in (input_batch, block_table, sample_gumbel):
        for name in dir(module):
            if name.endswith("_host"):
                monkeypatch.setattr(module, name.removesuffix("_host") + "_torch", getattr(module, name))
