"""The run machinery every evaluation shares (perplexity, passkey, retrieval): the grid of cells,
resume and reuse, ranks, typed settings, what a result is, results files, the token cache, the
command-line inputs and the end-of-run tables and plots.

    grid.py         the grid: cells, resume, reuse, one forward per computation signature
    distributed.py  several processes, one grid (each rank a share)
    settings.py     the typed inputs of an evaluation (PerplexityGrid, RunInfo, the old-keyword guard)
    identity.py     what a result is: the keys that decide reuse
    record.py       the result record: each protocol's identity fields, the schema, `read_rows`
    store.py        results files (JSON, the source of truth, and a CSV view)
    summary.py      a run folder's summary.md / summary.json, read by `hf-posext compare`
    data.py         tokenise documents once, cache the token ids
    inputs.py       the `hf-posext` command-line inputs and their checks
    results.py      end-of-run tables and plots
"""
