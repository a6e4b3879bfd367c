"""Attention-level methods (ReRoPE, leaky ReRoPE, Self-Extend, Dual Chunk Attention, STRING, log-n) against
an independent dense float64 reference written here from the papers' definitions; identity inside
the window; KV-cache decoding vs full forwards; padding; patch/unpatch; no leak."""

import dataclasses
import math

import pytest
import torch
from conftest import TRAINED, tiny_model
from transformers import AttentionInterface

import hf_posext

pytestmark = pytest.mark.usefixtures("one_thread")

# (method, knobs) small enough that 192 tokens cross every region of each map
CASES = [
    ("rerope", {"window": 16, "logn": False}),
    ("rerope", {"window": 16}),                                   # authors' default: log-n on
    ("leaky_rerope", {"window": 24, "leak": 4.0}),
    ("self_extend", {"window": 16, "group_size": 4}),
    ("self_extend", {"window": 20, "group_size": 3, "logn": True}),  # W not a multiple of G
    ("dual_chunk", {"chunk_size": 48, "local_window": 8}),
    ("dual_chunk", {"chunk_size": 40, "local_window": 0}),
    ("string", {"shifted_offset": 21, "local_value": 5}),         # the authors' 0.33·L
    ("string", {"shifted_offset": 16, "local_value": 0, "logn": True}),
    ("logn", {}),
]


def factor(method, s=3.0):
    """The factor these tests patch with. STRING's factor only declares a target, and a target
    past L + S − W is refused (units.string_reach); these tests still run 3L tokens through its
    kernel (the math holds at any length), without declaring one."""
    return None if method == "string" else s


def relative(method, knobs, i, j):
    """r(i, j) straight from each paper's definition (float64), Δ = i − j >= 0."""
    d = i - j
    if method == "rerope":                 # Su 2023: min(Δ, w)
        w = knobs["window"]
        return torch.where(d < w, d, torch.full_like(d, w))
    if method == "leaky_rerope":           # Δ < w exact, else w + (Δ − w)/k
        w, k = knobs["window"], knobs["leak"]
        return torch.where(d < w, d, w + (d - w) / k)
    if method == "self_extend":            # Jin et al. 2024: ⌊i/G⌋ − ⌊j/G⌋ + W − W/G beyond W
        W, G = knobs["window"], knobs["group_size"]
        return torch.where(d < W, d, torch.floor(i / G) - torch.floor(j / G) + W - W / G)
    if method == "dual_chunk":             # An et al. 2024, chunks of c = s − l
        s, lw = knobs["chunk_size"], knobs["local_window"]
        c = s - lw
        ci, cj = torch.floor(i / c), torch.floor(j / c)
        pi, pj = i - ci * c, j - cj * c
        succ = torch.clamp(pi + c, max=s)
        return torch.where(ci == cj, pi - pj, torch.where(ci == cj + 1, succ, min(2 * c - 1, s)) - pj)
    if method == "string":                 # An et al. 2024: d < S kept, else d − S + W
        S, W = knobs["shifted_offset"], knobs["local_value"]
        return torch.where(d < S, d, d - S + W)
    return d                               # logn: plain RoPE


def dense_reference(method, knobs, theta):
    """An attention function: un-rotate q, k, score q·R(r(i,j))·k in float64 for every pair."""
    logn = knobs.get("logn", method in ("rerope", "leaky_rerope", "logn"))

    def fn(module, q, k, v, mask, scaling=None, **_):
        B, H, Q, D = q.shape
        K = k.shape[2]
        q, k, v = q.double(), k.double(), v.double()
        k, v = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))
        inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        i = torch.arange(K - Q, K, dtype=torch.float64)
        j = torch.arange(K, dtype=torch.float64)

        def rot(x, pos):  # rotate_half convention, angle pos·inv
            ang = pos[..., None] * inv
            cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
            return x * cos + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * sin

        q0, k0 = rot(q, -i), rot(k, -j)                       # raw (un-rotated) vectors
        if logn:
            q0 = q0 * torch.clamp(torch.log(i + 1) / math.log(TRAINED), min=1)[:, None]
        r = relative(method, knobs, i[:, None], j[None, :])  # [Q, K]
        qr = rot(q0[:, :, :, None, :], r)                    # [B, H, Q, K, D]: q at r, k at 0
        s = (qr * k0[:, :, None]).sum(-1) * (D ** -0.5)
        s = s.masked_fill(j[None, :] > i[:, None], float("-inf"))
        if mask is not None:
            s = s.masked_fill(~mask[..., -Q:, :K].bool(), float("-inf"))
        out = torch.softmax(s, -1) @ v
        return out.transpose(1, 2).to(torch.float32).contiguous(), None
    return fn


