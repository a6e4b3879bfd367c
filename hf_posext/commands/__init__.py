"""Command-line subcommands beside the library (`hf_posext/cli.py` holds `eval` and `passkey`).

    check.py   `hf-posext check` and `hf-posext export`
"""
