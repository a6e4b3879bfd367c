"""DPE (Lu et al. 2025, arXiv 2504.18857; LuLuLuyi/DPE @46b85de) against a transcription of the
reference's prefill (dpe_for_llama.py `dpe_flash_forward` lines 319-392 and `atten_merge_forward`
lines 141-221, flash-attn replaced by dense float64 softmax with its log-sum-exp), the key-dimension
score against qk_2_norm_select_dim.py, the detection's probe scales against run_niah_detect.sh,
equality with plain RoPE inside the window, save/reload, and bad knobs refused."""

import json

import numpy as np
import pytest
import torch
from conftest import TRAINED, tiny_model
from transformers import AttentionInterface

import hf_posext
from hf_posext.search import dpe as detection

pytestmark = pytest.mark.usefixtures("one_thread")

THETA = 10_000.0


def reference_attention(scale_factors, window, dim_mask=None):
    """The reference prefill, transcribed: per group i the rotary cos/sin at `query_position // s_i
    + w − w/s_i` and `key_position // s_i` (lines 328-346, `concat_tensors` picking group i's slice
    of both halves), optionally `torch.where(dim_mask, scaled, normal)` (lines 348-354); a band
    attention (flash window [w − 1, 0]) at plain positions, a causal attention of the last
    K − w queries over the first K − w keys at the scaled ones, merged by the sigmoid of their
    log-sum-exp gap (lines 171-220)."""
    def fn(module, q, k, v, mask, scaling=None, **_):
        B, H, K, D = q.shape
        half = D // 2
        q, k, v = q.double(), k.double(), v.double()
        k, v = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))
        inv = 1.0 / THETA ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        pos = torch.arange(K, dtype=torch.float64)

        def cos_sin(p):                                   # RotaryEmbedding.forward, [K, D]
            emb = torch.cat([p[:, None] * inv, p[:, None] * inv], -1)
            return emb.cos(), emb.sin()

        def rot(x, cos, sin):                             # apply_rotary_pos_emb
            return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

        # un-rotate what the model rotated at plain positions: rotation by −p
        c, s = cos_sin(pos)
        q0, k0 = rot(q, c, -s), rot(k, c, -s)
        ranges = [g * half // len(scale_factors) for g in range(len(scale_factors) + 1)]
        qc, qs, kc, ks = [], [], [], []
        for f in scale_factors:                           # lines 328-341
            cq, sq = cos_sin(torch.div(pos, f, rounding_mode="floor") + window - window / f)
            ck, sk = cos_sin(torch.div(pos, f, rounding_mode="floor"))
            qc.append(cq); qs.append(sq); kc.append(ck); ks.append(sk)

        def concat(lst):                                  # concat_tensors, lines 224-232
            return torch.cat([t[:, ranges[i]:ranges[i + 1]] for i, t in enumerate(lst)]
                             + [t[:, half + ranges[i]:half + ranges[i + 1]] for i, t in enumerate(lst)], -1)
        sqc, sqs, skc, sks = concat(qc), concat(qs), concat(kc), concat(ks)
        if dim_mask is not None:                          # [layers, H, half] -> [H, 1, D]
            m = dim_mask[module.layer_idx]
            m = torch.cat([m, m], -1)[:, None, :]
            sqc, sqs = torch.where(m, sqc, c), torch.where(m, sqs, s)
            skc, sks = torch.where(m, skc, c), torch.where(m, sks, s)
        nq, nk = rot(q0, c, s), rot(k0, c, s)
        sq_, sk_ = rot(q0, sqc, sqs), rot(k0, skc, sks)
        scale = D ** -0.5

        def attn(qq, kk, vv, allowed):
            sc = (qq @ kk.transpose(-1, -2)) * scale
            sc = sc.masked_fill(~allowed, float("-inf"))
            lse = torch.logsumexp(sc, -1)
            return torch.softmax(sc, -1) @ vv, lse
        i, j = pos[:, None], pos[None, :]
        out_n, lse_n = attn(nq, nk, v, (j <= i) & (j > i - window))   # window [w − 1, 0]
        n = K - window                                                 # scale_len
        out_s, lse_s = attn(sq_[:, :, -n:], sk_[:, :, :n], v[:, :, :n], j[:, :n] <= i[:n])  # causal
        gap = lse_s - lse_n[:, :, -n:]                                 # line 210
        w_n = torch.ones_like(lse_n)
        w_n[:, :, -n:] = 1 / (1 + torch.exp(gap))
        out = out_n * w_n[..., None]
        out[:, :, -n:] += out_s * (1 / (1 + torch.exp(-gap)))[..., None]
        return out.transpose(1, 2).float().contiguous(), None
    return fn


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("scales,window,masked", [
    ([4], 16, False),                 # one group: Self-Extend
    ([1, 2, 4, 8], 16, False),        # head_dim 16: 8 components, 4 groups of 2
    ([2, 8, 2, 8, 32, 32, 32, 4], 24, False),   # the authors' Llama-3-8B scales, 8 groups of 1
    ([3, 1, 6, 2], 20, True),         # key dimensions on; w not a multiple of the scales
])
def test_against_the_reference_prefill(tokens, scales, window, masked):
    model = tiny_model("llama", attn_implementation="sdpa")
    key_dims = None
    mask = None
    if masked:
        g = torch.Generator().manual_seed(3)
        key_dims = [[sorted(torch.randperm(8, generator=g)[:5].tolist()) for _ in range(4)] for _ in range(2)]
        mask = torch.zeros(2, 4, 8, dtype=torch.bool)
        for li, layer in enumerate(key_dims):
            for h, comps in enumerate(layer):
                mask[li, h, comps] = True
    hf_posext.patch(model, "dpe", 3.0, window=window, group_scales=scales, key_dims=key_dims)
    got = logits(model, tokens[:1])
    AttentionInterface.register("test_dpe_reference", reference_attention(scales, window, mask))
    model.config._attn_implementation = "test_dpe_reference"
    want = logits(model, tokens[:1])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got[:, TRAINED:] - logits(tiny_model("llama"), tokens[:1])[:, TRAINED:]).abs().max() > 1e-3


