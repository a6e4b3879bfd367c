"""Long-context evaluation: perplexity across context lengths (truncate and sliding-window
protocols) and passkey retrieval, with results files, tables and plots. The `hf-posext` CLI
(`hf_posext.cli`) drives these functions; they also work on any loaded model:

    from hf_posext.evaluation import evaluate_perplexity, ResultsStore
    rows = evaluate_perplexity(model, docs, methods=["linear", "yarn"], lengths=[4096, 16384])
"""

from .data import TextSource, TokenCache, load_documents, select_documents
from .loss import PeakMemory, causal_targets, chunked_nll
from .passkey import build_prompt, evaluate_passkey, passkey_for_seed
from .perplexity import (DEFAULT_STRIDE, PROTOCOLS, evaluate_perplexity, plan_cells, sliding_nll,
                         sliding_windows, truncate_nll)
from .results import ResultsStore, format_table, plot_passkey_heatmap, plot_perplexity, print_table

__all__ = ["DEFAULT_STRIDE", "PROTOCOLS", "PeakMemory", "ResultsStore", "TextSource", "TokenCache",
           "build_prompt", "causal_targets", "chunked_nll", "evaluate_passkey", "evaluate_perplexity",
           "format_table", "load_documents", "passkey_for_seed", "plan_cells", "plot_passkey_heatmap",
           "plot_perplexity", "print_table", "select_documents", "sliding_nll", "sliding_windows",
           "truncate_nll"]
