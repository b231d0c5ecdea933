"""Triton attention and KV-cache write under the interpreter, against the plain-torch definitions.

The decode kernel must also be batch invariant: a query's output is bit-identical whether it was
computed alone (plain decoding, start = p) or inside a verify block, with rings that wrap and key
ranges that cross chunk and split boundaries.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")

from flashdesk.kernels.attention import attention_reference
from flashdesk.kernels.attention_triton import compile_specs, decode_attention, prefill_attention
from flashdesk.kernels.backend import kernels
from flashdesk.kernels.kv_write import FP8, compile_specs as kv_write_specs, kv_write

SCALE = 0.3
SLACK = 16
MAX_CONTEXT = 100


class Cache:
    """One layer's cache as the engine keeps it: [capacity, Hkv, D] (+ fp32 scales when fp8)."""

    def __init__(self, capacity, hkv, d, dtype):
        self.capacity = capacity
        self.k = torch.zeros(capacity, hkv, d, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.k_scale = torch.ones(capacity, hkv) if dtype == FP8 else None
        self.v_scale = torch.ones(capacity, hkv) if dtype == FP8 else None

    def clone(self):
        other = Cache.__new__(Cache)
        other.__dict__ = {name: x.clone() if isinstance(x, torch.Tensor) else x for name, x in self.__dict__.items()}
        return other

    def write(self, k, v, start, triton=True):
        with kernels("triton" if triton else "torch"):
            kv_write(
                k,
                v,
                self.k,
                self.v,
                self.k_scale,
                self.v_scale,
                torch.tensor([start], dtype=torch.int32),
                self.capacity,
            )

    def read(self, positions):
        """Dequantized K, V at these positions (from their ring slots)."""
        slots = positions % self.capacity
        k, v = self.k[slots].float(), self.v[slots].float()
        if self.k_scale is not None:
            k, v = k * self.k_scale[slots, :, None], v * self.v_scale[slots, :, None]
        return k, v

    def bytes(self):
        return [
            x.view(torch.uint8) if x.dtype == FP8 else x
            for x in (self.k, self.v, self.k_scale, self.v_scale)
            if x is not None
        ]

    def attend(self, q, start, window, split):
        return decode_attention(
            q,
            self.k,
            self.v,
            self.k_scale,
            self.v_scale,
            torch.tensor([start], dtype=torch.int32),
            window,
            self.capacity,
            SCALE,
            MAX_CONTEXT,
            split=split,
        )


def reference(cache, q, start, window):
    """attention_reference over the dequantized keys each query of the block may see."""
    end = start + q.shape[0]
    lo = 0 if window is None else max(0, start - window + 1)
    k, v = cache.read(torch.arange(lo, end))
    return attention_reference(q.float(), k, v, torch.arange(start, end), torch.arange(lo, end), window, SCALE)


def same_bytes(a: Cache, b: Cache) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.bytes(), b.bytes()))


# ----------------------------------------------------------------------------- cache write


def test_fp8_write_rounds_like_torch():
    """Every e4m3 value, every midpoint between neighbours (ties go to even) and one ulp either side,
    subnormals, signed zeros and the top of the range, in head vectors whose amax is 448 (scale 1,
    so the kernel's own rounding is compared), then random vectors of very different magnitudes:
    byte for byte what torch writes."""
    codes = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    values = codes[torch.isfinite(codes)].unique()
    mids = (values[1:] + values[:-1]) / 2
    up, down = torch.tensor(float("inf")), torch.tensor(float("-inf"))
    extra = torch.tensor([2.0**-10, 3 * 2.0**-11, 2.0**-12, 1e-30, -1e-30, 0.0, -0.0, 447.9, 440.0, 2.0**-7])
    edge = torch.cat([values, mids, mids.nextafter(up), mids.nextafter(down), extra])
    edge = torch.cat([edge, torch.zeros(-len(edge) % 30)]).view(-1, 15)
    heads = torch.cat([edge, torch.full((len(edge), 1), 448.0)], dim=1)
    gen = torch.Generator().manual_seed(0)
    magnitudes = torch.tensor([1e-20, 1e-3, 1.0, 7.0, 3e4])[torch.randint(0, 5, (12,), generator=gen)]
    heads = torch.cat([heads, torch.randn(12, 16, generator=gen) * magnitudes[:, None]])
    k = heads.view(-1, 2, 16)
    v = -k.flip(0)
    t = k.shape[0]
    ours, theirs = Cache(t + 5, 2, 16, FP8), Cache(t + 5, 2, 16, FP8)
    ours.write(k, v, start=9)  # wraps around the ring
    theirs.write(k, v, start=9, triton=False)
    assert same_bytes(ours, theirs)
    exact = len(values) // 30  # rows holding e4m3 values only: they come back exactly
    assert torch.equal(ours.read(9 + torch.arange(exact))[0], k[:exact])


