"""Why does an arm miss the needle? Per arm, length, task, depth and trial seed:
the right answer's loss teacher-forced after the prompt, the attention the prompt's last position
pays to the needle (beside a control span of equal length far from it), and the greedy answer,
scored by the suite (`hf_posext.evaluation.retrieval.probe`; prompts by the suite's builder on
--dataset's haystack, RULER's noise by default, trial seed s = the suite's trial s).

Arms (--arms, comma-separated): `free` = the embedded model extended with YaRN s = --factor, as
finetune_retrieval.py builds its training-free arm; `base` = the embedded model as trained
(within its trained length); `label=folder` (or a bare folder) = a saved
checkpoint (config.json inside, e.g. <arm>/train/final), loaded as saved (its rope config).
Every setting is checked, and every prompt built, before a model loads.

Writes --out/rows.jsonl (one row per trial, with the per-layer masses; a rerun skips the cells
done with the same weights: path, size and mtime) and --out/report.md (a table per cell: k/n right, the answer's NLL, needle vs control mass).

    nice -n 10 python benchmarks/needle_diagnosis.py --arms free,docs=DIR,mix=DIR --out DIR
    python benchmarks/needle_diagnosis.py --smoke --out DIR    # a tiny random model, for the tests
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hf_posext.evaluation.shared.inputs import comma_items

SMOKE = dict(lengths="512", tasks="single_needle,niah_single", depths="0.5", seeds="0,1")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="needle_diagnosis.py", description=__doc__.split("\n")[0])
    p.add_argument("--arms", default="free", help="free, label=folder or folder; comma-separated")
    p.add_argument("--out", type=Path, required=True, help="results folder (rows.jsonl, report.md)")
    p.add_argument("--lengths", default="8192,16384", help="prompt lengths (tokens)")
    p.add_argument("--tasks", default="single_needle,niah_single", help="retrieval suite tasks")
    p.add_argument("--depths", default="0.25,0.5", help="needle depths in [0, 1]")
    p.add_argument("--seeds", default="0,1,2", help="trial seeds (the suite's trials 0, 1, ...)")
    p.add_argument("--model", default="embedded:smollm2-135m", help="the model `free` extends")
    p.add_argument("--dataset", default="noise", help="haystack: noise (RULER's), or any `hf-posext eval --dataset`")
    p.add_argument("--factor", type=float, default=2.0, help="`free`: YaRN s")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--answer-tokens", type=int, default=10, help="greedy tokens kept per trial")
    p.add_argument("--smoke", action="store_true", help="a tiny random Llama saved under --out (the tests)")
    args = p.parse_args(argv)
    try:
        check(args)
    except ValueError as error:
        p.error(str(error))
    return args


def check(args) -> None:
    """Every setting, and every cell's prompts (args.cells), before any model loads."""
    from hf_posext.evaluation.retrieval.haystack import load_haystack
    from hf_posext.evaluation.retrieval.prompt import build_cell
    from hf_posext.evaluation.retrieval.tasks import get_task
    if args.smoke:
        args.arms = f"tiny={smoke_model(args.out)}"
        vars(args).update(SMOKE)
    try:
        args.length_list = sorted({int(x) for x in comma_items(args.lengths)})
        args.depth_list = sorted({float(x) for x in comma_items(args.depths)})
        args.seed_list = [int(x) for x in comma_items(args.seeds)]
    except ValueError:
        raise ValueError("--lengths and --seeds take integers, --depths numbers, comma-separated") from None
    if not args.length_list or min(args.length_list) < 1 or not args.depth_list or not args.seed_list:
        raise ValueError("--lengths, --depths and --seeds need at least one value each (lengths >= 1)")
    if not all(0 <= d <= 1 for d in args.depth_list):
        raise ValueError(f"--depths {args.depths!r}: a depth is a fraction of the haystack, in [0, 1]")
    if len(set(args.seed_list)) != len(args.seed_list) or min(args.seed_list) < 0:
        raise ValueError(f"--seeds {args.seeds!r}: give distinct integers >= 0")
    if args.answer_tokens < 1:
        raise ValueError("--answer-tokens must be >= 1")
    if not comma_items(args.tasks):
        raise ValueError("--tasks is empty: give retrieval suite tasks, e.g. single_needle,niah_single")
    args.task_list = [get_task(t) for t in comma_items(args.tasks)]
    args.arm_list = [arm(a, args) for a in comma_items(args.arms)]
    labels = [a["label"] for a in args.arm_list]
    if not labels or len(set(labels)) != len(labels):
        raise ValueError(f"--arms {args.arms!r}: give one or more arms with distinct labels (label=folder)")
    args.cells = {}
    for a in args.arm_list:
        if max(args.length_list) > a["max_length"]:
            raise ValueError(f"--lengths {max(args.length_list)} is past what arm {a['label']} allows "
                             f"({a['max_length']}, its max_position_embeddings); use shorter --lengths")
        tok = a["tokenizer"]
        hay = load_haystack(tok, args.dataset, max(args.length_list))
        for n in args.length_list:
            for task in args.task_list:
                for d in args.depth_list:   # a prompt that fits the length: build_cell checks
                    args.cells[a["label"], n, task.name, d] = build_cell(tok, task, hay, n, d, args.seed_list)


