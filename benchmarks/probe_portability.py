"""The `check`, `export` and `search` cases of benchmarks/probe_bad_inputs.py (issue 17): check
must *say* what is wrong ("report" cases: an attention method lost in every engine, layouts that
disagree), export and search must refuse in one line before writing or loading anything."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import transformers

import hf_posext
from hf_posext import cli
from hf_posext.portability.verdicts import report


def add_check_export_search_cases(add, tmp: Path, assets: Path, saved: Path, edited, both) -> None:
    llama = str(assets / "llama")
    made = {}
    for method, knobs in (("rerope", {}), ("dual_chunk", {}), ("string", dict(shifted_offset=21, local_value=4)),
                          ("dynamic_ntk", {}), ("ntk_by_parts", {})):
        made[method] = tmp / f"saved_{method}"  # written here, so no case counts its weight load
        model = transformers.AutoModelForCausalLM.from_pretrained(llama)
        # STRING reaches L + S − W = 81 tokens at L = 64 (a 2x target is refused): 1.25x
        hf_posext.patch(model, method, factor=1.25 if method == "string" else 2, **knobs).save_pretrained(made[method])
    (tmp / "exports").mkdir()

    def saved_as(method, **knobs):
        return str(made[method])

    def lost_everywhere(method, **knobs):
        lines = [ln for ln in report(saved_as(method, **knobs)).splitlines()
                 if ln.startswith("  ") and not ln.strip().startswith("transformers 5")]
        engines = [ln for ln in lines if ln.strip().split(" ")[0] in ("vLLM", "SGLang", "TGI", "llama.cpp")]
        return all(" lost" in ln for ln in engines) and len(engines) >= 4, " / ".join(engines)[:150]
    for method, knobs in (("rerope", {}), ("dual_chunk", {}), ("string", dict(shifted_offset=21, local_value=4))):
        add(f"check {method} checkpoint says lost", "report", lambda m=method, k=knobs: lost_everywhere(m, **k))
    add("check layouts disagree", "report", lambda: (
        "error:" in (r := report(edited("layouts_disagree", lambda c: c["rope_scaling"].update(factor=8.0)))), r))
    add("check NaN factor", "api", lambda: report(edited("check_nan", both("factor", math.nan))))
    add("check missing folder", "cli", lambda: cli.main(["check", str(tmp / "nope")]))
    def not_json():
        d = tmp / "notjson"
        shutil.copytree(saved, d)
        (d / "config.json").write_text("{oops")
        return cli.main(["check", str(d)])
    add("check config.json not JSON", "cli", not_json)
    add("check without paths", "cli", lambda: cli.main(["check"]))
    out_of = lambda name: str(tmp / "exports" / name)   # noqa: E731
    add("export attention method", "api", lambda: hf_posext.export(saved_as("rerope"), out_of("a"), target="vllm"))
    add("export dynamic_ntk to vllm", "api", lambda: hf_posext.export(saved_as("dynamic_ntk"), out_of("b"), target="vllm"))
    add("export ntk_by_parts to llama.cpp", "api",
        lambda: hf_posext.export(saved_as("ntk_by_parts"), out_of("c"), target="llama.cpp"))
    add("export inside its source", "api", lambda: hf_posext.export(saved, str(saved / "inner"), target="vllm"))
    (tmp / "a_file").write_text("x")
    add("export onto a file", "cli", lambda: cli.main(["export", str(saved), str(tmp / "a_file"), "--target", "vllm"]))
    add("export unknown target", "cli", lambda: cli.main(["export", str(saved), out_of("d"), "--target", "vllmm"]))
    add("export --target gguf without --gguf", "cli", lambda: cli.main(["export", str(saved), out_of("e.gguf"), "--target", "gguf"]))
    add("export --gguf with --target vllm", "cli",
        lambda: cli.main(["export", str(saved), out_of("f"), "--target", "vllm", "--gguf", str(tmp / "a_file")]))
    add("export --gguf missing file", "cli",
        lambda: cli.main(["export", str(saved), out_of("g.gguf"), "--target", "gguf", "--gguf", str(tmp / "none.gguf")]))
    add("export --gguf not a GGUF", "cli",
        lambda: cli.main(["export", str(saved), out_of("h.gguf"), "--target", "gguf", "--gguf", str(tmp / "a_file")]))
    search = ["search", "--model", llama, "--dataset", str(assets / "docs")]
    for flags in (["--length", "0"], ["--length", "64", "--proxy-length", "128"], ["--length", "64", "--budget-minutes", "nan"],
                  ["--length", "64", "--lr", "-1"], ["--length", "64", "--max-steps", "0"], ["--length", "64k", "--out", str(tmp / "a_file")],
                  ["--length", "64", "--out", str(assets)]):
        out = [] if "--out" in flags else ["--out", out_of("s")]
        add(f"search {' '.join(flags)}".replace(str(tmp), "<tmp>"), "cli", lambda f=flags, o=out: cli.main([*search, *f, *o]))
