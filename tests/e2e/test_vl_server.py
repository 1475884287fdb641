"""``vllm-ascend serve`` with the tiny Qwen2.5-VL on 127.0.0.1: ``/v1/chat/completions`` with an image as a
base64 data URL answers HF transformers' fp32 greedy tokens for that image (one server start)."""

from __future__ import annotations

import base64
import io
import json

import pytest

from .serving import request_json, served
from .test_vl_models import MAX_NEW_TOKENS, _image, _prompt

IMAGE_ONLY = {"VLLM_ASCEND_TESTING_IMAGE_ONLY_PROCESSORS": "1"}


@pytest.fixture(scope="module")
def vl_server(tmp_path_factory):
    from vllm_ascend.testing.tiny_vl_models import TinyVLSpec, build_tiny_vl_model

    model_dir = build_tiny_vl_model(TinyVLSpec(kind="qwen2_5_vl"), tmp_path_factory.mktemp("vl"))
    log = tmp_path_factory.mktemp("server") / "server.log"
    args = [
        "--dtype", "float32", "--block-size", "16", "--max-model-len", "1024",
        "--kv-cache-memory-bytes", str(64 << 20), "--served-model-name", "tiny-vl",
        "--max-num-batched-tokens", "32", "--limit-mm-per-prompt", json.dumps({"image": 2, "video": 0}),
    ]  # fmt: skip
    with served(model_dir, args, log, env=IMAGE_ONLY) as base:
        yield model_dir, base


def _data_url(image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_chat_with_base64_images_matches_hf(vl_server):
    from vllm_ascend.testing.hf_reference import hf_vl_greedy
    from vllm_ascend.testing.image_only_processors import install

    install()
    model_dir, base = vl_server
    images = [_image(168, 224, 21), _image(112, 140, 22)]
    text = "the river and the mountain"
    expected = hf_vl_greedy(model_dir, [(_prompt(text, 1), [image]) for image in images], MAX_NEW_TOKENS)
    assert expected[0] != expected[1], expected  # the answer depends on the image
    for image, want in zip(images, expected, strict=True):
        content = [
            {"type": "image_url", "image_url": {"url": _data_url(image)}},
            {"type": "text", "text": text},
        ]
        status, body = request_json(
            f"{base}/v1/chat/completions",
            {"model": "tiny-vl", "messages": [{"role": "user", "content": content}], "max_tokens": MAX_NEW_TOKENS,
             "temperature": 0, "ignore_eos": True, "return_token_ids": True},
        )  # fmt: skip
        assert status == 200, body
        choice = body["choices"][0]
        assert choice["token_ids"] == want, (choice, want)
        assert body["usage"]["completion_tokens"] == MAX_NEW_TOKENS
