"""Evaluation run by other tools' frameworks: lm-evaluation-harness and Hugging Face `evaluate`.

    harness.py        the `hf-posext` model type of lm-evaluation-harness (patched models in lm-eval)
    harness_vllm.py   the `hf-posext-vllm` type: lm-eval's vLLM model with serve's overrides
    texts.py          perplexity of texts given in Python (what the `evaluate` module runs)
    long_context_perplexity.py  the `evaluate` measurement module (needs `pip install hf_posext[evaluate]`):

    import evaluate
    from hf_posext.evaluation.integrations import MODULE
    ppl = evaluate.load(MODULE)     # a local script: evaluate fetches nothing
    ppl.compute(data=texts, model_id="embedded:smollm2-135m", lengths=[4096, 16384],
                methods=["yarn"], factors=[2])

The module (a script `evaluate.load` copies and imports) is a thin `evaluate.Measurement` over
`hf_posext.evaluation.integrations.texts.evaluate_texts`; this package only says where it is and
imports none of the three integrations (each needs its own extra: lm-eval, vLLM, evaluate).
"""

from pathlib import Path

MODULE = str(Path(__file__).resolve().parent / "long_context_perplexity.py")
