"""Long-context evaluation: perplexity across context lengths (truncate and sliding-window
protocols, with the sliding-window baseline), passkey retrieval and the RULER-style retrieval
suite (`retrieval/`, docs/retrieval.md), with results files, tables
and plots. The `hf-posext` CLI (`hf_posext.cli`) drives these functions; they also work on any
loaded model (docs/evaluation.md).

    shared/         the run machinery every evaluation shares: the grid (cells, resume, reuse),
                    ranks, settings, identity, results files, token cache, CLI inputs, tables
    lm_head.py      a family's logits from its decoder's hidden states, a chunk at a time, as its
                    own forward computes them (Granite's scaling, Gemma's soft cap, ...)
    perplexity/     chunked loss, the truncate and sliding-window protocols, position buckets
    passkey.py      passkey retrieval (Landmark Attention §4.2), a task of the retrieval suite
    retrieval/      the RULER-style retrieval suite: tasks, haystacks, prefix-cached decoding,
                    Wilson statistics, effective length, plots (docs/retrieval.md)
    integrations/   lm-evaluation-harness's model types and the `evaluate` measurement module


    from hf_posext.evaluation import PerplexityGrid, evaluate_perplexity
    rows = evaluate_perplexity(model, docs, PerplexityGrid(["linear", "yarn"], [4096, 16384]))
"""

# What a user calls: the evaluations, their grids and run settings, documents, and the result
# record with its reader. The machinery (the grid runner, ranks, the chunked loss, plots) stays
# importable from its module (`evaluation.shared.grid`, `evaluation.perplexity.loss`, ...).
from .shared.data import TextSource, TokenCache, load_documents, select_documents
from .passkey import evaluate_passkey
from .perplexity.run import evaluate_perplexity
from .retrieval import RetrievalGrid, evaluate_retrieval
from .shared.record import RecordType, read_rows
from .shared.results import format_table
from .shared.settings import PerplexityGrid, RunInfo
from .shared.store import ResultsError, ResultsStore

__all__ = ["PerplexityGrid", "RecordType", "ResultsError", "ResultsStore", "RetrievalGrid", "RunInfo",
           "TextSource", "TokenCache", "evaluate_passkey", "evaluate_perplexity", "evaluate_retrieval",
           "format_table", "load_documents", "read_rows", "select_documents"]