def test_within_the_window_equals_unpatched(tokens):
    """DPE changes only keys at least w away: an input no longer than w is plain RoPE."""
    model = tiny_model("llama", attn_implementation="sdpa")
    ref = logits(model, tokens[:, :TRAINED])
    hf_posext.patch(model, "dpe", 2.0, window=TRAINED, group_scales=[2, 4, 8, 16])
    torch.testing.assert_close(logits(model, tokens[:, :TRAINED]), ref, rtol=1e-5, atol=1e-5)


def test_cached_decoding_matches_full_forward(tokens):
    model = hf_posext.patch(tiny_model("mistral", attn_implementation="sdpa"), "dpe", 3.0, window=16,
                            group_scales=[1, 2, 4, 8], key_dims=[[[0, 2, 7]] * 4, [[1, 5]] * 4])
    ids = tokens[:1]
    full = logits(model, ids)
    with torch.no_grad():
        out = model(ids[:, :120], use_cache=True)
        steps, cache = [out.logits[:, -1]], out.past_key_values
        for t in range(120, 140):
            out = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits[:, -1])
            cache = out.past_key_values
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 119:140], rtol=1e-4, atol=1e-4)


def test_save_and_reload(tmp_path, tokens):
    model = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "dpe", 3.0, window=16,
                            group_scales=[1, 2, 4, 8], key_dims=[[[0, 2, 7]] * 4, [[1, 5]] * 4])
    want = logits(model, tokens[:1])
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["hf_posext_attention"]
    assert saved["group_scales"] == [1, 2, 4, 8] and saved["key_dims"][1][0] == [1, 5]
    again = hf_posext.from_pretrained(tmp_path)
    torch.testing.assert_close(logits(again, tokens[:1]), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("knobs,message", [
    ({"group_scales": []}, "non-empty list"),
    ({"group_scales": "2-4"}, "non-empty list"),
    ({"group_scales": [2, 0]}, r"group_scales\[1\] must be a positive integer"),
    ({"group_scales": [2, 1.5]}, r"group_scales\[1\] must be a positive integer"),
    ({"key_dims": [[3]]}, r"key_dims\[0\]\[0\] is 3"),
    ({"window": 10 ** 6}, "exceeds the trained length"),
])
def test_bad_knobs_are_refused(knobs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        hf_posext.patch(tiny_model("llama"), "dpe", 2.0, **knobs)


@pytest.mark.parametrize("knobs,message", [
    ({"group_scales": [2, 2, 2]}, "3 group_scales cannot split 8 rotary frequencies"),
    ({"key_dims": [[[0]] * 4]}, r"1 layers × \[4\] heads, but the model has 2 layers × 4"),
    ({"key_dims": [[[0]] * 3] * 2}, r"× \[3\] heads"),
    ({"key_dims": [[[0, 8]] * 4] * 2}, "names component 8, but the rotary dim has 8"),
])
def test_knobs_that_do_not_fit_the_model_are_refused_at_patch(knobs, message):
    """Checked against the model's shape when patching (nothing changed), not at the first forward."""
    model = tiny_model("llama", attn_implementation="sdpa")
    with pytest.raises(ValueError, match=message):
        hf_posext.patch(model, "dpe", 3.0, window=16, **knobs)
    assert not hf_posext.is_patched(model) and model.config._attn_implementation == "sdpa"


def test_key_dims_score_follows_qk_2_norm_select_dim():
    """component_norms against the reference's calculate_2_norm on q_proj / k_proj outputs
    (qk_2_norm_select_dim.py lines 18-20, 38-42), computed here from the weights directly."""
    model = tiny_model("llama")
    ids = torch.arange(40) % 100
    got = detection.component_norms(model, ids)
    with torch.no_grad():
        layer_in = model.model.embed_tokens(ids[None])
        attn = model.model.layers[0]
        x = attn.input_layernorm(layer_in)[0]
        query = attn.self_attn.q_proj(x).reshape(40, 4, 16)        # [seq, heads, head_dim]
        key = attn.self_attn.k_proj(x).reshape(40, 2, 16)

    def calculate_2_norm(t):
        return torch.norm(t.reshape(t.size(0), t.size(1), 2, -1).transpose(-1, -2), p=2, dim=-1)
    k_norm = calculate_2_norm(key)[:, :, None, :].expand(40, 2, 2, 8).reshape(40, 4, 8)  # repeat_kv
    torch.testing.assert_close(got[0], (calculate_2_norm(query) * k_norm).mean(dim=0))
    top = detection.select_key_dims(got, 3)
    assert top[0][1] == sorted(torch.topk(got[0, 1], 3).indices.tolist())


def test_probe_scales_follow_run_niah_detect():
    """run_niah_detect.sh: TEST_MAX_LENGTH 131072 → ratios 1, 2, ..., 128 (lengths down to 1024)."""
    assert detection.candidate_scales(131072, 1024) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert detection.candidate_scales(16384, 1024) == [1, 2, 4, 8, 16]


class CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 128 for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) if i % 7 else " " for i in ids)


