"""The fine-tuned arms of the 4x runs (effective_length_4x.py): the 4x retrieval recipe and the
settings it was chosen among, each the recipe's command plus the arm's flags, trained into the
arm's own folder; how the results pages name an arm, and which arm a run folder holds."""

from __future__ import annotations

from pathlib import Path

from effective_length_table import CODE_MIX_NAME

# the 4x recipe's checkpoints (an output_dir's `final`, relative to the repository as the recipe's
# command writes it); a config carries the extension, so it is asked with no method on top.
# arm -> (output folder of seed 0, the recipe flags it trains with, what the page adds to its name);
# another seed trains into the folder named by its seed.
RECIPE = "recipes/cpu-smollm2-retrieval-4x.yaml"
# The recipe's settings before its default changed (1k-token windows, a quarter synthetic, 200 steps),
# restated so an arm trained on them still trains the same: the recipe's command plus these flags.
OLD_DEFAULT = " --training.seq_len 1024 --training.max_steps 200 --data.synthetic.window null"
FINETUNED = {"finetuned": ("runs/cpu-smollm2-retrieval-4x", "", ""),
             # the default until 2026-12: 1k-token windows, a quarter synthetic, 200 steps; its rows
             # name its checkpoint runs/cpu-smollm2-retrieval-4x[-seedN], the folder it had then
             "finetuned-1k-windows": ("runs/cpu-smollm2-retrieval-4x-1k-windows",
                                      f"{OLD_DEFAULT} --data.synthetic.share 0.25",
                                      "1k-token windows, a quarter synthetic, 200 steps (the default before)"),
             "finetuned-distractors": ("runs/cpu-smollm2-retrieval-4x-distractors",
                                       f"{OLD_DEFAULT} --data.synthetic.share 0.25 --data.synthetic.distractors 3",
                                       "1k-token windows, mix with 3 distractor facts"),
             "finetuned-documents": ("runs/cpu-smollm2-retrieval-4x-documents", f"{OLD_DEFAULT} --data.synthetic.share 0",
                                     "1k-token windows, documents only, no synthetic examples"),
             # the far-needle diagnosis's lead: a synthetic example's fact and question with 4k real
             # tokens between them (not 1k); the same tokens seen as the 1k-window setting
             # (50 x 4,096 = 200 x 1,024), half the windows synthetic (its 50 steps read 19 examples, the
             # 1k-window setting's 200 read 47)
             "finetuned-4k-windows": ("runs/cpu-smollm2-retrieval-4x-4k-windows",
                                      " --training.max_steps 50 --data.synthetic.share 0.5 --data.synthetic.window null",
                                      "4k-token windows, 50 steps, half synthetic"),
             # the same windows for 100 steps: 36 synthetic examples read (the 1k-window setting's 47),
             # twice its tokens; does the far needle come back with more examples?
             "finetuned-4k-windows-100steps": ("runs/cpu-smollm2-retrieval-4x-4k-windows-100",
                                               " --data.synthetic.share 0.5 --data.synthetic.window null",
                                               "4k-token windows, 100 steps, half synthetic"),
             # 4k document windows (what lowered the perplexity cost) beside synthetic examples cut
             # to 1k (the 1k-window setting's fact-to-question layout, what found the needle 32k back):
             # the 100-step arm above with only the examples' length changed; the recipe is this arm
             # with three quarters of the windows synthetic (76 examples read, 24 document windows)
             "finetuned-4k-docs-1k-examples": ("runs/cpu-smollm2-retrieval-4x-4k-docs-1k-examples",
                                               " --data.synthetic.share 0.5",
                                               "4k-token document windows, 1k-token synthetic examples, half synthetic"),
             # the recipe with whole 4k examples (~3.7k real tokens between fact and question, not ~0.9k),
             # its example count kept: does a long real filler teach the heads a fact 32k back in a play?
             "finetuned-4k-examples": ("runs/cpu-smollm2-retrieval-4x-4k-examples", " --data.synthetic.window null",
                                       "4k-token synthetic examples, three quarters synthetic"),
             # the recipe's mix read twice as long (152 examples, 48 document windows): does the far
             # needle in a play come with more steps rather than another layout?
             "finetuned-200-steps": ("runs/cpu-smollm2-retrieval-4x-200-steps", " --training.max_steps 200",
                                     "200 steps"),
             # the recipe with half its synthetic examples built in Python's standard library (the 2x
             # code mix of benchmarks/code_mix.py at 4x): does the 2x gain in held-out code carry to 32k?
             "finetuned-code": ("runs/cpu-smollm2-retrieval-4x-code",
                                " --data.synthetic.haystacks '[training,embedded:python-stdlib]'", CODE_MIX_NAME)}


def finetuned(seed: int = 0, arm: str = "finetuned") -> str:
    return FINETUNED[arm][0] + (f"-seed{seed}" if seed else "") + "/final"


def train_command(seed: int = 0, arm: str = "finetuned") -> str:
    folder, flags, _ = FINETUNED[arm]
    extra = f" --training.seed {seed}" if seed else ""
    extra += f" --output_dir {finetuned(seed, arm).removesuffix('/final')}" if seed or folder != FINETUNED["finetuned"][0] else ""
    return f"accelerate launch --cpu --num_processes 1 recipes/finetune.py --config {RECIPE}{flags}{extra}"


def arm_name(arm: str, seed: int) -> str:
    """How the page names a fine-tuned checkpoint: the recipe, its arm's change, its seed."""
    return f"fine-tuned: 4x retrieval recipe{', ' + FINETUNED[arm][2] if FINETUNED[arm][2] else ''}, seed {seed}"


def arm_of(folder: Path) -> str | None:
    """The fine-tuned arm a run folder holds (`noise-finetuned-distractors-seed1-multi_key`), None
    for a training-free method's."""
    return next((arm for arm in sorted(FINETUNED, key=len, reverse=True) if f"-{arm}" in folder.name), None)