def run_ptx(ptx: str, registers: dict[str, int]) -> dict[str, int]:
    """A model of the PTX instructions the fp8 conversion uses (prmt.b32 in its default mode,
    shr.b32, and.b32, lop3.b32), on 32-bit registers, as the PTX ISA defines them."""
    registers = dict(registers)

    def value(token: str) -> int:
        return registers[token] if token in registers else int(token, 0)

    for statement in ptx.replace("{", "").replace("}", "").split(";"):
        statement = statement.strip()
        if not statement or statement.startswith(".reg"):
            continue
        op, operands = statement.split(None, 1)
        dest, *sources = (token.strip() for token in operands.split(","))
        a = [value(token) for token in sources]
        if op == "prmt.b32":  # byte i of d is byte (selector nibble i) of the pair {b, a}
            pool, result = a[0] | a[1] << 32, 0
            for i in range(4):
                nibble = a[2] >> 4 * i & 0xF
                assert nibble < 8, "the sign-replicating selector mode is not modeled"
                result |= (pool >> 8 * nibble & 0xFF) << 8 * i
        elif op == "shr.b32":
            result = a[0] >> a[1]
        elif op == "and.b32":
            result = a[0] & a[1]
        elif op == "lop3.b32":  # bit j is bit (a_j b_j c_j, read as a 3-bit number) of the table
            result = sum(
                (a[3] >> ((a[0] >> j & 1) << 2 | (a[1] >> j & 1) << 1 | (a[2] >> j & 1)) & 1) << j for j in range(32)
            )
        else:
            raise AssertionError(f"{op} is not modeled")
        registers[dest] = result & 0xFFFFFFFF
    return registers


def test_the_packed_fp8_conversion_gives_each_value_times_2_to_the_minus_8():
    """The decode loop's PTX (a GPU runs it; the interpreter runs the same bit path in Triton ops),
    through a model of its instructions: every e4m3 byte in each of the four places of the packed
    register comes out as the fp16 of its value * 2**-8 in its place (pairs 0, 1 in $0, 2, 3 in $1,
    low half first), bit for bit; NaN is never stored in a cache."""
    from flashdesk.kernels.attention_triton import E4M3_TO_F16_PTX

    codes = torch.arange(256, dtype=torch.uint8)
    expected = ((codes.view(FP8).float() * 2.0**-8).half().view(torch.int16).int() & 0xFFFF).tolist()
    for byte in range(256):
        packed = [byte, (byte + 1) % 256, (byte + 37) % 256, (byte + 101) % 256]
        out = run_ptx(E4M3_TO_F16_PTX.value, {"$2": sum(b << 8 * i for i, b in enumerate(packed))})
        halves = [out["$0"] & 0xFFFF, out["$0"] >> 16, out["$1"] & 0xFFFF, out["$1"] >> 16]
        for place, (b, bits) in enumerate(zip(packed, halves)):
            if b & 0x7F != 0x7F:  # NaN is never stored
                assert bits == expected[b], (byte, place)


@pytest.mark.parametrize(
    "dtype, in_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (FP8, torch.float32), (FP8, torch.bfloat16)],
)
def test_kv_write_equals_reference(dtype, in_dtype):
    """Bit-identical caches from the Triton and torch writes of K/V sliced out of a fused projection,
    also for a block longer than the ring (only its newest `capacity` positions are kept)."""
    gen = torch.Generator().manual_seed(1)
    ours, theirs = Cache(12, 2, 32, dtype), Cache(12, 2, 32, dtype)
    for start, t in ((0, 5), (5, 9), (14, 16)):
        fused = (torch.randn(t, 3, 2, 32, generator=gen) * 4).to(in_dtype)
        k, v = fused[:, 1], fused[:, 2]
        ours.write(k, v, start)
        theirs.write(k, v, start, triton=False)
        assert same_bytes(ours, theirs)


