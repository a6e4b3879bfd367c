"""The recipe's stages one by one (hf_posext/training): packing with datasets.map, the hold-out,
checkpoint rotation, the identity of evaluation results, the loss plot."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from _recipekit import ROOT, char_tokenizer, checkpoint_steps, make_assets, recipe_argv
from hf_posext.data.documents import Document
from hf_posext.training.outputs import plot_loss, read_log, trailing_mean
from hf_posext.training.packing import packed_sequences
from hf_posext.training.recipe import prepare_data, run
from hf_posext.training.recipe_config import config_from_dict, parse_args
from hf_posext.evaluation.shared.record import read_rows

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("stages"), archs=("llama",))


# ------------------------------------------------------------------------------------ packing
def test_packing_wraps_each_document_in_bos_eos_and_keeps_order(tmp_path):
    tok = char_tokenizer()
    docs = [Document("a", "abcdefgh"), Document("short", "xy"), Document("b", "ijklmnopqrst")]
    seqs, names = packed_sequences(docs, tok, 6, bos_id=1, eos_id=2, cache_dir=tmp_path)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]
    stream = [1] + ids("abcdefgh") + [2] + [1] + ids("ijklmnopqrst") + [2]   # "short" < one window
    expected = [stream[i:i + 6] for i in range(0, len(stream) - 5, 6)]     # the tail is dropped
    assert names == ["a", "b"] and seqs[:]["input_ids"].tolist() == expected
    assert isinstance(seqs[0]["input_ids"], torch.Tensor)
    again, _ = packed_sequences(docs, tok, 6, 1, 2, cache_dir=tmp_path)   # read back from the cache
    assert again.cache_files and again.cache_files[0]["filename"].startswith(str(tmp_path))
    assert again.cache_files[0]["filename"] == seqs.cache_files[0]["filename"]
    other, _ = packed_sequences(docs, tok, 5, None, 2, cache_dir=tmp_path)  # other settings: other file
    assert other.cache_files[0]["filename"] != seqs.cache_files[0]["filename"]
    assert other[0]["input_ids"].tolist() == (ids("abcdefgh") + [2])[:5]
    with pytest.raises(ValueError, match="training window of 50 tokens is longer than every training "
                                         "document"):
        packed_sequences(docs, tok, 50, 1, 2, cache_dir=tmp_path)


def test_held_out_documents_never_reach_the_training_sequences(assets):
    cfg = config_from_dict({"model": {"name": str(assets / "llama")},
                            "data": {"source": str(assets / "docs"), "eval_documents": ["doc3"]},
                            "training": {"seq_len": 32}, "eval": {"lengths": [64]}})
    tok = char_tokenizer()
    prepared = prepare_data(cfg, tok, log=lambda *_: None)
    assert prepared.eval_names == ["doc3"] and "doc3" not in prepared.train_names
    stream = prepared.sequences[:]["input_ids"].flatten().tolist()
    held = [int(x) for x in prepared.eval_ids[0]]
    windows = {tuple(stream[i:i + 24]) for i in range(len(stream) - 23)}
    assert not any(tuple(held[i:i + 24]) in windows for i in range(len(held) - 23))
    other = tok((assets / "docs" / "doc4.txt").read_text(), add_special_tokens=False)["input_ids"]
    assert tuple(other[100:124]) in windows        # the check does find text that is trained on
    assert stream[0] == tok.bos_token_id           # [BOS] doc [EOS] packing
    assert stream.count(tok.eos_token_id) >= 6


# ---------------------------------------------------------------------------------- checkpoints
def test_checkpoints_are_rotated_by_accelerate(assets, tmp_path):
    cfg, _ = parse_args(recipe_argv(assets, tmp_path / "run", training__save_every=1,
                                    training__keep_checkpoints=2, eval__enabled="false"))
    run(cfg)
    assert checkpoint_steps(tmp_path / "run") == {"checkpoint_2": 3, "checkpoint_3": 4}


# ------------------------------------------------------------------------------ result identity
def test_rerun_with_another_learning_rate_never_reuses_fine_tuned_rows(assets, tmp_path):
    """Finished run, checkpoints deleted, rerun with another lr: it retrains, and the evaluation of
    the new weights is computed, not copied from the old fine-tuned model's rows."""
    out = tmp_path / "run"
    first = run(parse_args(recipe_argv(assets, out))[0])["eval"]["rows"]
    shutil.rmtree(out / "checkpoints")
    second = run(parse_args(recipe_argv(assets, out, training__learning_rate="3e-3"))[0])["eval"]["rows"]
    tuned = lambda rows: {r["length"]: r for r in rows if "fine-tuned" in r["model"]}
    a, b = tuned(first), tuned(second)
    assert a.keys() == b.keys() == {64, 256}
    for length in a:     # same path, same name: the identity is the checkpoint's content
        assert a[length]["model"] == b[length]["model"]
        assert a[length]["model_fingerprint"] != b[length]["model_fingerprint"]
        assert a[length]["perplexity"] != pytest.approx(b[length]["perplexity"], rel=1e-6)
    base = lambda rows: {(r["method"], r["length"]): r["perplexity"] for r in rows if "fine-tuned" not in r["model"]}
    assert base(first) == base(second)                           # the untrained models: reused
    stored = read_rows(out / "eval" / "results.json")
    assert len(stored) == 8                                       # 4 base + 2 x 2 fine-tuned rows


