"""Command-line subcommands beside the library (`hf_posext/cli.py` holds `eval` and `passkey`).

    check.py       `hf-posext check` and `hf-posext export`
    search.py      `hf-posext search` (the search itself: hf_posext/search/)
    serve.py       `hf-posext serve`: the command that serves a checkpoint in an engine
    model_args.py  the model and tokenizer a command's flags name (`--model`, `--gguf-file`, ...)
"""
