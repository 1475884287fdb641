"""The two forms of the V2 kernel references that have both (``kernels.v2``: ``<name>_torch`` on the whole
(request, lane) grid, ``<name>_rows_torch`` request by request, chosen by batch size): tests run each case
under both, so the form serving does not pick for a case is checked too."""

from __future__ import annotations

import pytest

FORMS = ("grid", "per-request")


def use_reference_form(monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """``"per-request"``: every ``<name>_torch`` with a per-request form is that form for the test;
    ``"grid"``: the references as they are."""
    from vllm_ascend.kernels.v2 import block_table, input_batch

    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if form == "grid":
        return
    for module in (input_batch, block_table):
        for name in dir(module):
            if name.endswith("_rows_torch"):
                monkeypatch.setattr(
                    module, name.removesuffix("_rows_torch") + "_torch", getattr(module, name)
                )
