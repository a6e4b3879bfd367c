"""Long-context evaluation: perplexity across context lengths (truncate and sliding-window
protocols, with the sliding-window baseline), passkey retrieval and the RULER-style retrieval
suite (`retrieval/`, docs/retrieval.md), with results files, tables
and plots. The `hf-posext` CLI (`hf_posext.cli`) drives these functions; they also work on any
loaded model (docs/evaluation.md).

    shared/         the run machinery every evaluation shares: the grid (cells, resume, reuse),
                    ranks, settings, identity, results files, token cache, CLI inputs, tables
    perplexity/     chunked loss, the truncate and sliding-window protocols, position buckets
    passkey.py      passkey retrieval (Landmark Attention §4.2), a task of the retrieval suite
    retrieval/      the RULER-style retrieval suite: tasks, haystacks, prefix-cached decoding,
                    Wilson statistics, effective length, plots (docs/retrieval.md)
    integrations/   lm-evaluation-harness's model types and the `evaluate` measurement module


    from hf_posext.evaluation import PerplexityGrid, evaluate_perplexity
    rows = evaluate_perplexity(model, docs, PerplexityGrid(["linear", "yarn"], [4096, 16384]))
"""

from .shared.data import TextSource, TokenCache, load_documents, select_documents
from .shared.distributed import Ranks
from .shared.grid import Cell, knob_names, method_factors, run_grid
from .perplexity.loss import PeakMemory, causal_targets, chunked_nll
from .passkey import build_prompt, evaluate_passkey, passkey_for_seed
from .perplexity.run import evaluate_perplexity, sliding_nll, sliding_windows, truncate_nll
from .retrieval import RetrievalGrid, evaluate_retrieval
from .shared.results import format_table, plot_passkey_heatmap, plot_perplexity, print_table
from .shared.settings import DEFAULT_STRIDE, PROTOCOLS, PerplexityGrid, RunInfo
from .shared.store import ResultsError, ResultsStore, RowStore

__all__ = ["Cell", "DEFAULT_STRIDE", "PROTOCOLS", "PeakMemory", "PerplexityGrid", "Ranks",
           "RetrievalGrid", "evaluate_retrieval",
           "ResultsError", "ResultsStore", "RowStore", "RunInfo", "TextSource", "TokenCache", "build_prompt",
           "causal_targets", "chunked_nll", "evaluate_passkey", "evaluate_perplexity",
           "format_table", "knob_names", "load_documents", "method_factors", "passkey_for_seed",
           "plot_passkey_heatmap", "plot_perplexity", "print_table", "run_grid",
           "select_documents", "sliding_nll", "sliding_windows", "truncate_nll"]