def test_detection_on_a_tiny_model(tmp_path):
    """Every group probed at every scale, the others at 2·T/L; the log resumes; the result
    patches."""
    model = tiny_model("llama", attn_implementation="sdpa")
    doc = np.random.default_rng(0).integers(0, 128, 1100)
    ids, answers = detection.probe_document(doc, CharTokenizer(), 1024, seed=0)
    assert ids.numel() == 1024 and len(answers) == 4 and answers[-1][-1] == 1023
    log = tmp_path / "probe.log.jsonl"
    result = detection.detect(model, CharTokenizer(), [doc], 1024, window=16, groups=4,
                              shortest=256, log_path=log, progress=lambda line: None)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 4 * 3 and result["base_scale"] == 2 * 1024 // TRAINED
    assert {(r["group"], r["scale"]) for r in rows} == {(g, s) for g in range(4) for s in (1, 2, 4)}
    for g, s in enumerate(result["group_scales"]):   # each group's best: most found, then lowest NLL
        table = result["probes"][str(g)]
        assert s == max((int(k) for k in table), key=lambda k: (table[str(k)]["found"], -table[str(k)]["nll"]))
    again = detection.detect(model, CharTokenizer(), [doc], 1024, window=16, groups=4, shortest=256,
                             log_path=log, progress=lambda line: pytest.fail("re-ran a logged probe"))
    assert again["group_scales"] == result["group_scales"]
    assert model.config._attn_implementation == "sdpa"          # unpatched after
    hf_posext.patch(model, "dpe", 16.0, window=16, group_scales=result["group_scales"])


def test_the_all_base_probe_runs_once(tmp_path, monkeypatch):
    """At s = 2·T/L (the base) every group's probe is the same config: one forward, not one per
    group; the other groups' rows carry the score of a direct probe at the all-base scales."""
    model = tiny_model("llama", attn_implementation="sdpa")
    doc = np.random.default_rng(1).integers(0, 128, 1100)
    base = 2 * 1024 // TRAINED
    ids, answers = detection.probe_document(doc, CharTokenizer(), 1024, seed=0)
    hf_posext.patch(model, "dpe", 1024 / TRAINED, window=16, group_scales=[base] * 4)
    direct = detection.probe_score(model, ids, answers)
    hf_posext.unpatch(model)
    calls = []
    real = detection.probe_score
    monkeypatch.setattr(detection, "probe_score", lambda *a: calls.append(1) or real(*a))
    log = tmp_path / "probe.log.jsonl"
    result = detection.detect(model, CharTokenizer(), [doc], 1024, window=16, groups=4, shortest=32,
                              log_path=log, progress=lambda line: None)
    assert result["candidates"] == [1, 2, 4, 8, 16, 32] and result["base_scale"] == base == 32
    assert len(calls) == 4 * 6 - 3
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    at_base = [r for r in rows if r["scale"] == base]
    assert len(rows) == 24 and len(at_base) == 4 and sum("same_as" in r for r in at_base) == 3
    for r in at_base:
        assert r["found"] == direct["found"] and r["nll"] == pytest.approx(direct["nll"], abs=1e-6)