# ----------------------------------------------------------------------------- decode / verify

SCENARIOS = {  # (dtype, Hq, Hkv, D, window, split): full layers (4:2) and wrapping rings (4:1)
    "full-fp32": (torch.float32, 4, 2, 64, None, 32),
    "full-fp8": (FP8, 4, 2, 64, None, 32),
    "ring-fp32": (torch.float32, 4, 1, 16, 8, 64),
    "ring-fp8": (FP8, 4, 1, 16, 8, 64),
    "full-fp8-d256": (FP8, 4, 2, 256, None, 64),  # the real heads' fp8 chunks: 64 keys
    "full-fp8-d512": (FP8, 4, 2, 512, None, 64),
    "full-fp32-one-split": (torch.float32, 4, 2, 32, None, None),
    "ring-fp8-one-split": (FP8, 4, 1, 16, 8, None),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_decode_matches_reference_and_is_batch_invariant(name):
    """A verify block of 16 (queries 60..75) and one of 5 after a history written in pieces: close to
    the reference, and the queries at 60, 64 and 75 bit-identical to plain decoding at their position
    (start = p, cache written only up to p). Full layers with D=64 read 16-key chunks, as the real
    heads do, over splits of 32: the block straddles the split boundary at 64. Rings (capacity 24,
    window 8) wrap; with D=16 they read 64-key chunks, and over splits of 64 the probes' windows lie
    before, across and after the boundary at 64. The default split is one split at this context: the
    split kernel writes the output itself (no combine), over two 64-key chunks for the full layer.
    fp8 at the real head dims reads 64-key chunks over splits of one chunk."""
    dtype, hq, hkv, d, window, split = SCENARIOS[name]
    start = 60
    probes = (start, start + 4, start + 15)
    gen = torch.Generator().manual_seed(2)
    end = start + 16
    k = torch.randn(end, hkv, d, generator=gen) * 2
    v = torch.randn(end, hkv, d, generator=gen)
    q = torch.randn(end, hq, d, generator=gen)
    cache = Cache(MAX_CONTEXT if window is None else window + SLACK, hkv, d, dtype)
    for lo in range(0, start, 16):
        cache.write(k[lo : min(lo + 16, start)], v[lo : min(lo + 16, start)], lo, triton=False)
    history = cache.clone()

    cache.write(k[start:end], v[start:end], start)
    block = cache.attend(q[start:end], start, window, split)
    tol = 1e-5 if dtype == torch.float32 else 1e-4  # fp8: the same dequantized keys, scale folded differently
    torch.testing.assert_close(block, reference(cache, q[start:end], start, window), atol=tol, rtol=tol)
    short = cache.attend(q[start + 3 : start + 8], start + 3, window, split)
    assert torch.equal(short, block[3:8])

    for p in probes:
        alone = history.clone()
        alone.write(k[start : p + 1], v[start : p + 1], start)
        out = alone.attend(q[p : p + 1], p, window, split)
        assert torch.equal(out[0], block[p - start]), f"query at {p} differs from its verify-block row"


@pytest.mark.parametrize("name", [name for name in SCENARIOS if "one-split" not in name])
def test_the_split_kernel_combines_as_the_combine_kernel_does(name, monkeypatch):
    """With few splits the last split program of a row block combines the partials (one launch);
    with COMBINE_IN_SPLIT 0 the combine kernel does: the same bits, for a verify block and one query."""
    from flashdesk.kernels import attention_triton
    from flashdesk.kernels.launch_log import count_kernels

    dtype, hq, hkv, d, window, split = SCENARIOS[name]
    gen = torch.Generator().manual_seed(4)
    start, end = 60, 76
    k, v = torch.randn(end, hkv, d, generator=gen) * 2, torch.randn(end, hkv, d, generator=gen)
    q = torch.randn(end, hq, d, generator=gen)
    cache = Cache(MAX_CONTEXT if window is None else window + SLACK, hkv, d, dtype)
    cache.write(k, v, 0, triton=False)
    outputs, launches = {}, {}
    for bound in (attention_triton.COMBINE_IN_SPLIT, 0):
        monkeypatch.setattr(attention_triton, "COMBINE_IN_SPLIT", bound)
        outputs[bound] = [cache.attend(q[start:end], start, window, split), cache.attend(q[70:71], 70, window, split)]
        with count_kernels() as counts:
            cache.attend(q[start:end], start, window, split)
        launches[bound] = {name: n for name, n in counts.items() if not name.startswith("aten.")}
    fused, separate = outputs.values()
    assert all(torch.equal(a, b) for a, b in zip(fused, separate))
    assert list(launches.values()) == [
        {"_decode_split_kernel": 1},
        {"_decode_split_kernel": 1, "_decode_combine_kernel": 1},
    ]


def test_a_program_that_takes_several_splits_is_still_batch_invariant(monkeypatch):
    """At most MAX_SPLITS split programs: past that, program j reduces every split s with
    s % P == j. With 3 programs over splits of 16 the verify block 60..75 touches splits 0..4
    (programs 0 and 1 take two each): still the reference, and each probe alone gives its row's bits."""
    from flashdesk.kernels import attention_triton

    monkeypatch.setattr(attention_triton, "MAX_SPLITS", 3)
    gen = torch.Generator().manual_seed(5)
    start, end = 60, 76
    k, v = torch.randn(end, 2, 64, generator=gen) * 2, torch.randn(end, 2, 64, generator=gen)
    q = torch.randn(end, 4, 64, generator=gen)
    cache = Cache(MAX_CONTEXT, 2, 64, FP8)
    cache.write(k[:start], v[:start], 0, triton=False)
    history = cache.clone()
    cache.write(k[start:end], v[start:end], start)
    block = cache.attend(q[start:end], start, None, 16)
    torch.testing.assert_close(block, reference(cache, q[start:end], start, None), atol=1e-4, rtol=1e-4)
    for p in (start, start + 4, start + 15):
        alone = history.clone()
        alone.write(k[start : p + 1], v[start : p + 1], start)
        assert torch.equal(alone.attend(q[p : p + 1], p, None, 16)[0], block[p - start])


def test_the_work_follows_the_length_not_the_capacity():
    """Splits are SPLIT positions whatever the cache holds: a block over the same keys gives the
    same bits in a cache of 512 positions and in one of 4096 (8 split programs or 16)."""
    gen = torch.Generator().manual_seed(6)
    start, end = 300, 316
    k, v = torch.randn(end, 2, 64, generator=gen), torch.randn(end, 2, 64, generator=gen)
    q = torch.randn(16, 4, 64, generator=gen)
    outs = []
    for capacity in (512, 4096):
        cache = Cache(capacity, 2, 64, FP8)
        cache.write(k, v, 0, triton=False)
        outs.append(
            decode_attention(
                q,
                cache.k,
                cache.v,
                cache.k_scale,
                cache.v_scale,
                torch.tensor([start], dtype=torch.int32),
                None,
                capacity,
                SCALE,
                capacity,
            )
        )
    assert torch.equal(outs[0], outs[1])


def test_decode_bf16_cache_default_split():
    """bf16 queries over a bf16 cache with the default split: close to the reference."""
    gen = torch.Generator().manual_seed(3)
    cache = Cache(MAX_CONTEXT, 2, 16, torch.bfloat16)
    k, v = torch.randn(40, 2, 16, generator=gen).bfloat16(), torch.randn(40, 2, 16, generator=gen).bfloat16()
    cache.write(k, v, 0)
    q = torch.randn(3, 4, 16, generator=gen).bfloat16()
    out = decode_attention(q, cache.k, cache.v, None, None, 37, None, MAX_CONTEXT, SCALE, MAX_CONTEXT)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference(cache, q, 37, None), atol=2e-2, rtol=2e-2)


