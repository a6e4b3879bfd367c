"""Library pieces of the fine-tuning recipe (`recipes/finetune.py` is only its command line;
the factor search, which trains no weights, is hf_posext/search/):

- recipe_config.py: the YAML/flag configuration (jsonargparse) and its validation;
- accel.py: the Accelerator and resume checks; checkpoint.py: atomic checkpoints with a JSON
  state and a hash manifest, verified before resuming (no pickle the recipe did not write is read);
- data.py, packing.py: documents, hold-out, tokenising and packing with `datasets.map`;
- synthetic.py: synthetic long-range examples mixed into the packed windows (`data.synthetic`);
- model.py: tokenizer, extended model, LoRA; pose.py: the PoSE collator;
- optim.py: AdamW and `transformers.get_scheduler`;
- loop.py: the training loop; loss.py: transformers' loss or the chunked one (`training.loss_chunk`);
  outputs.py: log, loss plot, final model; recipe_eval.py: evaluation;
- recipe.py: `run`, the stages in order;
- arms.py, arms_report.py: the fine-tuning experiment's arms (training-free, documents, documents
  + synthetic; benchmarks/finetune_retrieval.py runs them): their recipe arguments, settings and
  checks, and their report.
"""

from .data import recipe_documents, split_holdout
from .pose import PoseCollator, sample_pose_position_ids

__all__ = ["PoseCollator", "recipe_documents", "sample_pose_position_ids", "split_holdout"]
