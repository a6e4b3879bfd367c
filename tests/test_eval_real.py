"""On the embedded SmolLM2-135M (slow: ~30 s to load): the chunked loss against transformers'
plain loss with the real 49k vocabulary and tied head, and passkey prompts the real model can
answer inside its trained window (a broken prompt or answer parser would score 0)."""

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real():
    embedded = pytest.importorskip("hf_posext.data.embedded")
    try:
        embedded.model_location()
        embedded.play_paths()
    except (ModuleNotFoundError, FileNotFoundError) as err:
        pytest.skip(str(err))
    return embedded.load_model(dtype=torch.float32).eval(), embedded.load_tokenizer()


@pytest.mark.slow
def test_chunked_loss_matches_plain_loss_on_the_real_model(real):
    from hf_posext.data.embedded import play_paths
    from hf_posext.evaluation.perplexity.loss import causal_targets, chunked_nll

    model, tok = real
    ids = torch.tensor(tok(play_paths()[0].read_text())["input_ids"][:1024])
    nll, n = chunked_nll(model, ids, causal_targets(ids), chunk_size=300)
    with torch.no_grad():
        plain = model(ids[None], labels=ids[None]).loss.item()
    assert n == 1023 and nll / n == pytest.approx(plain, rel=1e-4)


@pytest.mark.slow
def test_passkey_inside_the_trained_window(real):
    from hf_posext.evaluation import RetrievalGrid, evaluate_passkey

    model, tok = real
    # depths 0 and 0.5: at depth 1 the passkey's wording is where this 135M model fails by itself
    # (docs/retrieval_measurements.md, "What the grid says"); with the answer reserved within the length
    # (layout 2) it answers 'the pass key. The pass key' there at 1k on transformers 4.57, 60494
    # on 5.x: the model's margin, not the pipeline this test checks
    rows = evaluate_passkey(model, tok,
                            RetrievalGrid(methods=[], lengths=[1024], depths=[0.0, 0.5],
                                          seeds=[0, 1]),
                            progress=False)
    accuracy = sum(r["correct"] for r in rows) / sum(r["seeds"] for r in rows)
    assert accuracy >= 0.8, [r["answers"] for r in rows]
