"""Perplexity across context lengths: the chunked loss, the truncate and sliding-window
protocols (with the sliding-window baseline) and per-position NLL (docs/evaluation.md).

    loss.py     chunked causal-LM NLL without the full logits; peak memory
    run.py      the truncate and sliding-window protocols, and the perplexity grid's cells
                (evaluate_perplexity, on shared/grid.py's run_grid)
    buckets.py  per-position NLL summed into position buckets
"""
