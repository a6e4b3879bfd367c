"""The command line's one home: a module per `hf-posext` subcommand (`hf_posext/cli.py` only
builds the parser from them and runs the chosen one).

    methods.py     `hf-posext methods`: the methods and their knobs
    extend.py      `hf-posext extend`: a base model to an extended checkpoint with its model card
    extend_eval.py `hf-posext extend --eval`: the quick check whose figures go into the card
    compare.py     `hf-posext compare`: several runs' summaries side by side
    eval.py        `hf-posext eval`: perplexity across context lengths
    passkey.py     `hf-posext passkey`: the retrieval suite's single-needle task, as a shortcut
    check.py       `hf-posext check` and `hf-posext export`
    search.py      `hf-posext search` (the search itself: hf_posext/search/)
    dpe_detect.py  `hf-posext dpe-detect`: DPE's per-group scales and key dimensions (search/dpe.py)
    serve.py       `hf-posext serve`: the command that serves a checkpoint in an engine
    retrieval.py   `hf-posext retrieval`: the RULER-style retrieval suite (hf_posext/evaluation/retrieval/)
    retrieval_plan.py  `hf-posext retrieval --sequential / --budget`: flags, run, decisions
    retrieval_engine.py  retrieval's `--engine vllm` flags, checked before anything loads
    lm_eval.py     `hf-posext lm-eval`: lm-evaluation-harness with the `hf-posext` model type
    lm_eval_vllm.py  its `hf-posext-vllm` model type: checked here, run in vLLM's Python
    model_args.py  the model and tokenizer a command's flags name (`--model`, `--gguf-file`, ...)
    auto_dtype.py  `--dtype auto`: bfloat16 where a probe measures it faster
    session.py     what the grid commands share: their flags, the checks before the model loads,
                   the results folder, the loaded model's identity, the rows a report shows
"""
