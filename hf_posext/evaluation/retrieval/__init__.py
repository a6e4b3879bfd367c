"""RULER-style retrieval (arXiv 2404.06654): synthetic needle tasks in a repeated-noise or
document haystack, many seeded trials per (method, factor, length, depth), accuracy with
Wilson intervals and an effective length per method (docs/retrieval.md).

    tasks.py     what is hidden and asked, per task      haystack.py  noise / document pieces
    prompt.py    a cell's shared prefix and suffixes     decode.py    prefix-cached greedy answers
    stats.py     scoring, Wilson, effective length       settings.py  RetrievalGrid
    run.py       evaluate_retrieval (on grid.run_grid)   plots.py     plots and summary table
    blocks.py    trials added in blocks of seeds: checked, merged
    reserved.py  a trial's cache layers with reserved capacity: decode steps write in place
    report.py    lm-eval's RULER records kept compactly, tables beside the suite's rows
    sequential.py  the stopping rule: Clopper–Pearson at levels exact over the looks
    schedule.py  evaluate_sequential: looks where decisions are open, a budget
    designs.py   the sequential design against the fixed one on stored rows: a replay, a report
    vllm_engine.py  `--engine vllm`: serve's arguments per cell, a worker in vLLM's Python
    vllm_worker.py  that worker (run by path there; imports only vllm)
    probe.py     why a needle is missed: the answer's loss, the attention on the needle, the answer
"""

from .decode import answer_cell
from .haystack import Haystack, load_haystack, noise_haystack
from .prompt import CellPrompts, build_cell
from .run import evaluate_retrieval
from .settings import RetrievalGrid
from .stats import effective_length, string_match_all, wilson
from .tasks import TASKS, get_task

__all__ = ["CellPrompts", "Haystack", "RetrievalGrid", "TASKS", "answer_cell", "build_cell",
           "effective_length", "evaluate_retrieval", "get_task", "load_haystack",
           "noise_haystack", "string_match_all", "wilson"]