def logits(model, tokens, **kw):
    with torch.no_grad():
        return model(tokens, **kw).logits


@pytest.mark.parametrize("method,knobs", CASES)
def test_against_dense_reference(arch, tokens, method, knobs):
    model = tiny_model(arch, attn_implementation="sdpa")
    hf_posext.patch(model, method, factor(method), **knobs)
    got = logits(model, tokens)
    name = f"test_dense_{method}"
    AttentionInterface.register(name, dense_reference(method, knobs, model.config.rope_theta
                                                      if hasattr(model.config, "rope_theta") else 1e4))
    model.config._attn_implementation = name
    want = logits(model, tokens)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got[:, TRAINED:] - logits(tiny_model(arch), tokens)[:, TRAINED:]).abs().max() > 1e-4


@pytest.mark.parametrize("method,knobs,inside", [
    ("rerope", {"window": TRAINED, "logn": False}, TRAINED),
    ("rerope", {"window": TRAINED}, TRAINED),             # log-n is 1 up to L
    ("leaky_rerope", {"window": 32, "logn": False}, 32),
    ("self_extend", {}, TRAINED),                         # W = 1024 > L: everything is near
    ("dual_chunk", {"chunk_size": 48, "local_window": 8}, 40),
    ("string", {"shifted_offset": 21, "local_value": 5}, 21),
    ("string", {"shifted_offset": 21, "local_value": 21}, 3 * TRAINED),   # W = S: d − S + W = d
    ("logn", {}, TRAINED),
])
def test_inside_window_equals_unpatched(arch, tokens, method, knobs, inside):
    if method == "self_extend":
        knobs = {"window": TRAINED, "group_size": 8}
    model = tiny_model(arch, attn_implementation="sdpa")
    ref = logits(model, tokens[:, :inside])
    hf_posext.patch(model, method, **knobs)
    torch.testing.assert_close(logits(model, tokens[:, :inside]), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method,knobs", CASES)
def test_cached_decoding_matches_full_forward(arch, tokens, method, knobs):
    model = hf_posext.patch(tiny_model(arch, attn_implementation="sdpa"), method, factor(method), **knobs)
    ids = tokens[:1]
    full = logits(model, ids)
    with torch.no_grad():
        out = model(ids[:, :100], use_cache=True)
        steps, cache = [out.logits[:, -1]], out.past_key_values
        for t in range(100, 150):
            out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits[:, -1])
            cache = out.past_key_values
        out = model(ids[:, 150:], past_key_values=cache, use_cache=True)  # a multi-token step
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 99:150], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.logits, full[:, 150:], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["rerope", "leaky_rerope"])
def test_left_padding_matches_unpadded_rows(arch, tokens, method):
    """Relative maps: a left-padded row scores as the same row alone (padding masked)."""
    model = hf_posext.patch(tiny_model(arch, attn_implementation="sdpa"), method, window=16, logn=False)
    short = tokens[1, 40:]
    batch = torch.stack([tokens[0], torch.cat([torch.zeros(40, dtype=torch.long), short])])
    mask = torch.ones_like(batch)
    mask[1, :40] = 0
    padded = logits(model, batch, attention_mask=mask)
    torch.testing.assert_close(padded[1, 40:], logits(model, short[None])[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(padded[0], logits(model, tokens[:1])[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method,knobs", CASES)
def test_left_padding_positioned_from_the_first_token_matches_the_row_alone(arch, tokens, method, knobs):
    """As `generate` pads a batch: position_ids = cumsum(mask) − 1, so a padded row's tokens sit
    at 0.. exactly as when the row runs alone; every method (absolute maps too) must agree."""
    model = hf_posext.patch(tiny_model(arch, attn_implementation="sdpa"), method, factor(method), **knobs)
    short = tokens[1, 42:]                  # 42 pads: not a multiple of any group size
    batch = torch.stack([tokens[0], torch.cat([torch.zeros(42, dtype=torch.long), short])])
    mask = torch.ones_like(batch)
    mask[1, :42] = 0
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    padded = logits(model, batch, attention_mask=mask, position_ids=position_ids)
    torch.testing.assert_close(padded[1, 42:], logits(model, short[None])[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(padded[0], logits(model, tokens[:1])[0], rtol=1e-4, atol=1e-4)


def test_batched_generate_with_left_padding_equals_each_row_alone(tokens):
    model = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "self_extend",
                            window=16, group_size=4, logn=True)
    tokens = tokens.clamp(min=1)            # 0 is the pad token: never inside a row
    short = tokens[1, 51:150]
    batch = torch.stack([tokens[0, :150], torch.cat([torch.zeros(51, dtype=torch.long), short])])
    mask = torch.ones_like(batch)
    mask[1, :51] = 0
    both = model.generate(batch, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    alone = model.generate(short[None], max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(both[1, 51:], alone[0])


def test_positions_shifted_without_padding_are_refused(tokens):
    model = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "self_extend",
                            window=16, group_size=4)
    with pytest.raises(ValueError, match="only left padding"):
        logits(model, tokens[:, :80], position_ids=torch.arange(80)[None] - 5)


def test_generate_with_cache_equals_without(tokens):
    model = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "self_extend",
                            window=16, group_size=4)
    prompt = tokens[:1, :120].clamp(min=1)  # 0 is the pad token: generate would mask it
    a = model.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=True, pad_token_id=0)
    b = model.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=False, pad_token_id=0)
    assert torch.equal(a, b)


@pytest.mark.parametrize("method,knobs", CASES)
def test_static_cache_generate_equals_dynamic_cache(arch, tokens, method, knobs):
    """A static cache passes all max_cache_len key slots, the unfilled tail masked (or, at a 5.x
    prefill, no mask at all): the same greedy tokens as the dynamic cache, whose keys are exact."""
    model = hf_posext.patch(tiny_model(arch, attn_implementation="sdpa"), method, factor(method), **knobs)
    prompt = tokens[:1, :120].clamp(min=1)  # 0 is the pad token: generate would mask it
    a = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    b = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0,
                       cache_implementation="static")
    assert torch.equal(a, b)


@pytest.mark.parametrize("method,knobs", CASES)
def test_right_padding_in_every_row_matches_each_row_alone(tokens, method, knobs):
    """Trailing columns no query sees are padding here, not a static cache's empty slots."""
    model = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), method, factor(method), **knobs)
    mask = torch.ones_like(tokens)
    mask[0, 180:], mask[1, 150:] = 0, 0
    batch = logits(model, tokens, attention_mask=mask)
    torch.testing.assert_close(batch[0, :180], logits(model, tokens[:1, :180])[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(batch[1, :150], logits(model, tokens[1:, :150])[0], rtol=1e-4, atol=1e-4)


def test_static_cache_with_left_padding_equals_each_row_alone(tokens):
    model = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "self_extend",
                            window=16, group_size=4, logn=True)
    tokens = tokens.clamp(min=1)
    short = tokens[1, 51:150]
    batch = torch.stack([tokens[0, :150], torch.cat([torch.zeros(51, dtype=torch.long), short])])
    mask = torch.ones_like(batch)
    mask[1, :51] = 0
    both = model.generate(batch, attention_mask=mask, max_new_tokens=8, do_sample=False,
                          pad_token_id=0, cache_implementation="static")
    alone = model.generate(short[None], max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(both[1, 51:], alone[0])


def test_unpatch_restores_and_nothing_leaks(arch, tokens):
    model, other = tiny_model(arch, attn_implementation="sdpa"), tiny_model(arch, attn_implementation="sdpa")
    before, before_config = logits(model, tokens), model.config.to_dict()
    hf_posext.patch(model, "rerope", 2.0, window=16)
    assert hf_posext.is_patched(model) and model.config._attn_implementation == "hf_posext"
    assert model.config.max_position_embeddings == 2 * TRAINED
    assert other.config._attn_implementation == "sdpa" and not hasattr(other.config, "hf_posext_attention")
    torch.testing.assert_close(logits(other, tokens), before, rtol=0, atol=0)
    hf_posext.patch(model, "yarn", 2.0)                     # replaces: attention back to SDPA
    assert model.config._attn_implementation == "sdpa"
    assert not hasattr(model.config, "hf_posext_attention")
    hf_posext.patch(model, "yarn", 2.0, logn=True)           # log-n on a rope method
    assert model.config.hf_posext_attention["method"] == "logn"
    hf_posext.unpatch(model)
    assert model.config.to_dict() == before_config
    torch.testing.assert_close(logits(model, tokens), before, rtol=0, atol=0)


def test_logn_on_rope_method_scales_queries_past_L(tokens):
    yarn = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "yarn", 3.0)
    both = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "yarn", 3.0, logn=True)
    a, b = logits(yarn, tokens), logits(both, tokens)
    torch.testing.assert_close(a[:, :TRAINED], b[:, :TRAINED], rtol=1e-5, atol=1e-5)
    assert (a[:, TRAINED:] - b[:, TRAINED:]).abs().max() > 1e-4