# ------------------------------------------------------------------------------------ loss plot
def test_trailing_mean_and_loss_plot(tmp_path):
    assert trailing_mean([4.0, 2.0, 6.0, 0.0], 2) == [4.0, 3.0, 4.0, 3.0]
    rows = [{"step": i + 1, "loss": 3.0 - 0.01 * i} for i in range(30)]
    path = plot_loss(tmp_path / "loss.png", rows, "a title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("run_dir", ["cpu-smollm2-demo", "cpu-smollm2-demo-nopose"])
def test_committed_loss_curves_are_the_current_drawing(run_dir, tmp_path):
    """benchmarks/results/recipes/*/loss_curve.png are redrawn from their train_log.csv by the current code
    (recipes/plot_loss.py): pixel for pixel the same image."""
    import matplotlib.image as mpimg
    import numpy as np
    folder = ROOT / "benchmarks" / "results" / "recipes" / run_dir
    cfg = config_from_dict(json.loads((folder / "config.json").read_text()))
    from hf_posext.training.recipe import loss_title
    fresh = plot_loss(tmp_path / "loss.png", read_log(folder / "train_log.csv"), loss_title(cfg))
    np.testing.assert_array_equal(mpimg.imread(fresh), mpimg.imread(folder / "loss_curve.png"))


# -------------------------------------------------------------------------------- accelerator
def test_fsdp_config_on_the_cpu_is_refused_not_run_as_ddp(assets, tmp_path, monkeypatch):
    """accelerate turns an FSDP launch on CPU processes into plain DDP (or single processes): the
    recipe says so instead of training something else than the config asks."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    cfg, _ = parse_args(recipe_argv(assets, tmp_path / "run", eval__enabled="false"))
    with pytest.raises(ValueError, match="accelerate runs FSDP only on GPUs/accelerators"):
        run(cfg)
    assert not (tmp_path / "run" / "train_log.csv").exists()


def test_data_parallel_rank_without_a_device_mesh():
    from types import SimpleNamespace
    from hf_posext.training.accel import data_parallel_rank
    assert data_parallel_rank(SimpleNamespace(torch_device_mesh=None, process_index=1, num_processes=2)) == (1, 2)


def test_data_parallel_rank_with_context_parallel_mesh():
    """fsdp2-context-parallel.yaml's mesh (dp_shard 2 x cp 4): ranks 0-3 share batch 0, 4-7 batch 1,
    as accelerate's prepare_data_loader assigns them (accelerate/data_loader.py)."""
    from types import SimpleNamespace
    from hf_posext.training.accel import data_parallel_rank
    sizes = {"dp_shard": 2, "cp": 4}

    class Mesh:
        mesh_dim_names = tuple(sizes)

        def __getitem__(self, name):
            return SimpleNamespace(size=lambda: sizes[name])

    got = [data_parallel_rank(SimpleNamespace(torch_device_mesh=Mesh(), process_index=r, num_processes=8))
           for r in range(8)]
    assert got == [(0, 2)] * 4 + [(1, 2)] * 4