def test_knobs_on_the_command_line(tmp_path):
    """--knobs takes the reference's dash form and @FILE.json (what dpe-detect writes)."""
    from hf_posext.evaluation.shared.inputs import InputError, parse_knobs

    assert parse_knobs("dpe:group_scales=2-8-2-8", ["dpe"]) == {"dpe": {"group_scales": [2, 8, 2, 8]}}
    found = tmp_path / "dpe.json"
    found.write_text(json.dumps({"group_scales": [4, 4, 2, 16], "key_dims": [[[0]]]}))
    assert parse_knobs(f"dpe:group_scales=@{found}", ["dpe"])["dpe"]["group_scales"] == [4, 4, 2, 16]
    with pytest.raises(InputError, match="holds no 'window'"):
        parse_knobs(f"dpe:window=@{found}", ["dpe"])
    with pytest.raises(InputError, match="cannot read"):
        parse_knobs(f"dpe:group_scales=@{tmp_path / 'missing.json'}", ["dpe"])


@pytest.mark.parametrize("argv,message", [
    (["--target-length", "16k", "--out", "found.txt"], "must name a .json file"),
    (["--target-length", "16k", "--top-dims", "0", "--out", "found.json"], "--top-dims must be a positive integer"),
    pytest.param(["--target-length", "4k", "--out", "found.json"], "--target-length above it", marks=pytest.mark.slow),
    pytest.param(["--target-length", "16k", "--window", "8192", "--out", "found.json"],
                 "--window below the trained length 8192", marks=pytest.mark.slow),   # reads the GGUF header
    pytest.param(["--target-length", "16k", "--groups", "5", "--out", "found.json"],
                 "--groups 5 cannot split the model's 32 rotary frequencies", marks=pytest.mark.slow),
    pytest.param(["--target-length", "16k", "--top-dims", "33", "--out", "found.json"],
                 "--top-dims 33 is more than the model's 32", marks=pytest.mark.slow),
])
def test_dpe_detect_refuses_bad_flags_before_loading(run_cli, argv, message):
    code, _, err = run_cli(["dpe-detect", *argv])
    assert code == 2 and message in err


def test_one_group_is_self_extend(tokens):
    """One group (every component at G) is Self-Extend with group_size G (docs/attention.md)."""
    se = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "self_extend", 3.0,
                         window=20, group_size=3)
    one = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "dpe", 3.0, window=20,
                          group_scales=[3])
    torch.testing.assert_close(logits(one, tokens), logits(se, tokens), rtol=0, atol=0)


@pytest.mark.slow
def test_dpe_detect_end_to_end_on_a_local_model_and_text(tmp_path, capsys):
    """`hf-posext dpe-detect` with the real loaders: a saved tiny model and its tokenizer, a local
    text; the JSON it writes patches through `--knobs dpe:...=@FILE` and from Python."""
    from _evalkit import char_tokenizer

    from hf_posext import cli
    from hf_posext.evaluation.shared.inputs import parse_knobs

    folder = tmp_path / "tiny"
    tiny_model("llama", attn_implementation="sdpa").save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"word{i % 37} said kingly things" for i in range(300)))
    out = tmp_path / "found.json"
    assert cli.main(["dpe-detect", "--model", str(folder), "--dataset", str(text), "--target-length", "1024",
                     "--window", "16", "--groups", "4", "--shortest", "512", "--top-dims", "3",
                     "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    assert len(found["group_scales"]) == 4 and set(found["group_scales"]) <= {1, 2}
    assert len(found["key_dims"]) == 2 and all(len(h) == 3 for layer in found["key_dims"] for h in layer)
    assert len(out.with_suffix(".log.jsonl").read_text().splitlines()) == 4 * 2
    assert "written to" in capsys.readouterr().out
    knobs = parse_knobs(f"dpe:group_scales=@{out},dpe:key_dims=@{out}", ["dpe"])["dpe"]
    model = hf_posext.patch(tiny_model("llama", attn_implementation="sdpa"), "dpe", 16.0, window=16, **knobs)
    assert hf_posext.is_patched(model)

    # another dtype probes again (an answer can differ between dtypes) and resumes only its own rows
    assert found["dtype"] == "float32"
    for _ in range(2):
        assert cli.main(["dpe-detect", "--model", str(folder), "--dataset", str(text), "--target-length",
                         "1024", "--window", "16", "--groups", "4", "--shortest", "512",
                         "--top-dims", "3", "--dtype", "bfloat16", "--out", str(out)]) == 0
        rows = [json.loads(line) for line in out.with_suffix(".log.jsonl").read_text().splitlines()]
        assert len(rows) == 4 * 2 * 2
        assert sum(r["key"].endswith("-bfloat16") for r in rows) == 4 * 2
    assert json.loads(out.read_text())["dtype"] == "bfloat16"