# ----------------------------------------------------------------------------- prefill


@pytest.mark.parametrize(
    "causal, window, hkv, d", [(True, None, 2, 32), (True, 8, 1, 16), (False, None, 2, 16), (False, 8, 1, 32)]
)
def test_prefill_matches_reference(causal, window, hkv, d):
    """Queries in two tiles over keys whose positions have gaps; GQA 4:2 and 4:1."""
    gen = torch.Generator().manual_seed(4)
    k_pos = torch.cumsum(torch.randint(1, 3, (70,), generator=gen), 0)  # increasing, with gaps
    q_pos = k_pos[-40:] if causal else torch.arange(int(k_pos[-1]) - 45, int(k_pos[-1]) - 5, dtype=torch.int64)
    q = torch.randn(40, 4, d, generator=gen)
    k, v = torch.randn(70, hkv, d, generator=gen), torch.randn(70, hkv, d, generator=gen)
    out = prefill_attention(q, k, v, q_pos, k_pos, window, SCALE, causal)
    ref = attention_reference(q, k, v, q_pos, k_pos, window, SCALE, causal)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d", [32, 512])
def test_prefill_reads_an_fp8_cache_where_it_is_stored(d):
    """A full layer's prompt chunk over its fp8 cache: the kernel converts the stored bytes and
    their scales as it reads them (no dequantized copy), and gives what the reference gives over
    the dequantized keys; the dispatcher's torch path dequantizes first, to the same result. D=512
    is the real full layer's head."""
    from flashdesk.kernels.attention import attention

    gen = torch.Generator().manual_seed(6)
    cache = Cache(90, 2, d, FP8)
    k, v = torch.randn(90, 2, d, generator=gen) * 3, torch.randn(90, 2, d, generator=gen)
    cache.write(k, v, 0, triton=False)
    q = torch.randn(40, 4, d, generator=gen)
    q_pos, k_pos = torch.arange(50, 90), torch.arange(90)
    keys, values = cache.read(k_pos)
    expected = attention_reference(q, keys, values, q_pos, k_pos, None, SCALE)
    got = prefill_attention(
        q, cache.k, cache.v, q_pos, k_pos, None, SCALE, k_scale=cache.k_scale, v_scale=cache.v_scale
    )
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)  # the scales fold in another order
    with kernels("torch"):
        torch.testing.assert_close(
            attention(q, cache.k, cache.v, q_pos, k_pos, None, SCALE, k_scale=cache.k_scale, v_scale=cache.v_scale),
            expected,
            atol=1e-5,
            rtol=1e-5,
        )


