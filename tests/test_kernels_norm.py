"""The Triton RMSNorm against the torch definition, and its rows independent of the row count."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flashdesk.kernels.backend import CompileSpec, kernels  # noqa: E402
from flashdesk.kernels.norm import rms_norm, rms_norm_reference  # noqa: E402

pytest.importorskip("triton")


@pytest.mark.parametrize("shape", [(5, 64), (3, 4, 16), (2, 40)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_matches_the_definition(shape, with_weight):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen) * 3
    w = torch.randn(shape[-1], generator=gen) if with_weight else None
    with kernels("triton"):
        got = rms_norm(x, w, 1e-6)
    torch.testing.assert_close(got, rms_norm_reference(x, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_bf16_rows_round_like_the_definition():
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with kernels("triton"):
        got = rms_norm(x, None, 1e-6)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), rms_norm_reference(x, None, 1e-6).float(), rtol=1e-2, atol=1e-2)


def test_a_row_is_the_same_alone_and_among_sixteen():
    x = torch.randn(16, 2, 48, generator=torch.Generator().manual_seed(2))
    w = torch.rand(48, generator=torch.Generator().manual_seed(3))
    with kernels("triton"):
        block = rms_norm(x, w, 1e-6)
        for r in (0, 7, 15):
            assert torch.equal(rms_norm(x[r:r + 1], w, 1e-6)[0], block[r])


def test_compile_specs_name_every_argument():
    from flashdesk.kernels.norm_triton import compile_specs

    for spec in compile_specs():
        assert isinstance(spec, CompileSpec)
        assert list(spec.signature) == spec.fn.arg_names
        assert set(spec.constexprs) == {n for n, t in spec.signature.items() if t == "constexpr"}
