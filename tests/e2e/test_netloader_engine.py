"""netloader through ``vllm.LLM`` on the reference device: a manipulated checkpoint seed is refused before
any transfer (fallback, or an error naming the tensors), and RFork from a live engine's own weights.

Engines in one process share vLLM's parallel state, which an engine's shutdown tears down, so each
test builds its own engines (``make_llm`` shuts them down after the test).
"""

from __future__ import annotations

import logging

import pytest
import torch

MAX_NEW_TOKENS = 8
PROMPTS = [[11, 42, 7, 300, 5], [250, 3, 99, 17, 64, 128, 8]]
#: Prefix caching off: engine A changes its weights in place, and cached KV of old weights must not be reused.
ENGINE = dict(enable_prefix_caching=False)
CHANGED = "model.layers.1.mlp.down_proj.weight"


def _greedy(llm) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_manipulated_checkpoint_seed_falls_back_or_fails_naming_the_tensors(make_llm, tiny_qwen3):
    from vllm_ascend.netloader.seed_server import SeedServer, load_checkpoint

    disk_tokens = _greedy(make_llm(tiny_qwen3, **ENGINE))
    state = load_checkpoint(tiny_qwen3)
    dropped = ["model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.k_proj.weight"]
    for name in dropped:
        del state[name]
    state["model.layers.0.mlp.extra.weight"] = torch.zeros(4, 4)
    warnings = _Warnings()
    logger = logging.getLogger("vllm_ascend.netloader.loader")
    logger.addHandler(warnings)
    try:
        with SeedServer.serving(state) as seed:
            extra = {"source": seed.url, "timeout": 10, "retries": 0}
            fallen_back = make_llm(
                tiny_qwen3, load_format="netloader", model_loader_extra_config=extra, **ENGINE
            )
            assert _greedy(fallen_back) == disk_tokens
            with pytest.raises(Exception, match="fallback is off") as info:
                make_llm(
                    tiny_qwen3,
                    load_format="netloader",
                    model_loader_extra_config=dict(extra, fallback=False),
                    **ENGINE,
                )
    finally:
        logger.removeHandler(warnings)
    mismatch = (
        "the seed does not serve this model's weights: 2 missing (model.layers.0.mlp.up_proj.weight, "
        "model.layers.1.self_attn.k_proj.weight); 1 unexpected (model.layers.0.mlp.extra.weight)"
    )
    assert warnings.messages == [
        f"netloader: cannot load from seed {seed.url} (WeightMismatch: {mismatch}); "
        "falling back to the default loader"
    ]
    assert mismatch in str(info.value)


def test_rfork_from_a_live_engine(make_llm, tiny_qwen3):
    from vllm_ascend.netloader.live_seed import serve_live_weights, stop_live_weights

    engine_a = make_llm(tiny_qwen3, **ENGINE)  # loaded from the model's files
    disk_tokens = _greedy(engine_a)

    def change(model):  # A's live state now differs from its files
        with torch.no_grad():
            model.get_parameter(CHANGED).neg_()
        return model.get_parameter(CHANGED).detach().clone()

    (changed,) = engine_a.apply_model(change)
    a_tokens = _greedy(engine_a)
    assert a_tokens != disk_tokens
    (url,) = serve_live_weights(engine_a)
    try:
        extra = {"source": url, "timeout": 10, "retries": 0, "fallback": False}
        engine_b = make_llm(tiny_qwen3, load_format="netloader", model_loader_extra_config=extra, **ENGINE)
        (received,) = engine_b.apply_model(lambda model: model.get_parameter(CHANGED).detach().clone())
        assert torch.equal(received, changed)
        assert _greedy(engine_b) == a_tokens
    finally:
        assert stop_live_weights(engine_a) == [True]
