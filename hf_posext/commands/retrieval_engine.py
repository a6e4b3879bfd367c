"""`hf-posext retrieval --engine vllm`: the engine flags, checked (and every cell's vLLM
arguments derived, refusals included) before anything loads; the engine object the retrieval run
hands to `evaluate_retrieval` (hf_posext/evaluation/retrieval/vllm_engine.py, docs/retrieval.md
"On vLLM")."""

from __future__ import annotations

from ..evaluation.shared.inputs import InputError
from ..evaluation.retrieval import vllm_engine
from ..patcher import trained_length

ENGINES = ("transformers", "vllm")
_VLLM_ONLY = ("vllm_python", "tensor_parallel_size", "data_parallel_size", "engine_arg")


def add_engine_args(p) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--engine", default="transformers", choices=ENGINES,
                   help="transformers (default: this process) or vllm (a worker in vLLM's Python, run "
                        "with `hf-posext serve --engine vllm`'s arguments)")
    g.add_argument("--vllm-python", default=None,
                   help=f"the python of a venv with vLLM (default ${vllm_engine.PYTHON_ENV}, else this one)")
    g.add_argument("--tensor-parallel-size", type=int, default=None,
                   help="vLLM tensor parallelism (GPUs per engine; default 1)")
    g.add_argument("--data-parallel-size", type=int, default=None,
                   help="vLLM data parallelism (engine replicas; default 1)")
    g.add_argument("--engine-arg", action="append", default=None, metavar="KEY=VALUE",
                   help="another vllm.LLM argument, e.g. max_num_seqs=8 (repeatable)")


def engine_from_args(args, grid):
    """(engine, planning model) for --engine vllm, None for transformers. Every flag, the vLLM
    python, and each cell's engine arguments (serve's derivation; methods vLLM does not run
    exactly refused with check's reason) are checked here, before the model or engine loads."""
    if getattr(args, "engine", "transformers") != "vllm":
        given = [f"--{k.replace('_', '-')}" for k in _VLLM_ONLY if getattr(args, k, None) is not None]
        if given:
            raise InputError(f"{', '.join(given)} only apply with --engine vllm.")
        return None
    for flag, value in (("--dtype auto", args.dtype == "auto"), ("--device-map", args.device_map),
                        ("--attn-implementation", args.attn_implementation)):
        if value:
            raise InputError(f"{flag} is a transformers setting; with --engine vllm give --dtype "
                             "float32 or bfloat16 and pass vLLM's own settings with --engine-arg.")
    try:
        folder = vllm_engine.hf_folder(args.model, args.gguf_file, weights=False)
        engine = vllm_engine.VllmEngine(
            folder, python=args.vllm_python, dtype=args.dtype,
            tensor_parallel_size=args.tensor_parallel_size or 1,
            data_parallel_size=args.data_parallel_size or 1,
            engine_args=vllm_engine.parse_engine_args(args.engine_arg),
            prefix_caching=not args.no_prefix_reuse)
        model = vllm_engine.planning_model(folder, args.dtype)
        engine.plan(grid.cells(trained_length(model)))
    except ValueError as err:
        raise InputError(str(err)) from None
    return engine, model


def load_for_engine(spec, engine):
    """The loader `session.evaluate_in_store` uses on --engine vllm: the checkpoint folder vLLM
    reads written first when --model is a GGUF (vllm_engine.hf_folder), then the weightless
    planning model; the engine's worker started and its arguments checked by vLLM."""
    vllm_engine.hf_folder(spec.model, spec.gguf_file)
    engine.check()
    return vllm_engine.planning_model(engine.folder, spec.dtype)
