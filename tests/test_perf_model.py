"""The performance model (kernels/perf_model.py, kernels/sass.py, engine/bench/step_launches.py).

Its inputs are checked against what can be counted by hand: a SASS loop's instructions and load
widths, occupancy from the CUDA occupancy rules, Little's law, and a step's bytes against
engine/bench/step_bytes (which counts them from the model's tensors, not from launches)."""

from dataclasses import replace

import pytest
import torch

from flashdesk.kernels import perf_model, sass

SASS = """
        Function : _toy_kernel
        /*0000*/                   LDC R1, c[0x0][0x28] ;                     /* 0x00000a00ff017b82 */
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;           /* 0x0000000402047981 */
        /*0020*/                   LDGSTS.E.BYPASS.128 [R7], desc[UR4][R8.64] ;  /* 0x0000000408077fae */
        /*0030*/               @P0 LDGSTS.E.64 [R7+0x10], desc[UR4][R8.64] ;  /* 0x0000000408077fae */
        /*0040*/                   LDG.E.U8 R9, desc[UR4][R10.64] ;           /* 0x000000040a097981 */
        /*0050*/                   HMMA.16816.F32.BF16 R12, R4, R8, R12 ;     /* 0x000000080c0c723c */
        /*0060*/              @!P1 BRA 0x20 ;                                 /* 0xffffff9800749947 */
        /*0070*/                   LDG.E R2, desc[UR4][R2.64] ;               /* 0x0000000402027981 */
        /*0080*/              @!P2 BRA 0x70 ;                                 /* 0xffffff9800749947 */
        /*0090*/                   EXIT ;                                     /* 0x000000000000794d */
        /*00a0*/                   BRA 0xa0;                                  /* 0xfffffffc00fc7947 */
"""


def test_the_main_loop_is_the_backward_branch_that_loads_the_most():
    loop = sass.main_loop(SASS)
    # 0x20..0x60: five instructions; loads of 16 + 8 + 1 bytes a lane, async copies among them
    assert loop == sass.Loop(instructions=5, load_bytes=(16 + 8 + 1) * 32, async_copies=True, is_loop=True)
    straight = "\n".join(line for line in SASS.splitlines() if "BRA 0x20" not in line and "BRA 0x70" not in line)
    whole = sass.main_loop(straight)  # no loop: the whole body, the trailing self-branch left out
    assert not whole.is_loop and whole.instructions == 8 and whole.load_bytes == (16 + 16 + 8 + 1 + 4) * 32
    with pytest.raises(ValueError, match="no SASS instruction"):
        sass.main_loop("not sass")


def test_a_loop_that_walks_a_constant_table_is_not_the_main_loop():
    """libdevice's cos and sin reduce a large angle in a loop over a read-only table (LDG.CONSTANT):
    a slow path that streams nothing, so the kernel is costed as its straight-line body."""
    table = SASS.replace("BRA 0x20", "BRA 0x90").replace("LDG.E R2,", "LDG.E.CONSTANT R2,")
    whole = sass.main_loop(table)
    assert not whole.is_loop and whole.instructions == 10
    assert sass.main_loop(SASS.replace("BRA 0x20", "BRA 0x90")).is_loop  # a plain load's loop streams


def test_occupancy_follows_registers_shared_memory_and_warps():
    h200, rtx4090 = perf_model.CARDS["h200"], perf_model.CARDS["rtx4090"]
    # 160 registers x 32 lanes = 5120 a warp; 65536 / 5120 = 12 warps = one block of 8
    assert perf_model.blocks_per_sm(h200, 160, 50944, 8) == 1
    # 96 registers: 21 warps by registers -> 5 blocks of 4; shared 2 KB is no limit
    assert perf_model.blocks_per_sm(h200, 96, 2048, 4) == 5
    # shared memory: 100 KB per SM on an RTX 4090 holds one block of 82 KB (+1 KB reserved)
    assert perf_model.blocks_per_sm(rtx4090, 64, 83456, 4) == 1
    # warps: 48 a SM on the 4090 -> six 8-warp blocks of few registers; 64 on the H200 -> eight
    assert perf_model.blocks_per_sm(rtx4090, 32, 0, 8) == 6
    assert perf_model.blocks_per_sm(h200, 32, 0, 8) == 8