def test_prefill_strided_bf16_queries():
    """Queries sliced out of a fused projection (row stride > Hq * D), bf16 in and out."""
    gen = torch.Generator().manual_seed(5)
    fused = torch.randn(20, 3 * 4 * 16, generator=gen).bfloat16()
    q = fused[:, :64].view(20, 4, 16)
    k, v = torch.randn(20, 2, 16, generator=gen).bfloat16(), torch.randn(20, 2, 16, generator=gen).bfloat16()
    pos = torch.arange(20)
    out = prefill_attention(q, k, v, pos, pos, None, SCALE)
    ref = attention_reference(q.float(), k.float(), v.float(), pos, pos, None, SCALE)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_a_decode_tile_takes_the_longest_block():
    from flashdesk.kernels.attention import DECODE_QUERIES
    from flashdesk.kernels.attention_triton import BLOCK_T

    assert BLOCK_T == DECODE_QUERIES


def test_compile_specs_name_every_argument():
    for spec in compile_specs() + kv_write_specs():
        assert list(spec.signature) == [n for n in spec.fn.arg_names if n != "PDL"], spec.name  # PDL: by arch
        assert all(spec.signature[name] == "constexpr" for name in spec.constexprs), spec.name


@pytest.mark.parametrize("start", [0, 20])
def test_bidirectional_decode_sees_the_whole_block(start):
    """The drafter's full layers: every query of the block sees the context and the whole block."""
    gen = torch.Generator().manual_seed(5)
    cap, t = 40, 6
    ck, cv = torch.randn(cap, 2, 16, generator=gen), torch.randn(cap, 2, 16, generator=gen)
    q = torch.randn(t, 4, 16, generator=gen)
    got = decode_attention(q, ck, cv, None, None, start, None, cap, 0.25, cap, causal=False)
    positions = torch.arange(start, start + t)
    expected = attention_reference(
        q, ck[: start + t], cv[: start + t], positions, torch.arange(start + t), None, 0.25, causal=False
    )
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
