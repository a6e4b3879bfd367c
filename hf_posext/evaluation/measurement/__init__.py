"""hf_posext's `evaluate` measurement module (needs `pip install hf_posext[evaluate]`):

    import evaluate
    from hf_posext.evaluation.measurement import MODULE
    ppl = evaluate.load(MODULE)     # a local script: evaluate fetches nothing
    ppl.compute(data=texts, model_id="embedded:smollm2-135m", lengths=[4096, 16384],
                methods=["yarn"], factors=[2])

The module (long_context_perplexity.py, a script `evaluate.load` copies and imports) is a thin `evaluate.Measurement`
over `hf_posext.evaluation.texts.evaluate_texts`; this package only says where it is.
"""

from pathlib import Path

MODULE = str(Path(__file__).resolve().parent / "long_context_perplexity.py")
