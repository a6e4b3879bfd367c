"""Do the engines read a longrope config with two factor sets as transformers does, on a prompt
shorter than L? (`hf-posext search --short-factors identity`.)

The engine harness (tests/engines/) scores one prompt longer than L, where transformers and vLLM
both use `long_factor` at every position, so it cannot tell two sets from one. Here: the
harness's random Llama (L = 256) extended 4x as a longrope config with `short_factor` = 1 (plain
RoPE) and YaRN's factors as `long_factor`, exported for vLLM (`export --target vllm`), a prompt
of 200 tokens (< L) served with max_model_len = 4L as the harness does. References, both from
transformers: the same checkpoint (short set: plain RoPE x attention_factor) and the one-set
config (long set at every position). Needs the engine venvs (`make engine-venvs`).

    python benchmarks/engine_short_factors.py     # -> benchmarks/results/engine_short_factors.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "engines"))

import measure  # noqa: E402 (the harness's model, prompt, references and engine runner)

import hf_posext  # noqa: E402
from hf_posext.data import embedded  # noqa: E402
from hf_posext.rope.longrope import longrope_knobs  # noqa: E402

SHORT = 200   # prompt tokens, < L = 256
VLLM_VENVS = [(name, venv) for name, venv, runner, *_ in measure.ENGINES if runner == "_run_vllm.py"]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", type=Path, default=HERE / "results" / "engine_short_factors.md",
                   help="the Markdown table written (default: %(default)s)")
    args = p.parse_args(argv)
    # without every vLLM venv the table would say "not run" over the committed measurement
    missing = [venv for _, venv in VLLM_VENVS if venv in measure.missing_venvs()]
    if missing:
        p.error(f"engine venvs missing: {', '.join(map(str, missing))}; build them with `make engine-venvs`")
    return args


def main(out: Path) -> None:
    tok = embedded.load_tokenizer()
    base = measure.base_model(tok)
    ids = measure.prompt_ids(tok)[:SHORT]
    knobs = longrope_knobs(hf_posext.RopeExtensionConfig("yarn", measure.FACTOR, measure.L),
                           measure.MODEL["head_dim"], measure.MODEL["rope_theta"])
    ones = [1.0] * len(knobs["long_factor"])
    refs, rows = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, short in (("two sets", ones), ("one set", knobs["long_factor"])):
            m = measure.base_model(tok)
            m.load_state_dict(base.state_dict())
            hf_posext.patch(m, "longrope", measure.FACTOR, **{**knobs, "short_factor": short})
            refs[name] = measure.logprobs(m, ids)
            m.save_pretrained(work / name / "saved")
            tok.save_pretrained(work / name / "saved")
            hf_posext.export(work / name / "saved", work / name / "vllm", target="vllm")
        form = {"two-sets": work / "two sets" / "vllm"}
        for _engine, venv in VLLM_VENVS:
            version, results = measure.run_engine(venv, "_run_vllm.py", form, ids, work)
            got = results["two-sets"]
            if got["logprobs"] is None:
                rows.append(f"| vLLM {version} | {got['stage']}: {got['error']} | | |")
                continue
            lp = torch.tensor([float("nan") if x is None else x for x in got["logprobs"]], dtype=torch.float64)
            gap = {k: float((lp[1:] - r[1:]).abs().max()) for k, r in refs.items()}
            reads = min(gap, key=gap.get)
            rows.append(f"| vLLM {version} | {gap['two sets']:.2e} | {gap['one set']:.2e} | "
                        f"{'short_factor (as transformers)' if reads == 'two sets' else 'long_factor at every position'} |")
    between = float((refs["two sets"][1:] - refs["one set"][1:]).abs().max())
    lines = ["# A longrope config with two factor sets, a prompt shorter than L, in vLLM",
             "", "`python benchmarks/engine_short_factors.py` (docstring: what is run). "
             f"{SHORT}-token prompt, L = {measure.L}, max_model_len = {int(measure.FACTOR) * measure.L}; "
             f"max |Δ logprob| (nats) against transformers reading the checkpoint (short set) and "
             f"against the one-set config (long set); the two references differ by {between:.2e}.", "",
             "| engine | vs transformers (short set) | vs long set | vLLM runs |", "|---|---|---|---|", *rows]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(parse().out)