def arm(text: str, args) -> dict:
    """An arm: its label, how it loads, its tokenizer and the longest length its config allows."""
    from transformers import AutoConfig, AutoTokenizer

    from hf_posext.data import embedded
    if text == "base":
        return {"label": "base", "path": "base", "stamp": f"{args.model} as trained",
                "tokenizer": embedded.load_tokenizer(args.model), "max_length": embedded.TRAINED_CONTEXT}
    if text == "free":
        trained = (embedded.TRAINED_CONTEXT if args.model.startswith("embedded:")
                   else AutoConfig.from_pretrained(args.model).max_position_embeddings)
        return {"label": "free", "path": "free", "stamp": f"{args.model} yarn {args.factor:g}",
                "tokenizer": embedded.load_tokenizer(args.model),
                "max_length": int(trained * args.factor)}
    label, _, folder = text.rpartition("=")
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(f"--arms {text}: no config.json in {path}; give free or a saved checkpoint folder "
                         "(e.g. <arm>/train/final)")
    config = AutoConfig.from_pretrained(path)
    weights = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    stamp = ",".join(f"{w.name}:{w.stat().st_size}:{w.stat().st_mtime_ns}" for w in weights)
    # stored relative to the working directory when inside it: rows name no machine's folders
    here, full = Path.cwd(), path.resolve()
    shown = full.relative_to(here) if full.is_relative_to(here) else full
    return {"label": label or path.name, "path": str(shown), "stamp": stamp,
            "tokenizer": AutoTokenizer.from_pretrained(path), "max_length": int(config.max_position_embeddings)}


