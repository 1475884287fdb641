"""``ngram_propose``: the Triton kernel (interpreted) and the torch reference against a brute-force
Python oracle of prompt lookup, on random and adversarial contexts."""

from __future__ import annotations

import pytest
import torch

import vllm_ascend.kernels as K
from vllm_ascend.kernels import _backend, ngram
from vllm_ascend.kernels._triton import ngram as triton_ngram


def oracle(ctx: list[int], min_n: int, max_n: int, k: int, limit: int | None) -> list[int]:
    """The draft of one context: longest n first, then the most recent occurrence ending before the
    last token, then up to k following tokens, never reaching ``limit`` tokens in all."""
    total = len(ctx)
    if limit is not None and total >= limit:
        return []
    room = k if limit is None else min(k, limit - total)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        for stop in range(total - 1, n - 1, -1):
            if ctx[stop - n : stop] == ctx[total - n :]:
                return ctx[stop : stop + min(room, total - stop)]
    return []


def _assert_all_agree(token_ids, num_tokens, min_n, max_n, k, limit):
    """Kernel, reference and oracle agree on every row (drafts padded with -1, counts)."""
    cols = token_ids.shape[1]
    want = [
        oracle(token_ids[i, : min(max(n, 0), cols)].tolist(), min_n, max_n, k, limit)
        for i, n in enumerate(num_tokens.tolist())
    ]
    want_drafts = torch.tensor([w + [-1] * (k - len(w)) for w in want], dtype=torch.int64).reshape(-1, k)
    want_counts = torch.tensor([len(w) for w in want], dtype=torch.int32)
    ref = ngram.ngram_propose_torch(token_ids, num_tokens, min_n, max_n, k, limit)
    got = K.ngram_propose(token_ids, num_tokens, min_n, max_n, k, limit)
    for name, (drafts, counts) in (("reference", ref), ("kernel", got)):
        assert drafts.dtype == torch.int64 and counts.dtype == torch.int32, name
        assert torch.equal(counts, want_counts), (name, counts, want_counts)
        assert torch.equal(drafts, want_drafts), (name, drafts, want_drafts)
    return want


class _PoisonedTorch:
    """``torch`` whose ``empty`` returns memory filled with a sentinel no draft or count can hold."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        return torch.empty(*args, **kwargs).fill_(-(2**31) + 7)


@pytest.fixture(autouse=True)
def _poisoned_ngram_outputs(monkeypatch):
    """The kernel's output buffers start poisoned, so an element it forgets to write fails."""
    monkeypatch.setattr(triton_ngram, "torch", _PoisonedTorch())


def test_the_kernel_path_is_triton_under_the_interpreter():
    impl = _backend.dispatch("ngram", "ngram_propose", ngram.ngram_propose_torch, torch.device("cpu"))
    assert impl is triton_ngram.ngram_propose


@pytest.mark.parametrize(
    "min_n, max_n, k, limit",
    [(1, 1, 3, None), (1, 4, 5, None), (2, 3, 4, 200), (3, 5, 2, None), (2, 2, 16, 90), (1, 3, 20, None)],
)
def test_random_contexts_match_the_oracle(gen, min_n, max_n, k, limit):
    rows, cols = 6, 77  # several 32-index tiles per row in the interpreter
    vocab = int(torch.randint(2, 6, (), generator=gen))  # small vocabularies: many repeats
    tokens = torch.randint(0, vocab, (rows, cols), generator=gen, dtype=torch.int32)
    lengths = torch.randint(0, cols + 1, (rows,), generator=gen)
    lengths[0] = cols
    want = _assert_all_agree(tokens, lengths, min_n, max_n, k, limit)
    if limit is None and max_n <= 3:
        assert any(want), "a small vocabulary must give some draft"


def test_adversarial_contexts(gen):
    cols = 70
    rows = [
        [7] * 70,  # one repeated token: the most recent occurrence, one token left before the end
        list(range(100, 170)),  # no repeat: no draft
        [
            1,
            2,
            3,
            9,
            8,
            *range(200, 250),
            2,
            3,
            7,
            6,
            *range(300, 308),
            1,
            2,
            3,
        ],  # long far back, short recent
        [4, 5, 6, 1] * 17 + [4, 5],  # a match in every tile: the most recent one wins
        [3, 1, 2] + [0] * 61 + [3, 1, 2, 3, 1, 2],  # two earlier occurrences of the best n-gram
        [9] * 70,  # inactive (length 0)
        [256 + 5, 5, 256 + 5, 5 + 512] + [0] * 66,  # ids equal in their low byte only
    ]
    lengths = torch.tensor([70, 70, 70, 70, 70, 0, 4])
    tokens = torch.tensor([r + [0] * (cols - len(r)) for r in rows], dtype=torch.int64)
    want = _assert_all_agree(tokens, lengths, 1, 4, 5, None)
    assert want[0] == [7] and want[1] == [] and want[5] == [] and want[6] == []
    assert want[2] == [9, 8, 200, 201, 202]  # the longest match (far back) beats a shorter recent one
    assert want[3] == [6, 1, 4, 5] and want[4] == [3, 1, 2]  # the most recent occurrence
    assert _assert_all_agree(tokens, lengths, 1, 2, 5, None)[2] == [7, 6, 300, 301, 302]