@pytest.mark.parametrize("knobs,message", [
    ({"window": 2 * TRAINED}, "exceeds the trained length"),
    ({"window": 0}, "positive integer"),
    ({"window": 8.5}, "positive integer"),
    ({"leak": 1.0}, "does not use 'leak'"),
    ({"group_size": 4}, "does not use 'group_size'"),
    ({"logn": "yes"}, "True or False"),
    ({"beta_fast": 32}, "does not take"),
])
def test_bad_rerope_knobs_raise(knobs, message):
    model = tiny_model("llama")
    with pytest.raises((ValueError, TypeError), match=message):
        hf_posext.patch(model, "rerope", **knobs)
    assert not hf_posext.is_patched(model) and model.config._attn_implementation == "eager"


@pytest.mark.parametrize("method,knobs,message", [
    ("leaky_rerope", {"leak": 1.0}, "> 1"),
    ("leaky_rerope", {"leak": float("inf")}, "> 1"),
    ("self_extend", {"group_size": 0}, "positive integer"),
    ("dual_chunk", {"chunk_size": 2 * TRAINED}, "exceeds the trained length"),
    ("dual_chunk", {"chunk_size": 32, "local_window": 32}, "smaller than"),
    ("string", {"shifted_offset": 2 * TRAINED}, "exceeds the trained length"),
    ("string", {"shifted_offset": 16, "local_value": 17}, "at most shifted_offset"),
    ("string", {"local_value": -1}, "positive integer"),
    ("string", {"window": 16}, "does not use 'window'"),
    ("string", {}, "shifts nothing"),   # L = 64: the authors' S = 21, W = min(128, S) = S
    ("string", {"local_value": 21}, "shifts nothing"),    # S defaults to 21 = W
    ("logn", {"logn": False}, "leaves nothing"),
    ("yarn", {"window": 16}, "knobs of the attention methods"),
    ("yarn", {"logn": 1}, "True or False"),
])
def test_bad_knobs_raise(method, knobs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        hf_posext.patch(tiny_model("llama"), method, **knobs)


def test_attention_methods_are_listed_and_defaults_follow_the_authors():
    assert set(hf_posext.ATTENTION_METHODS) <= set(hf_posext.METHODS)
    from hf_posext.catalog import canonical_method
    assert canonical_method("ReRoPE") == "rerope"
    spec = hf_posext.AttentionExtensionConfig("leaky_rerope", 4096)
    assert (spec.window, spec.leak, spec.logn) == (512, 16.0, True)       # bojone/rerope
    spec = hf_posext.AttentionExtensionConfig("self_extend", 4096)
    assert (spec.window, spec.group_size, spec.logn) == (1024, 8, False)  # LongLM
    spec = hf_posext.AttentionExtensionConfig("dual_chunk", 4096)
    assert (spec.chunk_size, spec.local_window) == (3072, 256)            # ChunkLlama
    spec = hf_posext.AttentionExtensionConfig("string", 131072)
    assert (spec.shifted_offset, spec.local_value, spec.logn) == (43253, 128, False)  # STRING README
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.window = 3                                                   # immutable


@pytest.mark.parametrize("method,knobs", CASES[:-1])
@pytest.mark.parametrize("chunk", [5, 16, 33])
def test_query_chunking_does_not_change_the_result(method, knobs, chunk):
    """Chunks smaller and larger than the window, not dividing it: same as one chunk."""
    from hf_posext.attention import AttentionExtensionConfig
    from hf_posext.attention.kernel import attend
    from hf_posext.attention.units import plan_for
    from hf_posext.rope.methods import default_inv_freq

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4 if t == "q" else 2, 150, 16, generator=g) for t in "qkv")
    spec = AttentionExtensionConfig(method, TRAINED, **knobs)
    inv = default_inv_freq(16, 1e4)
    whole = attend(q, k, v, None, 0.25, plan_for(spec), inv, 0, chunk=1000)
    torch.testing.assert_close(attend(q, k, v, None, 0.25, plan_for(spec), inv, 0, chunk=chunk),
                               whole, rtol=1e-5, atol=1e-5)
    tail = attend(q[:, :, 140:], k, v, None, 0.25, plan_for(spec), inv, 140, chunk=chunk)  # cached
    torch.testing.assert_close(tail, whole[:, :, 140:], rtol=1e-5, atol=1e-5)


