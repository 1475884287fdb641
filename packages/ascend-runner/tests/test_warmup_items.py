"""The runner's warm-up compiles only what its configuration launches."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_ascend.runner.model_runner import _unused_warmup_items


@pytest.mark.parametrize(
    ("spec", "unused"),
    [
        (None, ("rejection", "ngram")),
        (SimpleNamespace(method="ngram"), ("ngram",)),
        (SimpleNamespace(method="eagle3"), ("ngram",)),
        (SimpleNamespace(method="ngram_gpu"), ()),
    ],
)
def test_unused_warmup_items(spec, unused):
    assert _unused_warmup_items(spec) == unused
