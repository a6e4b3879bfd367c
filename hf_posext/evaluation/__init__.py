"""Long-context evaluation: perplexity across context lengths (truncate and sliding-window
protocols, with the sliding-window baseline), passkey retrieval and the RULER-style retrieval
suite (`retrieval/`, docs/retrieval.md), with results files, tables
and plots. The `hf-posext` CLI (`hf_posext.cli`) drives these functions; they also work on any
loaded model (docs/evaluation.md).

    loss.py         chunked causal-LM NLL without the full logits; peak memory
    perplexity.py   the truncate and sliding-window protocols, and the perplexity grid's cells
    passkey.py      passkey retrieval (Landmark Attention §4.2)
    buckets.py      per-position NLL summed into position buckets
    grid.py         the grid shared by perplexity and passkey: cells, resume, reuse
    distributed.py  several processes, one grid (each rank a share)
    settings.py     the typed inputs of a perplexity evaluation
    identity.py     what a result is: the keys that decide reuse
    store.py        results files (JSON, the source of truth, and a CSV view)
    results.py      end-of-run tables and plots
    data.py         tokenise documents once, cache the token ids
    texts.py        perplexity of texts given in Python (what the `evaluate` module runs)
    inputs.py       the `hf-posext` command-line inputs and their checks
    harness.py      the `hf-posext` model type of lm-evaluation-harness (patched models in lm-eval)
    harness_vllm.py the `hf-posext-vllm` type: lm-eval's vLLM model with serve's overrides
    retrieval/      the RULER-style retrieval suite: tasks, haystacks, prefix-cached decoding,
                    Wilson statistics, effective length, plots (docs/retrieval.md)
    measurement/    the `evaluate` measurement module


    from hf_posext.evaluation import PerplexityGrid, evaluate_perplexity
    rows = evaluate_perplexity(model, docs, PerplexityGrid(["linear", "yarn"], [4096, 16384]))
"""

from .data import TextSource, TokenCache, load_documents, select_documents
from .distributed import Ranks
from .grid import Cell, knob_names, method_factors, run_grid
from .loss import PeakMemory, causal_targets, chunked_nll
from .passkey import build_prompt, evaluate_passkey, passkey_for_seed
from .perplexity import evaluate_perplexity, sliding_nll, sliding_windows, truncate_nll
from .retrieval import RetrievalGrid, evaluate_retrieval
from .results import format_table, plot_passkey_heatmap, plot_perplexity, print_table
from .settings import DEFAULT_STRIDE, PROTOCOLS, PerplexityGrid, RunInfo
from .store import ResultsError, ResultsStore, RowStore

__all__ = ["Cell", "DEFAULT_STRIDE", "PROTOCOLS", "PeakMemory", "PerplexityGrid", "Ranks",
           "RetrievalGrid", "evaluate_retrieval",
           "ResultsError", "ResultsStore", "RowStore", "RunInfo", "TextSource", "TokenCache", "build_prompt",
           "causal_targets", "chunked_nll", "evaluate_passkey", "evaluate_perplexity",
           "format_table", "knob_names", "load_documents", "method_factors", "passkey_for_seed",
           "plot_passkey_heatmap", "plot_perplexity", "print_table", "run_grid",
           "select_documents", "sliding_nll", "sliding_windows", "truncate_nll"]