def test_a_launch_is_bound_by_bytes_in_flight_or_by_issue():
    card = perf_model.CARDS["h200"]
    row = {
        "blocks_per_sm": 1,
        "bytes_in_flight_per_block": 16384,
        "loop_load_bytes": 16384,
        "loop_instructions": 400,
        "num_warps": 8,
    }
    one_program = {"programs": 1, "bytes": 16384 * 100}
    # Little's law: 16 KB in flight over 0.7 us -> 23.4 GB/s; issue: 100 passes x 400 x 8 / (4 x 1.98 GHz)
    memory = 16384 * 100 / (16384 / card.latency_s)
    issue = 100 * 400 * 8 / (4 * card.clock_hz)
    expected = card.latency_s + max(memory, issue) + card.launch_gap_s
    assert perf_model.launch_seconds(card, one_program, row) == pytest.approx(expected)
    # many programs: the card's streaming efficiency caps the bandwidth
    wide = {"programs": 132 * 64, "bytes": 1 << 30}
    streaming = (1 << 30) / (card.efficiency * card.bandwidth)
    assert perf_model.launch_seconds(card, wide, row) >= streaming + card.latency_s
    # no compiled row (a torch op): streams at the card's efficiency
    assert perf_model.launch_seconds(card, {"programs": 1, "bytes": 0}, None) == pytest.approx(
        card.latency_s + card.launch_gap_s
    )


def test_a_kernel_released_early_pays_the_shorter_gap():
    """Programmatic dependent launch: a launch with its option, compiled with its wait (an sm_90+
    row), after a kernel that released it at entry, pays pdl_gap_s; after a torch op (which releases
    nothing early), or compiled without the wait (sm_89), the full gap."""
    card = perf_model.CARDS["h200"]
    row = {
        "blocks_per_sm": 4,
        "bytes_in_flight_per_block": 8192,
        "loop_load_bytes": 8192,
        "loop_instructions": 100,
        "num_warps": 4,
    }
    launch = {"key": "k", "programs": 132, "bytes": 10**6, "read_bytes": 10**6, "count": 1, "pdl": True}
    torch_op = {"key": None, "programs": 1, "bytes": 0, "read_bytes": 0, "count": 1}
    plain = perf_model.launch_seconds(card, launch, row)
    released = perf_model.launch_seconds(card, launch, row | {"pdl": True}, released=True)
    assert plain - released == pytest.approx(card.launch_gap_s - card.pdl_gap_s) and card.pdl_gap_s < card.launch_gap_s
    assert perf_model.launch_seconds(card, launch, row, released=True) == plain  # compiled without the wait
    first = perf_model.model_step(card, [torch_op, launch, launch], {"k": row | {"pdl": True}})
    assert first["modeled_seconds"] == pytest.approx(perf_model.launch_seconds(card, torch_op, None) + plain + released)


