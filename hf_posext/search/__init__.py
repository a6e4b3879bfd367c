"""Search a portable `longrope` config (LongRoPE, Ding et al. 2024, arXiv 2402.13753, §3.2):
one rescale factor per rotary frequency and the attention factor, tuned on the perplexity at a
target length with the weights frozen; `hf-posext search` is its command line.

    run.py        one search run, for every algorithm: checks, budget, log and resume,
                  baseline, seeds, progress, the final full-length check (`run_search`)
    strategy.py   what an algorithm is to the run: a `Strategy` proposes, the run scores
    gradient.py   `Gradient`: Adam on the log-factors, one backward per step;
                  `search_factors` (`hf_posext.search_factors`) runs it
    evolution.py  `Evolution`: LongRoPE's evolutionary search, one forward per candidate
    space.py      the searched factors, the rotary module computing cos/sin from them, the seeds
    objective.py  the proxy objective: mean NLL over spans at their true positions
    needle.py     the needle-driven objective (LongRoPE2): answer-token loss of needle documents
    dpe.py        DPE's detection: per-group scales by a needle probe, key dimensions by q·k norm
    log.py        the JSON-lines log and the settings a resumed run must share
    saving.py     `save_best`: the best point as a checkpoint in its most portable exact form

The public API's entry point is `hf_posext.search_factors` (named so that it does not shadow
this package): `from hf_posext.search import run_search, Evolution` reads the package.
"""

from .evolution import Evolution
from .gradient import Gradient, search_factors
from .log import SearchLog, SearchSettings
from .run import SearchOptions, SearchResult, run_search
from .saving import SHORT_FACTORS, save_best
from .space import SEED_METHODS
from .strategy import Point, Strategy

__all__ = ["Evolution", "Gradient", "Point", "SEED_METHODS", "SHORT_FACTORS", "SearchLog",
           "SearchOptions", "SearchResult", "SearchSettings", "Strategy", "run_search", "save_best",
           "search_factors"]
