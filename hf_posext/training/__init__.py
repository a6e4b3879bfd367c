"""Library pieces of the fine-tuning recipe (`recipes/finetune.py`): PoSE position ids and the
collator (`pose`), document loading, hold-out and packing (`data`), optimiser and schedule
(`optim`). Evaluation uses `hf_posext.evaluation`."""

from .data import Document, load_documents, pack_documents, split_holdout
from .pose import PoseCollator, sample_pose_position_ids

__all__ = ["Document", "PoseCollator", "load_documents", "pack_documents", "sample_pose_position_ids",
           "split_holdout"]