def smoke_model(out: Path) -> Path:
    """A tiny random Llama with the embedded tokenizer, saved once under `out` (loaded with SDPA)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_posext.data import embedded
    folder = out / "smoke-model"
    if not (folder / "config.json").is_file():
        tok = embedded.load_tokenizer()
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=len(tok),
                                     max_position_embeddings=1024)).save_pretrained(folder)
        tok.save_pretrained(folder)
    return folder


def load(a: dict, args):
    import torch
    from transformers import AutoModelForCausalLM

    from hf_posext.data import embedded
    dtype = getattr(torch, args.dtype)
    if a["path"] == "base":
        return embedded.load_model(name=args.model, dtype=dtype).eval()
    if a["path"] == "free":   # finetune_retrieval.extended_copy's model, not saved
        return embedded.load_model("yarn", args.factor, name=args.model, dtype=dtype).eval()
    return AutoModelForCausalLM.from_pretrained(a["path"], dtype=dtype, attn_implementation="sdpa").eval()


def main(argv=None) -> int:
    from hf_posext.evaluation.retrieval.decode import SharedPrefix
    from hf_posext.evaluation.retrieval.probe import probe_cell
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows_path = args.out / "rows.jsonl"
    rows = [json.loads(line) for line in rows_path.open()] if rows_path.exists() else []
    # a row counts for the same arm weights (path, size, mtime), dtype and cell
    done = {(r["arm"], r["path"], r["stamp"], r["dtype"], r.get("haystack", "noise"), r["length"], r["task"], r["depth"],
             r["seed"]) for r in rows}
    for a in args.arm_list:
        def missing(key, a=a) -> list[int]:   # the cell's trials (indices) without a row yet
            return [i for i, s in enumerate(args.seed_list)
                    if (a["label"], a["path"], a["stamp"], args.dtype, args.dataset, *key[1:], s) not in done]
        todo = [k for k in args.cells if k[0] == a["label"] and missing(k)]
        if not todo:
            continue
        model, shared = load(a, args), SharedPrefix()   # depths ascending: a prefix extends the last one
        for key in todo:
            label, length, task, depth = key
            cell, only = args.cells[key], missing(key)   # a cell re-run for a new seed probes that seed only
            print(f"{label} {length} {task} depth {depth}: {len(only)} trials", flush=True)
            found = probe_cell(model, a["tokenizer"], cell, cell_task(args, task).multi_answer,
                               shared=(shared, label), answer_tokens=args.answer_tokens, only=only)
            with rows_path.open("a") as f:
                for r in found:
                    r = {"arm": label, "path": a["path"], "stamp": a["stamp"], "dtype": args.dtype,
                         "haystack": args.dataset, "length": length, "task": task, "depth": depth, **r}
                    f.write(json.dumps(r) + "\n")
                    rows.append(r)
        del model
    (args.out / "report.md").write_text(report(rows, args))
    print(f"report: {args.out / 'report.md'}", flush=True)
    return 0


def cell_task(args, name: str):
    return next(t for t in args.task_list if t.name == name)


def report(rows: list[dict], args) -> str:
    """One line per (arm, length, task, depth): the rows of this run's arms (as they are now) and
    dtype, pooled over the trial seeds asked for."""
    cells: dict[tuple, list[dict]] = {}
    arms = {(a["label"], a["path"], a["stamp"], args.dtype) for a in args.arm_list}
    for r in rows:
        if (r["arm"], r["path"], r["stamp"], r["dtype"]) in arms and r["seed"] in args.seed_list \
                and r.get("haystack", "noise") == args.dataset:
            cells.setdefault((r["arm"], r["length"], r["task"], r["depth"]), []).append(r)

    def mean(rs, k):
        return sum(r[k] for r in rs) / len(rs)
    lines = ["| arm | length | task | depth | right | answer NLL / token | first token NLL | needle mass, mean "
             "over layers | needle mass, top layer (layer) | control mass, mean | control, same layer | greedy answers |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (label, length, task, depth), rs in sorted(cells.items()):
        top = max(range(len(rs[0]["needle_mass"])), key=lambda i: sum(r["needle_mass"][i] for r in rs))
        answers = " / ".join(f"`{r['output'][:40]}`".replace("|", "\\|") for r in rs)
        lines.append(f"| {label} | {length} | {task} | {depth:g} | {sum(r['correct'] for r in rs)}/{len(rs)} | "
                     f"{mean(rs, 'nll'):.2f} | {mean(rs, 'nll_first'):.2f} | {mean(rs, 'needle_mean'):.4f} | "
                     f"{sum(r['needle_mass'][top] for r in rs) / len(rs):.4f} ({top}) | {mean(rs, 'control_mean'):.4f} | "
                     f"{sum(r['control_mass'][top] for r in rs) / len(rs):.4f} | {answers} |")
    where = "RULER's noise haystack" if args.dataset == "noise" else f"the haystack {Path(args.dataset).name}"
    head = (f"Needle diagnosis, {args.dtype}, trial seeds {','.join(map(str, args.seed_list))}, {where} "
            "(benchmarks/needle_diagnosis.py). NLL: of the right answer's tokens teacher-forced after "
            "the prompt (a leading space token left out), mean per token and the first. Masses: the attention weight the prompt's last position "
            "puts on the needle's tokens, summed over them, averaged over heads; per layer, then the mean over "
            "layers and the layer with the most (pooled over the trials); the control is a span of equal "
            "length at 3/4 of the prompt (1/4 for a needle past 3/5), read at the same layers.\n\n")
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
