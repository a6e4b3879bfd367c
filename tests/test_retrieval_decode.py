"""Prefix-cache reuse: a trial continued from the shared prefix's cache (attending by
attention.continuation, as answer_cell runs it) gives the logits of a full recompute of its
prompt by transformers' own SDPA (same held rope scale), for static, dynamic and attention-level
methods; a deeper cell's prefix extended from a shallower cell's cache gives the same tokens and
logits as its own prefill; and the whole cell's answers match one full prefill per trial."""

import dataclasses

import pytest
import torch

import hf_posext
from _evalkit import char_tokenizer, tiny_model
from hf_posext.evaluation.retrieval import build_cell, get_task, noise_haystack
from hf_posext.attention.continuation import continuation_attention
from hf_posext.evaluation.retrieval.decode import SharedPrefix, answer_cell, generate_trial, prefill
from hf_posext.generation import fixed_rope_scale
from transformers.cache_utils import DynamicLayer

pytestmark = pytest.mark.usefixtures("one_thread")


# (method, factor, knobs) for every method; STRING keeps its distances inside L = 64 only up to
# L + S − W = 80 tokens (its reach check), with knobs that shift something (as test_attention.py)
EVERY_METHOD = [("none", 1.0, {})] + [(m, 4.0, {}) for m in hf_posext.ROPE_METHODS] + [
    (m, 1.25, {"shifted_offset": 21, "local_value": 5}) if m == "string" else (m, 4.0, {})
    for m in hf_posext.ATTENTION_METHODS]


def recompute(model, ids: list[int], m: int):
    """The reference: greedy tokens and each step's logits, every step one forward of the whole
    sequence so far without any cache (transformers' own attention, no continuation), up to `m`
    tokens or the end-of-sequence token (where generate stops)."""
    seq, logits, eos = list(ids), [], model.generation_config.eos_token_id
    for _ in range(m):
        out = model(torch.tensor([seq]), use_cache=False).logits[0, -1]
        logits.append(out)
        seq.append(int(out.argmax()))
        if seq[-1] in (eos if isinstance(eos, list) else [eos]):
            break
    return seq[len(ids):], logits


def assert_same_answer(got, want):
    assert got[0] == want[0]
    assert len(got[1]) == len(want[1])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("method,factor,knobs", EVERY_METHOD, ids=[m for m, _, _ in EVERY_METHOD])
