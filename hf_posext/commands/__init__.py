"""Command-line subcommands beside the library (`hf_posext/cli.py` holds `eval` and `passkey`).

    check.py       `hf-posext check` and `hf-posext export`
    search.py      `hf-posext search` (the search itself: hf_posext/search/)
    model_args.py  the model and tokenizer a command's flags name (`--model`, `--gguf-file`, ...)
"""
