"""Adversarial probe (issue 17): bad inputs over the API, the CLI (`eval`, `passkey`), loading,
the recipe and results folders, each classified

    good  one-line error naming the problem, raised before any weights load
    weak  an error, but with a traceback / several lines / after weights loaded / a foreign type
    bad   accepted (silently wrong), unsafe (a planted pickle ran), a crash of the wrong kind
          in the CLI (exit 0 or a traceback to the user), or a hang (timeout)

    PYTHONPATH=. python benchmarks/probe_bad_inputs.py [--out benchmarks/results/probe_bad_inputs.md]

Everything runs in this process on tiny random models (tests/_recipekit.py), with a SIGALRM
timeout per case. `check` cases of kind "report" must *say* what is wrong (the predicate
holds on the printed report) rather than refuse; a wrong report is bad.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import pickle
import shutil
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
import transformers  # noqa: E402
from _recipekit import load_finetune, make_assets, recipe_argv  # noqa: E402

import hf_posext  # noqa: E402
from hf_posext import cli  # noqa: E402
from hf_posext.errors import PosextError  # noqa: E402
from probe_issue27 import add_issue27_cases  # noqa: E402
from probe_portability import add_check_export_search_cases  # noqa: E402

TIMEOUT = 60
LOADS = {"n": 0}


def _count_loads():
    """Count weight loads (the 'heavy work' an early error must precede)."""
    real = transformers.PreTrainedModel.from_pretrained.__func__  # type: ignore[attr-defined]  # a classmethod's function

    def counted(cls, *a, **k):
        LOADS["n"] += 1
        return real(cls, *a, **k)
    transformers.PreTrainedModel.from_pretrained = classmethod(counted)  # type: ignore[method-assign,assignment]  # the probe counts loads


class Hang(Exception):
    pass


def _alarm(*_):
    raise Hang()


def run_case(fn, kind: str):
    """(verdict, detail) for one case that must be refused (kind "report": fn returns
    (ok, text): the report must say what is wrong)."""
    LOADS["n"] = 0
    if kind == "report":
        try:
            ok, text = fn()
        except BaseException as err:  # noqa: BLE001
            return "weak", f"raised {type(err).__name__}: {str(err)[:120]}"
        return ("good" if ok else "bad"), text[:150]
    err_buf = io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT)
    try:
        with contextlib.redirect_stderr(err_buf), contextlib.redirect_stdout(io.StringIO()):
            result = fn()
    except Hang:
        return "bad", f"hang > {TIMEOUT}s"
    except SystemExit as stop:     # the CLI's own exit
        signal.alarm(0)
        text = [ln for ln in err_buf.getvalue().splitlines() if "error" in ln.lower()]
        if stop.code in (0, None):
            return "bad", "exit 0"
        if "Traceback" in err_buf.getvalue() or len(text) != 1:
            return "weak", f"exit {stop.code}, {len(text)} error lines"
        late = LOADS["n"] > 0
        return ("weak" if late else "good"), f"exit {stop.code}: {text[0][:150]}" + (" (after load)" if late else "")
    except BaseException as err:   # noqa: BLE001 - classifying every outcome is the point
        signal.alarm(0)
        msg = str(err)
        if kind == "cli":          # a Python exception escaping main() is a traceback to the user
            return "weak", f"traceback {type(err).__name__}: {msg[:120]}"
        if not isinstance(err, (PosextError, ValueError, TypeError, FileNotFoundError)):
            return "weak", f"{type(err).__name__}: {msg[:120]}"
        if "\n" in msg.strip() or not msg:
            return "weak", f"multi-line {type(err).__name__}"
        if LOADS["n"] > 0:
            return "weak", f"after load: {type(err).__name__}: {msg[:120]}"
        return "good", f"{type(err).__name__}: {msg[:150]}"
    finally:
        signal.alarm(0)
    return "bad", f"accepted (returned {type(result).__name__})"


def build_cases(tmp: Path, assets: Path) -> list[tuple[str, str, object]]:
    from conftest import tiny_model
    from transformers import GPT2Config, GPT2LMHeadModel

    finetune = load_finetune()
    llama = str(assets / "llama")
    gpt2 = tmp / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(gpt2)
    shutil.copytree(assets / "llama", tmp / "tok_only", ignore=shutil.ignore_patterns("*.safetensors"))
    cases: list[tuple[str, str, object]] = []
    add = lambda name, kind, fn: cases.append((name, kind, fn))   # noqa: E731

    # --- API: patch ------------------------------------------------------------------------
    methods = list(hf_posext.METHODS)
    for m in methods:
        for f in (0.5, 0, -2, math.nan, math.inf, 1e308, "2", True, [2]):
            add(f"patch({m}, factor={f!r})", "api", lambda m=m, f=f: hf_posext.patch(tiny_model(), m, factor=f))
        add(f"patch({m}) on GPT-2", "api", lambda m=m: hf_posext.patch(
            GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)), m, factor=2))
    for name in (None, "", "yarnn", 3, "YaRN ", "none"):
        add(f"patch(method={name!r})", "api", lambda n=name: hf_posext.patch(tiny_model(), n, factor=2))
    knob_cases: list[tuple[str, dict]] = [
        ("rerope", dict(window=10_000)), ("rerope", dict(window=0)), ("rerope", dict(window=math.nan)),
        ("rerope", dict(window=2.5)), ("leaky_rerope", dict(leak=1)), ("leaky_rerope", dict(leak=math.nan)),
        ("leaky_rerope", dict(leak=-3)), ("leaky_rerope", dict(leak="auto", window=64)),
        ("self_extend", dict(group_size=0)), ("self_extend", dict(group_size=1.5)),
        ("self_extend", dict(window=10_000)), ("dual_chunk", dict(chunk_size=10_000)),
        ("dual_chunk", dict(chunk_size=16, local_window=16)), ("dual_chunk", dict(local_window=-1)),
        ("yarn", dict(beta_fast=1, beta_slow=32)), ("yarn", dict(beta_fast=math.nan)),
        ("yarn", dict(mscale_coefficient=-1)), ("yarn", dict(attention_factor=math.inf)),
        ("yarn", dict(original_max_position_embeddings=0)), ("yarn", dict(betafast=3)),
        ("linear", dict(beta_fast=64)), ("ntk", dict(window=8)), ("rerope", dict(logn="yes")),
        ("self_extend", dict(group_size="auto")), ("leaky_rerope", dict(leak="auto")),
    ]
    for m, kw in knob_cases:
        f = 1e9 if "auto" in kw.values() else 2
        add(f"patch({m}, {kw}, factor={f:g})", "api", lambda m=m, kw=kw, f=f: hf_posext.patch(tiny_model(), m, factor=f, **kw))
    for target in (0, -5, 10.5, math.nan, "64k"):
        add(f"patch(yarn, max_position_embeddings={target!r})", "api",
            lambda t=target: hf_posext.patch(tiny_model(), "yarn", max_position_embeddings=t))
    add("patch(yarn) with factor and target", "api",
        lambda: hf_posext.patch(tiny_model(), "yarn", factor=2, max_position_embeddings=4096))
    add("RopeExtensionConfig(yarn, nan)", "api", lambda: hf_posext.RopeExtensionConfig("yarn", math.nan))

    # --- API: from_pretrained / loading ------------------------------------------------------
    add("from_pretrained(missing dir)", "api", lambda: hf_posext.from_pretrained(str(tmp / "nope")))
    add("from_pretrained(gpt2, yarn)", "api", lambda: hf_posext.from_pretrained(str(gpt2), "yarn", factor=2))
    add("from_pretrained(factor without method)", "api", lambda: hf_posext.from_pretrained(llama, factor=2))
    add("from_pretrained(yarn, beta_fst=)", "api", lambda: hf_posext.from_pretrained(llama, "yarn", factor=2, beta_fst=3))
    add("from_pretrained(rerope window > L)", "api", lambda: hf_posext.from_pretrained(llama, "rerope", factor=2, window=10_000))
    add("from_pretrained(yarn, factor 0.5)", "api", lambda: hf_posext.from_pretrained(llama, "yarn", factor=0.5))
    add("from_pretrained(self_extend auto 1e9)", "api",
        lambda: hf_posext.from_pretrained(llama, "self_extend", factor=1e9, group_size="auto"))
    saved = tmp / "yarn_saved"
    m = transformers.AutoModelForCausalLM.from_pretrained(llama)
    hf_posext.patch(m, "yarn", factor=4)
    m.save_pretrained(saved)

    def edited(name, edit, src=saved):
        d = tmp / name
        shutil.copytree(src, d)
        c = json.loads((d / "config.json").read_text())
        edit(c)
        (d / "config.json").write_text(json.dumps(c))
        return str(d)

    def both(key, value):
        def edit(c):
            for k in ("rope_scaling", "rope_parameters"):
                if isinstance(c.get(k), dict):
                    c[k][key] = value
        return edit
    loads = {
        "edited factor (both layouts) vs block": both("factor", 8.0),
        "NaN factor (both layouts)": both("factor", math.nan),
        "inf rope_theta": both("rope_theta", math.inf),
        "rope_scaling factor only edited": lambda c: c["rope_scaling"].update(factor=8.0),
        "NaN factor without block": lambda c: (c.pop("hf_posext"), both("factor", math.nan)(c)),
        "damaged hf_posext block": lambda c: c.update(hf_posext={"method": "yarn"}),
        "unknown rope_type": both("rope_type", "warp"),
        "negative original_max_position_embeddings": both("original_max_position_embeddings", -4),
        "model_type gpt2 with llama weights": lambda c: c.update(model_type="gpt2"),
    }
    for name, edit in loads.items():
        path = edited(name.replace(" ", "_"), edit)
        add(f"load: {name}", "api", lambda p=path: hf_posext.from_pretrained(p))
    broken = tmp / "broken_json"
    shutil.copytree(saved, broken)
    (broken / "config.json").write_text("{not json")
    add("load: config.json not JSON", "api", lambda: hf_posext.from_pretrained(str(broken)))

    # --- CLI -----------------------------------------------------------------------------------
    docs = str(assets / "docs")
    base = ["--model", llama, "--dataset", docs, "--no-plot", "--no-progress"]
    bad_eval = {
        "--lengths 1": ["--lengths", "1"], "--lengths 0": ["--lengths", "0"], "--lengths -4": ["--lengths", "-4"],
        "--lengths abc": ["--lengths", "abc"], "--lengths ''": ["--lengths", ""], "--lengths 1.5": ["--lengths", "1.5"],
        "--lengths 1,64": ["--lengths", "1,64"], "--stride 0": ["--protocol", "sliding", "--stride", "0"],
        "--stride -1": ["--protocol", "sliding", "--stride", "-1"],
        "--stride > length": ["--protocol", "sliding", "--lengths", "64", "--stride", "128"],
        "--protocol bogus": ["--protocol", "bogus"], "--methods bogus": ["--methods", "bogus"],
        "--methods ''": ["--methods", ""], "--factor 0.5": ["--factor", "0.5"], "--factor nan": ["--factor", "nan"],
        "--factor abc": ["--factor", "abc"], "--factor inf": ["--factor", "inf"], "--dtype int8": ["--dtype", "int8"],
        "--device tpu9": ["--device", "tpu9"], "--max-docs 0": ["--max-docs", "0"],
        "--chunk-size 0": ["--chunk-size", "0"], "--eval-tokens 0": ["--eval-tokens", "0"],
        "--knobs garbage": ["--methods", "yarn", "--knobs", "garbage"],
        "--knobs beta_fast=nan": ["--methods", "yarn", "--knobs", "beta_fast=nan"],
        "--knobs window above L": ["--methods", "rerope", "--knobs", "window=100000"],
        "--knobs leak=1": ["--methods", "leaky_rerope", "--knobs", "leak=1"],
        "--baseline-stride > window": ["--baseline-window", "32", "--baseline-stride", "64"],
        "--model missing": ["--model", str(tmp / "nope")], "--model gpt2 (no RoPE)": ["--model", str(gpt2)],
        "--model tokenizer-only folder": ["--model", str(tmp / "tok_only")],
        "--dataset missing": ["--dataset", str(tmp / "nodocs")], "--out is a file": ["--out", str(ROOT / "README.md")],
        "--gguf-file missing": ["--gguf-file", "x.gguf"], "--lengths 10m (absurd)": ["--lengths", "100000m"],
        "--factor 1e9 self_extend auto": ["--methods", "self_extend", "--factor", "1e9", "--knobs", "group_size=auto"],
    }
    for name, extra in bad_eval.items():
        out = str(tmp / f"eval_{len(cases)}")
        argv = ["eval", *base, "--out", out, *extra] if "--out" not in extra else ["eval", *base, *extra]
        add(f"cli eval {name}", "cli", lambda a=argv: cli.main(a))
    bad_passkey = {
        "--depths 2": ["--depths", "2"], "--depths -0.1": ["--depths", "-0.1"], "--depths abc": ["--depths", "abc"],
        "--seeds 0": ["--seeds", "0"], "--seeds -1": ["--seeds", "-1"], "--seeds x": ["--seeds", "x"],
        "--lengths 1": ["--lengths", "1"], "--lengths 0": ["--lengths", "0"], "--methods bogus": ["--methods", "bogus"],
        "--factor 0": ["--factor", "0"], "--model gpt2": ["--model", str(gpt2)], "--model missing": ["--model", str(tmp / "nope")],
        "--dtype x": ["--dtype", "x"], "--out is a file": ["--out", str(ROOT / "README.md")],
    }
    for name, extra in bad_passkey.items():
        argv = ["passkey", "--model", llama, "--no-plot", "--no-progress", "--out", str(tmp / f"pk_{len(cases)}"), *extra]
        if "--out" in extra:
            argv = ["passkey", "--model", llama, "--no-plot", "--no-progress", *extra]
        add(f"cli passkey {name}", "cli", lambda a=argv: cli.main(a))
    add("cli no subcommand", "cli", lambda: cli.main([]))
    add("cli unknown subcommand", "cli", lambda: cli.main(["evaluate"]))
    add("cli eval unknown flag", "cli", lambda: cli.main(["eval", "--lenghts", "4k"]))

    # --- recipe configuration -----------------------------------------------------------------
    recipe_bad = {
        "factor 0.5": dict(model__factor="0.5"), "factor nan": dict(model__factor="nan"),
        "factor -1": dict(model__factor="-1"), "method bogus": dict(model__method="bogus"),
        "weight_decay -0.1": dict(training__weight_decay="-0.1"), "lr 0": dict(training__learning_rate="0"),
        "lr -1e-3": dict(training__learning_rate="-1e-3"), "lr nan": dict(training__learning_rate="nan"),
        "lr inf": dict(training__learning_rate="inf"), "max_grad_norm 0": dict(training__max_grad_norm="0"),
        "adam_betas [1, 0.9]": dict(training__adam_betas="[1, 0.9]"), "seq_len 0": dict(training__seq_len="0"),
        "max_steps 0": dict(training__max_steps="0"), "warmup -1": dict(training__warmup_steps="-1"),
        "batch_size 0": dict(training__batch_size="0"), "save_every 0": dict(training__save_every="0"),
        "keep_checkpoints 0": dict(training__keep_checkpoints="0"), "lr_schedule bogus": dict(training__lr_schedule="bogus"),
        "mixed_precision fp8": dict(training__mixed_precision="fp8"), "dtype float8": dict(model__dtype="float8"),
        "pose.num_chunks 0": dict(pose__num_chunks="0"), "pose.target 8": dict(pose__target="8"),
        "eval.lengths [1]": dict(eval__lengths="[1]"), "eval.lengths []": dict(eval__lengths="[]"),
        "unknown key": dict(training__lr="1e-3"), "model missing": dict(model__name=str(tmp / "nope")),
        "data source missing": dict(data__source=str(tmp / "nodocs")),
        "rerope window above L": dict(model__method="rerope", model__knobs="{window: 100000}"),
        "yarn beta nan": dict(model__knobs="{beta_fast: .nan}"),
        "eval_documents garbage": dict(data__eval_documents="{a: 1}"),
    }
    for name, over in recipe_bad.items():
        out = tmp / f"recipe_{len(cases)}"
        add(f"recipe {name}", "api", lambda o=over, out=out: finetune.main(recipe_argv(assets, out, **o)))
    yamls = {
        "syntax error": "training:\n  learning_rate: [1e-3\n",
        "duplicate key": "training:\n  learning_rate: 1e-3\n  learning_rate: 1e-2\n",
        "duplicate section": "training:\n  seq_len: 32\ntraining:\n  seq_len: 64\n",
        "lr .inf": "training:\n  learning_rate: .inf\n", "lr .nan": "training:\n  learning_rate: .nan\n",
        "factor .nan": "model:\n  factor: .nan\n", "not a mapping": "- a\n- b\n", "binary junk": "\x00\x01\x02",
        "unknown section": "trainng:\n  seq_len: 32\n", "weight_decay -1": "training:\n  weight_decay: -1\n",
    }
    for name, text in yamls.items():
        f = tmp / f"y{len(cases)}.yaml"
        f.write_text(text)
        add(f"recipe yaml {name}", "api", lambda f=f: finetune.main(["--config", str(f), "--output_dir", str(tmp / "yo")]))
    add("recipe --config missing", "api", lambda: finetune.main(["--config", str(tmp / "none.yaml")]))

    # --- recipe resume / checkpoints ------------------------------------------------------------
    good = tmp / "good_run"
    finetune.main(recipe_argv(assets, good, training__max_steps="2", training__save_every="1", eval__enabled="false"))
    resume_argv = lambda out: recipe_argv(assets, out, training__max_steps="2", training__save_every="1",  # noqa: E731
                                          eval__enabled="false") + ["--resume"]
    marker = tmp / "PWNED"

    class Plant:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    def damaged(name, damage):
        out = tmp / f"resume_{name}"
        shutil.copytree(good, out)
        shutil.rmtree(out / "final")
        ck = sorted((out / "checkpoints").glob("checkpoint_*"))[-1]
        damage(ck)
        return lambda: finetune.main(resume_argv(out))

    def plant(fname):
        return lambda ck: (ck / fname).write_bytes(pickle.dumps(Plant()))
    for fname in ("custom_checkpoint_0.pkl", "custom_checkpoint_1.pkl", "optimizer.bin", "scheduler.bin",
                  "random_states_0.pkl", "pytorch_model.bin", "sub/evil.pkl", "model.safetensors"):
        add(f"resume with planted pickle {fname}", "unsafe", damaged(fname.replace("/", "_"), lambda ck, f=fname: (
            (ck / f).parent.mkdir(exist_ok=True), plant(f)(ck))))
    add("resume: truncated optimizer.bin", "api", damaged("trunc", lambda ck: (ck / "optimizer.bin").write_bytes(b"PK\x03")))
    add("resume: missing optimizer.bin", "api", damaged("noopt", lambda ck: (ck / "optimizer.bin").unlink()))
    add("resume: missing manifest", "api", damaged("noman", lambda ck: (ck / "manifest.json").unlink()))
    add("resume: manifest not JSON", "api", damaged("badman", lambda ck: (ck / "manifest.json").write_text("{")))
    add("resume: recipe_state edited", "api", damaged("state", lambda ck: (ck / "recipe_state.json").write_text("{}")))
    add("resume: no checkpoints", "api", lambda: finetune.main(resume_argv(tmp / "empty_run")))
    add("resume: changed config", "api", lambda: finetune.main(
        recipe_argv(assets, good, training__learning_rate="5e-3", eval__enabled="false") + ["--resume"]))
    add("rerun without --resume over checkpoints", "api", lambda: finetune.main(
        recipe_argv(assets, good, training__max_steps="2", training__save_every="1", eval__enabled="false")))
    add("recipe lr 1e30 diverges", "api", lambda: finetune.main(recipe_argv(
        assets, tmp / "diverge", training__learning_rate="1e30", training__warmup_steps="0", eval__enabled="false")))

    add_check_export_search_cases(add, tmp, assets, saved, edited, both)
    add_issue27_cases(add, tmp, assets, saved, edited, finetune, recipe_argv)

    # --- results folders and caches ----------------------------------------------------------------
    from hf_posext.evaluation.data import TokenCache
    from _recipekit import char_tokenizer
    cache_dir = tmp / "cache"
    tc = TokenCache(char_tokenizer(), cache_dir)
    tc.encode("abc abc")
    for i, junk in enumerate((b"junk", b"", pickle.dumps(Plant()))):
        f = next(tc.folder.glob("*.npy"))
        f.write_bytes(junk)
        add(f"token cache corrupted #{i}", "unsafe" if i == 2 else "api",
            lambda: TokenCache(char_tokenizer(), cache_dir).encode("abc abc"))
    run_dir = tmp / "res"
    cli.main(["eval", *base, "--methods", "none", "--lengths", "64", "--no-baseline", "--out", str(run_dir)])
    for name, text in (("perplexity.json not JSON", "{"), ("perplexity.json a list", "[1,2]")):
        def corrupt_then(text=text, name=name):
            d = tmp / name.replace(" ", "_")
            shutil.copytree(run_dir, d)
            (d / "perplexity.json").write_text(text)
            return cli.main(["eval", *base, "--methods", "none", "--lengths", "64", "--no-baseline", "--out", str(d), "--resume"])
        add(f"results: {name}", "cli", corrupt_then)
    add("results: rerun without --resume", "cli", lambda: cli.main(
        ["eval", *base, "--methods", "none", "--lengths", "64", "--no-baseline", "--out", str(run_dir)]))
    add("results: --resume with another model", "cli", lambda: cli.main(
        ["eval", *base, "--model", str(saved), "--methods", "none", "--lengths", "64", "--no-baseline",
         "--out", str(run_dir), "--resume"]))
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "probe_bad_inputs.md"))
    args = ap.parse_args()
    _count_loads()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assets = make_assets(tmp / "assets", archs=("llama",))
            cases = build_cases(tmp, assets)
        rows = []
        for name, kind, fn in cases:
            verdict, detail = run_case(fn, kind if kind in ("cli", "report") else "api")
            if kind == "unsafe" and (tmp / "PWNED").exists():
                verdict, detail = "bad", "UNSAFE: planted pickle ran; " + detail
                (tmp / "PWNED").unlink()
            rows.append((verdict, name, detail.replace(str(tmp), "<tmp>")))
            print(f"{verdict:5s} {name}: {detail}", flush=True)
    counts = {v: sum(r[0] == v for r in rows) for v in ("good", "weak", "bad")}
    summary = f"{len(rows)} cases: {counts['good']} good, {counts['weak']} weak, {counts['bad']} bad"
    print(summary)
    lines = ["# Bad-input probe", "", "Command: `PYTHONPATH=. python benchmarks/probe_bad_inputs.py` (the check, export and search cases: "
             "benchmarks/probe_portability.py)", "",
             f"**{summary}**", "",
             "A diverging loss (lr 1e30) can only be seen while training, so it stays 'weak' by this",
             "probe's rule (an error after the weights loaded); it stops before anything non-finite",
             "is saved and keeps the last good checkpoint. Messages were also read by hand: each names",
             "the flag, key or file and what to change or delete.", "", "| verdict | case | outcome |", "|---|---|---|"]
    lines += [f"| {v} | {n} | {d.replace('|', '/')} |" for v, n, d in sorted(rows, key=lambda r: ("bad", "weak", "good").index(r[0]))]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