def test_max_model_len_cuts_and_stops_the_drafts():
    tokens = torch.tensor([[1, 2, 3, 4, 5, 1, 2, 3]] * 4, dtype=torch.int32)
    lengths = torch.tensor([8, 8, 8, 7])
    for limit, want in ((100, [4, 5, 1, 2]), (10, [4, 5]), (9, [4]), (8, [])):
        drafts = _assert_all_agree(tokens, lengths, 2, 3, 4, limit)
        assert drafts[0] == want, limit


def test_lengths_outside_the_row_are_clamped():
    tokens = torch.tensor([[5, 6, 5, 6, 5], [5, 6, 5, 6, 5]], dtype=torch.int32)
    drafts, counts = K.ngram_propose(tokens, torch.tensor([9, -3]), 1, 2, 3)
    assert drafts.tolist() == [[6, 5, -1], [-1, -1, -1]] and counts.tolist() == [2, 0]


def test_k_above_one_compiled_variant_and_empty_batches():
    tokens = torch.tensor([[1, 2] * 20], dtype=torch.int32)
    _assert_all_agree(tokens, torch.tensor([40]), 1, 2, 33, None)  # draft block 64, not 16
    drafts, counts = K.ngram_propose(tokens[:0], torch.zeros(0, dtype=torch.int64), 1, 2, 3)
    assert drafts.shape == (0, 3) and counts.shape == (0,)


def test_a_non_contiguous_token_view():
    base = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2]] * 3, dtype=torch.int64).t().contiguous()
    _assert_all_agree(base.t(), torch.tensor([8, 5, 3]), 1, 3, 3, None)


def test_the_torch_backend_gives_the_same_drafts(monkeypatch, gen):
    tokens = torch.randint(0, 3, (4, 50), generator=gen, dtype=torch.int32)
    lengths = torch.tensor([50, 20, 3, 0])
    got = K.ngram_propose(tokens, lengths, 1, 3, 4, 60)
    monkeypatch.setenv("VLLM_ASCEND_KERNEL_BACKEND", "torch")
    ref = K.ngram_propose(tokens, lengths, 1, 3, 4, 60)
    assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"min_n": 0}, "min_n must be an int >= 1, got 0"),
        ({"min_n": 3, "max_n": 2}, "max_n must be an int >= 3, got 2"),
        ({"k": 0}, "k must be an int >= 1, got 0"),
        ({"k": 2.0}, "k must be an int >= 1, got 2.0"),
        ({"max_model_len": 0}, r"max_model_len must be None or an int in \[1, 2147483647\], got 0"),
        ({"token_ids": torch.zeros(2, 4)}, "token_ids must be a 2-D int32 or int64 tensor"),
        ({"token_ids": torch.zeros(8, dtype=torch.int32)}, "token_ids must be a 2-D int32 or int64"),
        (
            {"num_tokens": torch.zeros(3, dtype=torch.int32)},
            r"num_tokens must be an integer tensor of shape \(2,\)",
        ),
        ({"num_tokens": torch.zeros(2)}, "num_tokens must be an integer tensor"),
    ],
)
def test_invalid_arguments_name_the_field(kwargs, match):
    args = dict(
        token_ids=torch.zeros(2, 4, dtype=torch.int32),
        num_tokens=torch.zeros(2, dtype=torch.int32),
        min_n=1,
        max_n=2,
        k=3,
        max_model_len=None,
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        K.ngram_propose(**args)


def test_the_warmup_item_runs_the_kernel(monkeypatch):
    calls = []
    real = triton_ngram.ngram_propose
    monkeypatch.setattr(triton_ngram, "ngram_propose", lambda *a: calls.append(a[0].dtype) or real(*a))
    ngram.ngram_warmup("cpu", 512, (torch.float32,))
    assert calls == [torch.int32]
