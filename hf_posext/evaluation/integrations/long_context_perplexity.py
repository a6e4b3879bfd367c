"""Long-context perplexity as an `evaluate` measurement module, computed by hf_posext.

    import evaluate, hf_posext.evaluation.integrations as m
    ppl = evaluate.load(m.MODULE)            # a local script: nothing is fetched
    out = ppl.compute(data=[text1, text2], model_id="embedded:smollm2-135m",
                      lengths=[4096, 16384], methods=["yarn"], factors=[2])

`evaluate.load` copies this file into its modules cache and imports it; all the work is
`hf_posext.evaluation.integrations.texts.evaluate_texts` (tokenise, keep the texts long enough for the
longest length, the perplexity grid with the sliding-window baseline and its ratios).
"""

import datasets
import evaluate

from hf_posext.evaluation.integrations.texts import COLUMNS, evaluate_texts

_DESCRIPTION = """Perplexity of a causal LM over long documents at several context lengths, for
the model as it is and extended with hf_posext's methods (PI, NTK, YaRN, attention-level ones),
with the same documents at every length, the unpatched model over the same tokens with a
sliding window of its trained length as a baseline, the ratio to it over all tokens and over
the tokens past the trained length, and the short-context regression at lengths up to it."""

_KWARGS_DESCRIPTION = """
Args:
    data (list of str): documents; those with fewer tokens than the longest length are skipped.
    model_id (str): a local folder, a Hub id, or "embedded:smollm2-135m".
    lengths (list of int): context lengths in tokens.
    methods (list of str): hf_posext methods (the unpatched model is always included).
    factors (list): scales s >= 1 and/or "auto" (s = length / trained length). Default ["auto"].
    knobs (dict): {"*" or method: {knob: value}}. max_docs (int): use at most this many.
    dtype (str): float32 (default), bfloat16 or float16. device (str): "cpu" (default), "cuda".
    gguf_file (str): the GGUF file inside model_id's folder, if the model is one.
Returns: one list per column (""" + ", ".join(COLUMNS) + """), one entry per grid row.
"""

_CITATION = """@misc{hf_posext, title={hf_posext: context extension for Hugging Face RoPE models}}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class LongContextPerplexity(evaluate.Measurement):
    def _info(self):
        return evaluate.MeasurementInfo(
            module_type="measurement", description=_DESCRIPTION, citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"data": datasets.Value("string")}))

    def _compute(self, data, model_id, lengths, methods=(), factors=("auto",), knobs=None,
                 max_docs=None, dtype="float32", device="cpu", gguf_file=None):
        return evaluate_texts(list(data), model_id, lengths, methods=methods, factors=factors,
                              knobs=knobs, max_docs=max_docs, dtype=dtype, device=device,
                              gguf_file=gguf_file)
