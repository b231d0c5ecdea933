"""One table of the real models (engine/model/known_models.py): the kernels' compile specs and
self-tests, which may not import the engine, carry the same shapes as constants; this holds them
equal, so a change to the table cannot leave the compiled kernels behind."""

from flashdesk.engine.model import known_models
from flashdesk.engine.model.config import parse_config, parse_draft_config
from flashdesk.kernels import attention_triton, linear_triton, moe_triton, self_test


def test_the_kernels_compile_the_real_models_shapes():
    cfg = parse_config(known_models.target_raw())
    draft = parse_draft_config(known_models.draft_raw())
    sliding = next(layer for layer in cfg.layers if layer.sliding)
    full = next(layer for layer in cfg.layers if not layer.sliding)
    d = cfg.hidden_size
    assert linear_triton.HIDDEN == moe_triton.REAL_D == self_test.REAL.hidden == d
    assert (moe_triton.REAL_I, moe_triton.REAL_TOP_K, moe_triton.REAL_EXPERTS) == (
        cfg.moe_intermediate_size,
        cfg.top_k_experts,
        cfg.num_experts,
    )
    assert moe_triton.REAL_GROUP == self_test.REAL.group == known_models.INT4_GROUP
    assert (
        attention_triton.TARGET_LAYERS
        == self_test.REAL.layers
        == ((sliding.head_dim, sliding.num_kv_heads, cfg.sliding_window), (full.head_dim, full.num_kv_heads, None))
    )
    # every int4 linear of the target and the drafter, as (out, in)
    q = cfg.num_heads
    target = {
        (q * sliding.head_dim + 2 * sliding.num_kv_heads * sliding.head_dim, d),
        (q * full.head_dim + full.num_kv_heads * full.head_dim, d),  # K = V: no v_proj
        (d, q * sliding.head_dim),
        (d, q * full.head_dim),
        (2 * cfg.intermediate_size, d),
        (d, cfg.intermediate_size),
    }
    assert target <= set(linear_triton.TARGET_INT4)
    drafter = {
        (d, len(draft.target_layer_ids) * d),
        (draft.num_heads * draft.head_dim + 2 * draft.num_kv_heads * draft.head_dim, d),
        (d, draft.num_heads * draft.head_dim),
        (2 * draft.intermediate_size, d),
        (d, draft.intermediate_size),
    }
    assert drafter <= set(linear_triton.DRAFTER)
    assert (cfg.vocab_size, d) in linear_triton.DENSE  # the tied head


def test_a_swap_is_seen_by_every_reader():
    small = dict(known_models.REAL_TARGET, hidden_size=64)
    with known_models.shapes(small, known_models.REAL_DRAFTER):
        assert known_models.target_raw()["hidden_size"] == 64
    assert known_models.target_raw()["hidden_size"] == 2816
