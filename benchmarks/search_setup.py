"""What benchmarks/search.py runs and where its results go: the steps' command lines, targets,
lengths and paths, shared by the steps (search.py) and the report (search_report.py), so neither
imports the other's module for them."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "results" / "search-lear-16k"
RESULTS = HERE / "results" / "search.json"
BASELINE_CSV = HERE / "results" / "eval" / "long-context-code" / "perplexity.csv"
TUNE_ARGV = ["search", "--dataset", "embedded:shakespeare/king-lear", "--target-length", "16k", "--no-final-check",
             "--proxy-length", "4k", "--budget", "25m", "--lr", "0.1", "--out", str(OUT)]
TARGET, TRAINED = 16384, 8192
# 4x: the better algorithm of the 2x comparison (evolution) at 32k, proxy a quarter of the target
# as at 2x; the same held-out text and plain-transformers scorer.
OUT4 = HERE / "results" / "search-lear-32k"
TUNE4_ARGV = ["search", "--dataset", "embedded:shakespeare/king-lear", "--target-length", "32k", "--no-final-check",
              "--proxy-length", "8k", "--budget", "45m", "--algorithm", "evolution", "--out", str(OUT4)]
TARGET4 = 32768
MIX_DIR = HERE / ".tuning-mix"   # built by mix_texts(); ignored by git (derived from installed files)
OUT_MIX, OUT_MIX4 = HERE / "results" / "search-mix-16k", HERE / "results" / "search-mix-32k"
MIX_ARGV = ["search", "--dataset", str(MIX_DIR), "--max-docs", "2", "--target-length", "16k", "--no-final-check",
            "--proxy-length", "4k", "--budget", "30m", "--algorithm", "evolution", "--out", str(OUT_MIX)]
MIX4_ARGV = ["search", "--dataset", str(MIX_DIR), "--max-docs", "2", "--target-length", "32k", "--no-final-check",
             "--proxy-length", "8k", "--budget", "45m", "--algorithm", "evolution", "--out", str(OUT_MIX4)]
LENGTHS = (4096, 8192, 16384)   # short-context regression at <= L, the target at 2x
MAIN_ROWS = ("yarn (s=2)", "searched", "searched (gradient)", "searched (evolution)", "unpatched")
COMPARE = HERE / "results" / "search-compare"
COMPARE_BUDGET = 15.0   # minutes per algorithm, the shared baseline and seeds included