def test_cached_trial_equals_full_recompute(method, factor, knobs, monkeypatch):
    """A trial as answer_cell runs it (a fork of the prefix cache with reserved capacity, by
    attention.continuation) gives the tokens and logits of a recompute without any cache; so
    does the fork without the reserve (DynamicLayer's cat); the prefix cache is left as it was."""
    from hf_posext.evaluation.retrieval import decode
    from hf_posext.evaluation.retrieval.reserved import ReservedLayer
    tok, model = char_tokenizer(), tiny_model()
    if method != "none":
        hf_posext.patch(model, method, factor, **knobs)
    cell = build_cell(tok, get_task("multi_key"), noise_haystack(tok), 700, 0.5, [0, 1])
    assert len(cell.prefix) > 100          # a real shared prefix
    forks, real = [], decode.reserved_fork
    monkeypatch.setattr(decode, "reserved_fork", lambda c, n: forks.append(real(c, n)) or forks[-1])
    with torch.inference_mode(), fixed_rope_scale(model, cell.hold_length):
        with continuation_attention(model):
            cache = prefill(model, cell.prefix)
            held = [(layer.keys, layer.values, layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
            runs = [[generate_trial(model, tok, cell.prompt(i), cell.max_new_tokens[i], cache, scores=True, capacity=c)
                     for c in (None, 0)] for i in range(2)]
        for i, (reserved, grown) in enumerate(runs):
            m = cell.max_new_tokens[i]
            full = recompute(model, cell.prompt(i), m)
            assert len(full[0]) > 1                            # decode steps ran
            assert_same_answer(reserved, full)
            assert_same_answer(grown, full)
            # the reserved fork held the trial exactly: its buffers full, nothing grown past them
            trial = forks[i]
            assert all(type(layer) is ReservedLayer for layer in trial.layers)
            for layer in trial.layers:
                assert layer.buffers[0].shape[-2] == len(cell.prompt(i)) + m - 1   # the reserve
                assert layer.get_seq_length() == len(cell.prompt(i)) + len(full[0]) - 1
                assert layer.keys.data_ptr() == layer.buffers[0].data_ptr()
        assert len(forks) == 2                                 # capacity 0 forked without it
        assert cache.get_seq_length() == len(cell.prefix)   # the shared cache was not consumed
        for layer, (k, v, k0, v0) in zip(cache.layers, held):  # nor written into by a trial's fork
            assert type(layer) is DynamicLayer and layer.keys is k and layer.values is v
            assert torch.equal(k, k0) and torch.equal(v, v0) and k.shape[-2] == len(cell.prefix)


@pytest.mark.parametrize("method", ["none", "dual_chunk"])
def test_a_trial_past_its_reserve_grows_and_stays_exact(method):
    """More tokens than reserved: the suffix itself (capacity below the prompt) or the decode
    steps (capacity one past the prompt) overflow; the layers grow, the answer is the recompute's."""
    tok, model = char_tokenizer(), tiny_model()
    if method != "none":
        hf_posext.patch(model, method, 4.0)
    cell = build_cell(tok, get_task("single_needle"), noise_haystack(tok), 600, 0.5, [2])
    ids, m = cell.prompt(0), cell.max_new_tokens[0]
    assert m > 2
    with torch.inference_mode(), fixed_rope_scale(model, cell.hold_length):
        with continuation_attention(model):
            cache = prefill(model, cell.prefix)
            got = [generate_trial(model, tok, ids, m, cache, scores=True, capacity=c)
                   for c in (len(cell.prefix) + 2, len(ids) + 1)]
        full = recompute(model, ids, m)
    assert len(full[0]) > 2                          # decode steps past the reserve ran
    for g in got:
        assert_same_answer(g, full)
    assert cache.get_seq_length() == len(cell.prefix)


def test_reserved_layer_writes_in_place_and_returns_what_dynamic_layer_does():
    """transformers' DynamicLayer is the reference for every update's result; within the
    reserve the buffers stay the same (written in place), past it the layer grows; the layer it
    was made from keeps its tensors."""
    from hf_posext.evaluation.retrieval.reserved import ReservedLayer
    g = torch.Generator().manual_seed(0)
    kv = lambda n: (torch.randn(1, 2, n, 4, generator=g), torch.randn(1, 2, n, 4, generator=g))  # noqa: E731
    prefix, ref = DynamicLayer(), DynamicLayer()
    k0, v0 = kv(5)
    k0, v0 = prefix.update(k0, v0)           # the prefix layer's own tensors
    ref.update(k0, v0)
    layer = ReservedLayer(prefix, capacity=5 + 3 + 2)
    ptrs = []
    for n in (3, 1, 1, 1):                        # a suffix, two steps within the reserve, one past it
        k, v = kv(n)
        got, want = layer.update(k, v), ref.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert layer.get_seq_length() == ref.get_seq_length()
        ptrs.append(layer.buffers[0].data_ptr())
    assert ptrs[0] == ptrs[1] == ptrs[2] != ptrs[3]
    assert prefix.keys is k0 and prefix.values is v0 and prefix.get_seq_length() == 5


def test_decode_steps_run_on_one_thread_and_the_threads_come_back():
    tok, model = char_tokenizer(), tiny_model()
    seen = []
    model.register_forward_hook(lambda m, a, k, out: seen.append((k["input_ids"].shape[-1], torch.get_num_threads())),
                                with_kwargs=True)   # after the forward: the count it ran with
    torch.set_num_threads(2)              # the one_thread fixture restores its own count after
    try:
        generate_trial(model, tok, list(range(5, 40)), 4, None)
        assert seen[0] == (35, 2) and len(seen) > 1 and set(seen[1:]) == {(1, 1)}   # the prompt, then steps
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


def test_cell_answers_with_and_without_prefix_reuse_agree():
    tok, model = char_tokenizer(), tiny_model()
    hf_posext.patch(model, "dynamic_ntk", 4.0)
    cell = build_cell(tok, get_task("single_needle"), noise_haystack(tok), 600, 1.0, [3, 4, 5])
    assert answer_cell(model, tok, cell, reuse_prefix=True) == answer_cell(model, tok, cell, reuse_prefix=False)


@pytest.mark.parametrize("method", ["none", pytest.param("dynamic_ntk", marks=pytest.mark.slow),
                                    pytest.param("dual_chunk", marks=pytest.mark.slow)])
def test_deeper_cells_extend_the_shallower_prefix_cache(method):
    """Depths 0.25 -> 0.5 -> 0.75 of one (task, length, seeds): each prefix is the next one's
    first tokens (whole haystack pieces, tokenised once), so the holder extends its cache; each
    trial's logits then equal those from the cell's own prefill, and the full recompute's."""
    tok, model = char_tokenizer(), tiny_model()
    if method != "none":
        hf_posext.patch(model, method, 4.0)
    hay = noise_haystack(tok)
    cells = [build_cell(tok, get_task("multi_key"), hay, 700, d, [0]) for d in (0.25, 0.5, 0.75)]
    for a, b in zip(cells, cells[1:]):
        assert len(a.prefix) < len(b.prefix) and b.prefix[:len(a.prefix)] == a.prefix
        assert a.prompt(0) != b.prompt(0) and len(a.prompt(0)) == len(b.prompt(0))  # the needle moved
    assert len({c.hold_length for c in cells}) == 1       # one held rope scale for the column
    holder = SharedPrefix()
    with fixed_rope_scale(model, cells[0].hold_length), continuation_attention(model):
        for cell in cells:
            before = holder.held.get("state", (None, None))[1]
            cache = holder.cache_of(model, cell.prefix, "state")
            assert cache is before or before is None      # extended in place, not prefilled anew
            assert cache.get_seq_length() == len(cell.prefix) and holder.held["state"][0] == cell.prefix
            own = prefill(model, cell.prefix)
            for i in range(len(cell.trials)):
                ids, m = cell.prompt(i), cell.max_new_tokens[i]
                got, got_logits = generate_trial(model, tok, ids, m, cache, scores=True)
                want, want_logits = generate_trial(model, tok, ids, m, own, scores=True)
                full, full_logits = generate_trial(model, tok, ids, m, None, scores=True)
                assert got == want == full
                for x, y, z in zip(got_logits, want_logits, full_logits):
                    torch.testing.assert_close(x, y, atol=2e-5, rtol=1e-4)
                    torch.testing.assert_close(x, z, atol=2e-5, rtol=1e-4)


def test_the_holder_starts_over_when_the_prefix_or_the_state_differs():
    tok, model = char_tokenizer(), tiny_model()
    hay = noise_haystack(tok)
    deep = build_cell(tok, get_task("single_needle"), hay, 600, 0.75, [0])
    shallow = build_cell(tok, get_task("single_needle"), hay, 600, 0.25, [0])
    other = build_cell(tok, get_task("multi_key"), hay, 700, 0.25, [0])   # another head
    holder = SharedPrefix()
    first = holder.cache_of(model, deep.prefix, "a")
    assert holder.prefilled == len(deep.prefix)
    view = holder.cache_of(model, shallow.prefix, "a")                  # shorter: a view, no forward
    assert view is not first and view.get_seq_length() == len(shallow.prefix)
    assert holder.prefilled == len(deep.prefix) and holder.held["a"][0] == deep.prefix
    assert other.prefix[:len(shallow.prefix)] != shallow.prefix
    holder.cache_of(model, other.prefix, "a")                           # not a prefix of it: anew
    assert holder.prefilled == len(deep.prefix) + len(other.prefix) and holder.held["a"][0] == other.prefix
    holder.cache_of(model, other.prefix, "b")                           # another model state
    assert list(holder.held) == ["b"]                                   # max_bytes 0: only the last kept


def test_a_shorter_prefix_is_served_as_a_view_and_the_held_cache_stays_intact():
    """A later look's shallow depth is read from the deepest prefix held (`head_view`): its
    trials' tokens and logits equal a full recompute's, under a dynamic method's held rope
    too, and the held tensors are neither moved nor written by the trials."""
    tok, model = char_tokenizer(), tiny_model()
    hf_posext.patch(model, "dynamic_ntk", 4.0)
    hay = noise_haystack(tok)
    deep, shallow = (build_cell(tok, get_task("single_needle"), hay, 700, d, [0, 1, 2]) for d in (1.0, 0.25))
    holder = SharedPrefix()
    with fixed_rope_scale(model, deep.hold_length), continuation_attention(model):
        held = holder.cache_of(model, deep.prefix, "state")
        snapshot = [(layer.keys.data_ptr(), layer.keys.clone(), layer.values.clone()) for layer in held.layers]
        view = holder.cache_of(model, shallow.prefix, "state")
        assert holder.prefilled == len(deep.prefix)
        for i in range(len(shallow.trials)):
            ids, m = shallow.prompt(i), shallow.max_new_tokens[i]
            got, got_logits = generate_trial(model, tok, ids, m, view, scores=True)
            full, full_logits = generate_trial(model, tok, ids, m, None, scores=True)
            assert got == full
            for x, z in zip(got_logits, full_logits):
                torch.testing.assert_close(x, z, atol=2e-5, rtol=1e-4)
    for layer, (ptr, keys, values) in zip(held.layers, snapshot):
        assert layer.keys.data_ptr() == ptr and torch.equal(layer.keys, keys) and torch.equal(layer.values, values)


def test_the_holder_keeps_states_within_its_bytes_and_drops_the_least_recently_used():
    from hf_posext.evaluation.retrieval.decode import cache_bytes, head_view
    tok, model = char_tokenizer(), tiny_model()
    prefix = build_cell(tok, get_task("single_needle"), noise_haystack(tok), 600, 0.5, [0]).prefix
    one = cache_bytes(prefill(model, prefix))
    assert one == 2 * model.config.num_hidden_layers * len(prefix) * model.config.num_key_value_heads \
        * (model.config.hidden_size // model.config.num_attention_heads) * 4   # keys + values, float32
    holder = SharedPrefix(max_bytes=2 * one)
    for key in ("a", "b", "a", "c"):                                    # "a" used again: "b" is the oldest
        holder.cache_of(model, prefix, key)
    assert list(holder.held) == ["a", "c"] and holder.prefilled == 3 * len(prefix)
    with pytest.raises(ValueError, match="max_bytes"):
        SharedPrefix(max_bytes=-1)

    class Other(DynamicLayer):   # any layer type but DynamicLayer: its first tokens are not a slice
        pass
    cache = prefill(model, prefix)
    cache.layers = [Other.__new__(Other) for _ in cache.layers]
    assert head_view(cache, 3) is None


def test_the_grid_extends_one_prefix_cache_over_a_columns_depths(monkeypatch):
    """evaluate_retrieval hands answer_cell one SharedPrefix: the depths of a (task, method,
    length) after the first prefill only the pieces between the needles, the methods start over,
    and the answers are those of one full prefill per trial."""
    from hf_posext.evaluation.retrieval import RetrievalGrid, decode, evaluate_retrieval
    tok, model = char_tokenizer(), tiny_model()
    extended, real = [], decode.prefill
    monkeypatch.setattr(decode, "prefill", lambda m, p, cache=None: extended.append(
        (len(p), cache is not None)) or real(m, p, cache))
    grid = RetrievalGrid(["yarn"], [600], depths=[0.25, 0.5, 1.0], tasks=["single_needle"], trials=2)
    rows = evaluate_retrieval(model, tok, grid, progress=False)
    # per method: the first depth from scratch, the next two extended
    assert [c for _, c in extended] == [False, True, True] * 2
    full = evaluate_retrieval(model, tok, dataclasses.replace(grid, reuse_prefix=False), progress=False)
    assert [r["outputs"] for r in rows] == [r["outputs"] for r in full]
