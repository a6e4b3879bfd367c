"""Library pieces of the fine-tuning recipe (`recipes/finetune.py` is only its command line):

- `recipe_config`: the YAML/flag configuration (jsonargparse) and its validation;
- `accel`: the Accelerator and resume checks; `checkpoint`: atomic checkpoints with a JSON state
  and a hash manifest, verified before resuming (no pickle the recipe did not write is read);
- `data`, `packing`: documents, hold-out, tokenising and packing with `datasets.map`;
- `synthetic`: synthetic long-range examples mixed into the packed windows (`data.synthetic`);
- `model`: tokenizer, extended model, LoRA, the PoSE collator (`pose`);
- `optim`: AdamW and `transformers.get_scheduler`;
- `loop`: the training loop; `outputs`: log, loss plot, final model; `recipe_eval`: evaluation;
- `recipe.run`: the stages in order.
"""

from .data import Document, load_documents, split_holdout
from .pose import PoseCollator, sample_pose_position_ids

__all__ = ["Document", "PoseCollator", "load_documents", "sample_pose_position_ids", "split_holdout"]
