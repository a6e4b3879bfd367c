"""The rope wing: each method's inverse frequencies and scale, and how transformers runs them.

    units.py     one unit per method: everything hf_posext knows about it, in one entry
    knobs.py     the `Knob` spec a unit declares its knobs with (type, default, check, help)
    methods.py   the math (PI, NTK, NTK-by-parts, YaRN, dynamic variants), float64 references
    config.py    RopeExtensionConfig (validated knobs) and the rope type each method saves as
    registry.py  the functions registered in transformers' rope-init table; rotary modules;
                 the supported model types (the found families and the exceptions)
    families.py  the decoder families found in transformers' modules and what their rope is
    families_support.py  each found family: extended or why not; attention methods or why not
    family_table.py  the markdown table of the found families (docs/families.md)
    softmax_scale.py  DeepSeek-family attention: the softmax scale read from the rope dict
    dynamic.py   dynamic methods: the rotary module's per-length update
    longrope.py  every static method as transformers' `longrope` config (factors + attention factor)
    compat.py    the transformers 4.x (rope_scaling) / 5.x (rope_parameters) shim
"""