def test_a_kernel_that_prefetched_before_its_wait_pays_an_l2_hit_not_a_dram_latency():
    """Released early, a kernel that asked L2 for its first reads before waiting (row "prefetch")
    finds them there: it pays l2_latency_s. Without the early release the prefetch overlaps
    nothing and it pays the DRAM latency."""
    card = perf_model.CARDS["h200"]
    row = {"blocks_per_sm": 4, "bytes_in_flight_per_block": 8192, "loop_load_bytes": 8192}
    row |= {"loop_instructions": 100, "num_warps": 4, "pdl": True}
    launch = {"key": "k", "programs": 132, "bytes": 10**6, "read_bytes": 10**6, "count": 1, "pdl": True}
    waits = perf_model.launch_seconds(card, launch, row, released=True)
    prefetched = perf_model.launch_seconds(card, launch, row | {"prefetch": True}, released=True)
    assert card.l2_latency_s < card.latency_s
    assert waits - prefetched == pytest.approx(card.latency_s - card.l2_latency_s)
    alone = perf_model.launch_seconds(card, launch, row | {"prefetch": True}, released=False)
    assert alone == perf_model.launch_seconds(card, launch, row, released=False)
    # only some programs could ask (a dense MLP chunk's, not an expert's): the others wait on DRAM
    some = launch | {"prefetch_bytes": launch["read_bytes"] // 4, "prefetch_some": True}
    no_window = replace(card, pdl_gap_s=0.0)
    assert perf_model.launch_seconds(no_window, some, row | {"prefetch": True}, released=True) == pytest.approx(
        perf_model.launch_seconds(no_window, launch, row, released=True)
    )


def test_a_fused_kernels_tail_is_charged_what_its_own_kernel_issues_serially():
    """A chain that a fused kernel's last program runs after the others (launch "tail": the key
    of the standalone kernel with the same code) adds, per pass, that kernel's instructions issued
    on one SM plus an L2 hit's latency; a tail with no compiled row counts as unmatched."""
    card = perf_model.CARDS["h200"]
    row = {"blocks_per_sm": 2, "bytes_in_flight_per_block": 8192, "loop_load_bytes": 8192}
    row |= {"loop_instructions": 100, "num_warps": 8}
    chain = {"blocks_per_sm": 1, "bytes_in_flight_per_block": 0, "loop_load_bytes": 0}
    chain |= {"loop_instructions": 1000, "num_warps": 8}
    launch = {"key": "k", "programs": 264, "bytes": 10**6, "read_bytes": 10**6, "count": 1}
    fused = launch | {"tail": "t", "tail_passes": 2}
    one_pass = card.l2_latency_s + 1000 * 8 / (perf_model.ISSUE_PER_CLOCK * card.clock_hz)
    plain = perf_model.launch_seconds(card, launch, row)
    assert perf_model.launch_seconds(card, fused, row, tail=chain) == pytest.approx(plain + 2 * one_pass)
    step = perf_model.model_step(card, [fused], {"k": row, "t": chain})
    assert step["modeled_seconds"] == pytest.approx(plain + 2 * one_pass) and step["unmatched_launches"] == 0
    assert perf_model.model_step(card, [fused], {"k": row})["unmatched_launches"] == 1


def test_what_a_kernel_fetched_while_a_one_program_chain_ran_streams_from_l2():
    """A kernel released early after a one-program kernel (DRAM idle while that one issues) finds
    in L2 what its resident programs asked for before their wait (launch "prefetch_bytes"), up to
    what DRAM delivers in that time and the gap: those bytes stream at L2's rate. Programs not yet
    resident have asked for nothing; a kernel after a many-program one finds nothing early."""
    card = perf_model.CARDS["h200"]
    chain_row = {"blocks_per_sm": 1, "bytes_in_flight_per_block": 10**5, "loop_load_bytes": 10**5}
    chain_row |= {"loop_instructions": 2000, "num_warps": 8, "pdl": True}
    chain = {"key": "c", "programs": 1, "bytes": 10**5, "read_bytes": 0, "count": 1, "pdl": True}
    row = {"blocks_per_sm": 2, "bytes_in_flight_per_block": 2**16, "loop_load_bytes": 2**16}
    row |= {"loop_instructions": 100, "num_warps": 8, "pdl": True, "prefetch": True}
    programs = 2 * 131 * 2  # twice what is resident beside the chain's SM
    launch = {"key": "k", "programs": programs, "bytes": 10**7, "read_bytes": 10**7, "count": 1, "pdl": True}
    rows = {"c": chain_row, "k": row}
    idle = perf_model.idle_seconds(card, chain, chain_row, None)
    assert idle == pytest.approx(2000 * 8 / (perf_model.ISSUE_PER_CLOCK * card.clock_hz))
    cold = perf_model.launch_seconds(card, launch, row, released=True)
    asked = launch | {"prefetch_bytes": 10**7}
    warm = perf_model.early_bytes(card, asked, row, True, idle)
    window = (idle + card.pdl_gap_s) * card.efficiency * card.bandwidth
    assert warm == pytest.approx(min(10**7 / 2, window))
    first = asked | {"prefetch_programs": 131 * 2}  # only the grid's first programs ask: all resident
    assert perf_model.early_bytes(card, first, row, True, idle) == pytest.approx(min(10**7, window))
    assert min(10**7, window) > warm
    rate = card.efficiency * card.bandwidth
    assert perf_model.launch_seconds(card, asked, row, True, None, idle) == pytest.approx(
        cold - warm / rate + warm / card.l2_bandwidth
    )
    step = perf_model.model_step(card, [chain, asked], rows)["modeled_seconds"]
    after = perf_model.launch_seconds(card, asked, row, True, None, idle)
    assert step == pytest.approx(perf_model.launch_seconds(card, chain, chain_row) + after)
    many = chain | {"programs": 132}  # DRAM is busy with its programs' loads: nothing early
    assert perf_model.idle_seconds(card, many, chain_row, None) == 0.0
    assert perf_model.early_bytes(card, asked, row, False, idle) == 0.0  # not released early: nothing


def test_a_step_model_counts_launches_bytes_and_unmatched_kernels():
    card = perf_model.CARDS["rtx4090"]
    launches = [
        {"key": "a", "programs": 128, "bytes": 10**6, "read_bytes": 10**6, "count": 25},
        {"key": "missing", "programs": 1, "bytes": 100, "read_bytes": 0, "count": 5},
        {"key": None, "programs": 1, "bytes": 10, "read_bytes": 10, "count": 1},
    ]
    row = {
        "blocks_per_sm": 2,
        "bytes_in_flight_per_block": 8192,
        "loop_load_bytes": 8192,
        "loop_instructions": 100,
        "num_warps": 4,
    }
    step = perf_model.model_step(card, launches, {"a": row})
    assert step["launches"] == 31 and step["unmatched_launches"] == 5
    assert step["bytes"] == 25 * 10**6 + 10
    assert step["floor_seconds"] == pytest.approx(step["bytes"] / card.bandwidth)
    assert step["modeled_seconds"] > step["floor_seconds"] and 0 < step["floor_fraction"] < 1


def test_the_expected_expert_union_of_a_block():
    from flashdesk.engine.bench.step_launches import expected_union

    assert expected_union(128, 8, 1) == pytest.approx(8)
    assert expected_union(128, 8, 16) == pytest.approx(82.4, abs=0.1)


@pytest.mark.parametrize("step", ["ar", "verify-16"])
def test_a_recorded_step_reads_what_step_bytes_counts(step):
    """The launch list's weight and KV bytes (from each launch's tensor arguments) against
    step_bytes.target_step_bytes (from the model's tensors), at the real shapes (two layers,
    fp8 KV at 4096 of 8192 positions). The experts: step_bytes takes the hit count, the launch
    list the expected union; both given 8 (ar) or the same union (verify)."""
    pytest.importorskip("triton")
    from flashdesk.engine.bench.step_bytes import target_step_bytes
    from flashdesk.engine.bench.step_launches import expected_union, record_step
    from flashdesk.engine.bench.synthetic_model import synthetic_pair

    model, drafter = synthetic_pair(2, "cpu", torch.bfloat16)
    cache, ctx = model.new_cache(8192, "fp8"), drafter.new_context(8192)
    cache.place(4096, 4096)
    ctx.place(4096, 4096)
    launches = record_step(model, drafter, cache, ctx, step, real_layers=False)
    rows = 1 if step == "ar" else 16
    union = expected_union(128, 8, rows)
    counted = target_step_bytes(model, "fp8", 4096, rows, rows, {0: union, 1: union})
    read = sum(launch["read_bytes"] for launch in launches)
    assert read == pytest.approx(counted.total, rel=0.01)
    assert all(launch["count"] == 1 for launch in launches)
    # every Triton launch takes programmatic dependent launch's option, as on an sm_90 card
    assert [launch["function"] for launch in launches if launch["key"] and not launch["pdl"]] == []
    assert any(launch["function"] == "_decode_split_kernel" and launch["read_bytes"] for launch in launches)
