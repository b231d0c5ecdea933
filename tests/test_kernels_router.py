"""The Triton router (softmax, top-k, renormalize, expert scales) against the torch ops it replaces."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from flashdesk.kernels.backend import kernels
from flashdesk.kernels.router import route, route_reference

pytest.importorskip("triton")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("experts, top_k", [(128, 8), (8, 2), (12, 3)])
def test_route_picks_the_same_experts_with_the_same_weights(dtype, experts, top_k):
    gen = torch.Generator().manual_seed(experts + top_k)
    # distinct values, exact in bf16 (a tie is the next test's)
    logits = torch.stack([torch.randperm(experts, generator=gen) for _ in range(16)]).to(dtype) / 16 - 2
    scale = (torch.rand(experts, generator=gen) + 0.5).to(dtype)
    with kernels("triton"):
        weights, ids = route(logits, top_k, scale)
    want_w, want_ids = route_reference(logits, top_k, scale)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, want_ids)  # largest first, as torch.topk
    torch.testing.assert_close(weights, want_w, rtol=1e-6, atol=1e-7)


def test_a_token_routes_the_same_alone_and_among_sixteen():
    gen = torch.Generator().manual_seed(3)
    logits, scale = torch.randn(16, 128, generator=gen).to(torch.bfloat16), torch.rand(128, generator=gen)
    with kernels("triton"):
        weights, ids = route(logits, 8, scale)
        for r in (0, 5, 15):
            w_alone, ids_alone = route(logits[r : r + 1], 8, scale)
            assert torch.equal(w_alone[0], weights[r]) and torch.equal(ids_alone[0], ids[r])


def test_of_two_tied_experts_the_lower_index_is_chosen_first():
    logits = torch.tensor([[0.0, 1.0, 3.0, 1.0, 3.0, -1.0]])
    with kernels("triton"):
        weights, ids = route(logits, 3, torch.ones(6))
    assert ids.tolist() == [[2, 4, 1]]
    assert weights[0, 0] == weights[0, 1] > weights[0, 2]


def test_route_refuses_more_experts_than_there_are():
    with kernels("triton"), pytest.raises(ValueError, match="top_k 9 must be between 1 and the 8 experts"):
        route(torch.zeros(2, 8), 9, torch.ones(8))
