"""The portability wing: how a checkpoint is saved, how other engines read it, and export.

    portable.py   the saved form (plain transformers rope config + the `hf_posext` entry)
    engines.py    what transformers, vLLM, SGLang, TGI and llama.cpp run, re-derived from source
    readers.py    the reader table: one id per reader, its printed name and export target
    meaning.py    what a checkpoint means, and a reading's error against it
    verdicts.py   `hf_posext.check`: one verdict per reader
    exporting.py     `hf_posext.export`: the form a named reader runs exactly
    gguf_export.py   `--target gguf`: a GGUF llama.cpp runs exactly
    config_audit.py  what `check` reports besides the verdicts (config errors and warnings)
    doctor.py        `check`'s findings on any RoPE config.json: what is off, where, and the fix
    family_doctor.py the doctor's findings on the families people extend now: engine bugs in their rope
    finding.py       one doctor finding (code, severity, message, engines, off, fix) and its labels
    gguf_doctor.py   the doctor's GGUF findings: a GGUF's rope keys against its config.json
    measured.py      what the real engines did with each method's checkpoint (measured_engines.json)
    serving.py       `hf-posext serve`: the engine command line, checked like export
    atomic.py        write a file or folder whole or not at all (every atomic write)
    dual_chunk.py    SGLang's Dual Chunk Attention entry, against hf_posext's dual_chunk
    card.py          the model card (README.md) of a checkpoint `hf-posext extend` writes
"""
