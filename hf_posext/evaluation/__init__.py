"""Long-context evaluation: perplexity across context lengths (truncate and sliding-window
protocols, with the sliding-window baseline), passkey retrieval and the RULER-style retrieval
suite (`retrieval/`, docs/retrieval.md), with results files, tables
and plots. The `hf-posext` CLI (`hf_posext.cli`) drives these functions; they also work on any
loaded model (docs/evaluation.md):

    from hf_posext.evaluation import PerplexityGrid, evaluate_perplexity
    rows = evaluate_perplexity(model, docs, PerplexityGrid(["linear", "yarn"], [4096, 16384]))
"""

from .data import TextSource, TokenCache, load_documents, select_documents
from .distributed import Ranks
from .grid import Cell, knob_names, method_factors, run_grid
from .loss import PeakMemory, causal_targets, chunked_nll
from .passkey import build_prompt, evaluate_passkey, passkey_for_seed
from .perplexity import cell_nll, evaluate_perplexity, sliding_nll, sliding_windows, truncate_nll
from .retrieval import RetrievalGrid, evaluate_retrieval
from .results import format_table, plot_passkey_heatmap, plot_perplexity, print_table
from .settings import DEFAULT_STRIDE, PROTOCOLS, PerplexityGrid, RunInfo
from .store import ResultsError, ResultsStore, RowStore

__all__ = ["Cell", "DEFAULT_STRIDE", "PROTOCOLS", "PeakMemory", "PerplexityGrid", "Ranks",
           "RetrievalGrid", "evaluate_retrieval",
           "ResultsError", "ResultsStore", "RowStore", "RunInfo", "TextSource", "TokenCache", "build_prompt",
           "causal_targets", "cell_nll", "chunked_nll", "evaluate_passkey", "evaluate_perplexity",
           "format_table", "knob_names", "load_documents", "method_factors", "passkey_for_seed",
           "plot_passkey_heatmap", "plot_perplexity", "print_table", "run_grid",
           "select_documents", "sliding_nll", "sliding_windows", "truncate_nll"]