# --- "auto" knobs: fitted to the target length by the authors' rule ------------------------------

@pytest.mark.parametrize("method,knobs", [("leaky_rerope", {"window": 24}), ("self_extend", {"window": 16}),
                                          ("self_extend", {"window": 1})])
@pytest.mark.parametrize("target", [TRAINED, 2 * TRAINED, 3 * TRAINED, 7 * TRAINED + 5])
def test_auto_knob_keeps_every_relative_position_trained(method, knobs, target):
    """Brute force over every pair (i, j) of a `target`-token input with the reference map above:
    the fitted knob keeps r(i, j) <= L − 1 (and, for Self-Extend, G − 1 would not)."""
    from hf_posext.attention import AttentionExtensionConfig
    name = "leak" if method == "leaky_rerope" else "group_size"
    spec = AttentionExtensionConfig(method, TRAINED, **knobs, **{name: "auto"}, target_length=target)
    value = spec.fitted(name)
    i = torch.arange(target, dtype=torch.float64)[:, None]
    j = torch.arange(target, dtype=torch.float64)[None, :]
    r = lambda v: relative(method, {**knobs, name: v}, i, j).masked_fill(j > i, 0)  # noqa: E731
    assert r(value).max() <= TRAINED - 1 + 1e-9
    if name == "leak" and target > TRAINED:          # the smallest leak that fits: exactly L − 1
        assert r(value).max() == pytest.approx(TRAINED - 1)
    if name == "group_size" and value > 1:
        assert r(value - 1).max() > TRAINED - 1
    if target <= TRAINED:
        assert value == 1                             # nothing to compress inside L


