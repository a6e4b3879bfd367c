"""The rope wing: each method's inverse frequencies and scale, and how transformers runs them.

    units.py     one unit per method: everything hf_posext knows about it, in one entry
    knobs.py     the `Knob` spec a unit declares its knobs with (type, default, check, help)
    methods.py   the math (PI, NTK, NTK-by-parts, YaRN, dynamic variants), float64 references
    config.py    RopeExtensionConfig (validated knobs) and the rope type each method saves as
    registry.py  the functions registered in transformers' rope-init table; rotary modules
    dynamic.py   dynamic methods: the rotary module's per-length update
    longrope.py  every static method as transformers' `longrope` config (factors + attention factor)
    compat.py    the transformers 4.x (rope_scaling) / 5.x (rope_parameters) shim
"""
