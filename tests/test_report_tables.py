"""The report tables the benchmark pages are made of, on rows and lm-eval records written by hand:
the ratio-to-sliding table (`results.ratio_table`, docs/results.md's demo table) and the lm-eval
records and tables beside the retrieval suite (`evaluation/retrieval/report.py`; the same on real
lm-eval runs: test_retrieval_docs.py). Expected values are worked out by hand."""

from __future__ import annotations

import json

import pytest

from hf_posext.evaluation.shared.results import ratio_table
from hf_posext.evaluation.retrieval import report


def _row(method, length, protocol, perplexity, knobs=""):
    return {"method": method, "length": length, "protocol": protocol, "perplexity": perplexity,
            "knobs": knobs, "trained_length": 8, "window": 8, "stride": 4, "factor_spec": "auto"}


def test_ratio_table_divides_by_the_sliding_baseline_and_bolds_the_best():
    rows = [_row("none", 16, "truncate", 40.0), _row("yarn", 16, "truncate", 10.0, "beta_fast=32,logn=1"),
            _row("none", 16, "baseline", 20.0), _row("none", 32, "truncate", 80.0),
            _row("yarn", 32, "truncate", 20.0, "beta_fast=32,logn=1"), _row("none", 32, "baseline", 25.0)]
    assert ratio_table(rows, (16, 32)).splitlines() == [
        "| method | 16 (s = 2) | 32 (s = 4) | ratio to sliding @16 | @32 |", "|---|---|---|---|---|",
        "| none (unpatched) | 40.00 | 80.00 | 2.000 | 3.200 |",                 # 40 / 20, 80 / 25
        "| yarn (beta_fast=32, logn=true) | 10.00 | 20.00 | **0.500** | **0.800** |",
        "| none, sliding 8 window (stride 4) | 20.00 | 25.00 |  |  |"]
    assert all("ratio" not in r for r in rows)          # the caller's rows are left as they were


def _lm_eval_folder(root, samples):
    """What `lm-eval --output_path root --log_samples` writes for niah_single_1 at 1,024 tokens."""
    run = root / "model_name"
    run.mkdir(parents=True)
    (run / "results_2026-01-01.json").write_text(json.dumps({
        "config": {"model_args": {"method": "yarn"}, "limit": 2}, "lm_eval_version": "0.4.9",
        "total_evaluation_time_seconds": "61.04", "configs": {"niah_single_1": {"generation_kwargs": {"max_gen_toks": 4}}},
        "results": {"niah_single_1": {"alias": "niah_single_1", "1024,none": 0.5, "1024_stderr,none": "N/A"}}}))
    (run / "samples_niah_single_1_2026-01-01.jsonl").write_text("\n".join(json.dumps(s) for s in samples))
    return root


def _sample(needle_at: int, answer: str, score: float):
    text = "x" * needle_at + "One of the special magic numbers is 1234567." + "y" * (100 - needle_at)
    return {"doc": {"max_length": 1024, "length": 1000, "input": text, "outputs": ["1234567"]},
            "resps": [[f"  {answer}\n more"]], "1024": score}


def test_lm_eval_records_are_kept_without_prompts_and_set_beside_the_suite(tmp_path):
    folder = _lm_eval_folder(tmp_path / "lm", [_sample(0, "1234567", 1.0), _sample(72, "42", 0.0)])
    out = tmp_path / "grid"
    out.mkdir()
    kept = json.loads(report.import_lm_eval([folder], out, "lm-eval ...").read_text())
    assert kept["command"] == "lm-eval ..." and "input" not in json.dumps(kept)
    run, = kept["runs"]
    assert (run["model_args"], run["lm_eval_version"], run["limit"], run["seconds"]) == ({"method": "yarn"}, "0.4.9", 2, 61.0)
    assert run["results"] == {"1024,none": 0.5, "1024_stderr,none": "N/A"}
    # depth: where the needle's sentence starts, over the haystack's characters (72 of 144)
    assert [(s["depth"], s["response"], s["score"]) for s in run["samples"]] == [(0.0, "1234567 more", 1.0),
                                                                                 (0.5, "42 more", 0.0)]
    rows = [{"method": "yarn", "task": "single_needle", "length": 1024, "depth": d, "correct": c, "trials": 2}
            for d, c in ((0.0, 2), (1.0, 1))]
    head, rule, line = report.side_by_side(rows, kept)
    assert "`single_needle` (depths 0, 1)" in head and rule.count("---") == 4
    assert line.startswith("| 1k | 3/4 = 0.75 [") and "| 1/2 = 0.50 [" in line and line.endswith("| 1.0 min |")
    with pytest.raises(ValueError, match="ran no niah_multikey_2, niah_multikey_3, ruler_vt, ruler_cwe, ruler_fwe"):
        report.import_lm_eval_ruler([folder], out, "lm-eval ...")
    with pytest.raises(ValueError, match="expected one lm-eval results_.*found 0"):
        report.import_lm_eval([tmp_path / "grid"], out, "lm-eval ...")


def test_cost_lines_estimate_one_prefill_per_trial_from_the_depth_zero_cell():
    rows = [{"method": "yarn", "length": 8192, "depth": 0.0, "trials": 2, "seconds": 60.0},
            {"method": "yarn", "length": 8192, "depth": 0.5, "trials": 2, "seconds": 36.0}]
    # measured 96 s; one prefill per trial: 60 s / 2 trials x 4 trials = 120 s; 96 / 120 = 0.80
    assert report.cost_lines(rows)[2:] == ["| yarn | 8k | 4 | 1.6 min | 2.0 min | 0.80 |",
                                           "| all | | 4 | **1.6 min** | 2.0 min | 0.80 |"]