@pytest.mark.parametrize("method,knobs,explicit", [
    ("leaky_rerope", {"window": 24, "logn": False}, lambda s: {"leak": (s * TRAINED - 1 - 24) / (TRAINED - 1 - 24)}),
    ("self_extend", {"window": 16}, lambda s: {"group_size": 4}),  # ⌊191/4⌋+16−4 = 59 <= 63; G = 3: 73.7
])
@pytest.mark.parametrize("s", [1.0, 3.0])
def test_auto_knob_equals_the_explicit_value(arch, tokens, method, knobs, explicit, s):
    name = "leak" if method == "leaky_rerope" else "group_size"
    model = tiny_model(arch, attn_implementation="sdpa")
    if s == 1.0:
        want = logits(model, tokens[:, :TRAINED])      # inside L, auto compresses nothing
        hf_posext.patch(model, method, s, **knobs, **{name: "auto"})
        torch.testing.assert_close(logits(model, tokens[:, :TRAINED]), want, rtol=1e-5, atol=1e-5)
        return
    hf_posext.patch(model, method, s, **knobs, **explicit(s))
    want = logits(model, tokens)
    hf_posext.patch(model, method, s, **knobs, **{name: "auto"})
    torch.testing.assert_close(logits(model, tokens), want, rtol=1e-6, atol=1e-6)


def test_auto_knob_needs_a_target_and_room():
    from hf_posext.attention import AttentionExtensionConfig
    with pytest.raises(ValueError, match="pass factor="):
        AttentionExtensionConfig("self_extend", TRAINED, group_size="auto")
    with pytest.raises(ValueError, match="window alone fills"):
        AttentionExtensionConfig("leaky_rerope", TRAINED, window=TRAINED, leak="auto", target_length=2 * TRAINED)
