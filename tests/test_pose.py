"""PoSE position ids and collator, document packing and hold-out, and the optimiser pieces of
hf_posext.training: checked against direct constructions on tiny inputs."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_posext.data.documents import Document
from hf_posext.training import data as datalib
from hf_posext.training.optim import build_scheduler, grad_norm
from hf_posext.training.pose import PoseCollator, example_generator, sample_pose_position_ids
from hf_posext.training.recipe_config import DataConfig


pytestmark = pytest.mark.usefixtures("one_thread")


def _chunks(pos: torch.Tensor) -> list[torch.Tensor]:
    """Split position ids where they jump by more than one."""
    cut = (torch.nonzero(pos[1:] - pos[:-1] != 1).flatten() + 1).tolist()
    return list(torch.tensor_split(pos, cut))


# ------------------------------------------------------------------------------------------ PoSE
@pytest.mark.parametrize("window,target,chunks", [(16, 64, 2), (32, 512, 3), (8, 8, 2), (10, 40, 1)])
def test_position_ids_increase_start_at_zero_and_stay_in_target(window, target, chunks):
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        pos = sample_pose_position_ids(window, target, chunks, g)
        assert pos.shape == (window,) and pos.dtype == torch.long
        assert bool((pos[1:] > pos[:-1]).all())                 # strictly increasing
        assert pos[0].item() == 0                               # first chunk starts at 0
        assert pos[-1].item() <= target - 1                     # never beyond the target
        parts = _chunks(pos)
        assert len(parts) <= chunks                             # at most N-1 skips
        for part in parts:                                      # contiguous inside a chunk
            assert torch.equal(part, torch.arange(part[0], part[0] + len(part)))


def test_position_ids_reach_the_whole_target_span():
    # window 16 over target 48: the largest skip (32) makes the last id 47 = target - 1, and over
    # many samples every position and every relative distance up to 47 appears.
    window, target = 16, 48
    g = torch.Generator().manual_seed(0)
    pos = torch.stack([sample_pose_position_ids(window, target, 2, g) for _ in range(2000)])  # [n, W]
    last = pos[:, -1]
    dist = (pos[:, :, None] - pos[:, None, :]).abs()                                         # [n, W, W]
    assert last.max().item() == target - 1
    assert torch.unique(pos).tolist() == list(range(target))
    assert torch.unique(dist).tolist() == list(range(target))
    # the skip of the second chunk is uniform on {0..target-window}: the mean last id is the middle
    assert abs(last.double().mean().item() - (window - 1 + (target - window) / 2)) < 1.5


def test_first_chunk_holds_the_start_and_chunk_lengths_vary():
    g = torch.Generator().manual_seed(3)
    first_lengths = set()
    for _ in range(300):
        pos = sample_pose_position_ids(32, 1024, 2, g)
        first = _chunks(pos)[0]
        assert first[0].item() == 0
        first_lengths.add(len(first))
    assert len(first_lengths) > 10   # the cut point is random, not fixed


def test_no_skip_when_target_equals_window_or_one_chunk():
    assert torch.equal(sample_pose_position_ids(12, 12, 3, torch.Generator()), torch.arange(12))
    assert torch.equal(sample_pose_position_ids(12, 99, 1, torch.Generator()), torch.arange(12))


@pytest.mark.parametrize("args,match", [((32, 16, 2), "shorter than the training window"),
                                        ((8, 64, 0), "num_chunks"), ((8, 64, 9), "num_chunks"),
                                        ((0, 64, 2), "positive")])
def test_bad_pose_arguments_raise(args, match):
    with pytest.raises(ValueError, match=match):
        sample_pose_position_ids(*args)


def test_collator_batches_and_is_deterministic_per_example():
    col = PoseCollator(window=16, target=128, num_chunks=2, seed=5)
    examples = [torch.arange(16) + 10 * i for i in range(3)]
    a = col(examples, [7, 8, 9])
    assert set(a) == {"input_ids", "labels", "attention_mask", "position_ids"}
    for v in a.values():
        assert v.shape == (3, 16) and v.dtype == torch.long
    assert torch.equal(a["input_ids"], torch.stack(examples))
    assert torch.equal(a["labels"], a["input_ids"])
    assert bool((a["attention_mask"] == 1).all())
    b = col(examples, [7, 8, 9])
    assert torch.equal(a["position_ids"], b["position_ids"])    # same index -> same positions
    # example 8's ids are those of its own generator, whatever batch it sits in
    alone = col([examples[1]], [8])["position_ids"][0]
    assert torch.equal(alone, a["position_ids"][1])
    assert torch.equal(alone, sample_pose_position_ids(16, 128, 2, example_generator(5, 8)))
    other_seed = PoseCollator(16, 128, 2, seed=6)(examples, [7, 8, 9])["position_ids"]
    assert not torch.equal(other_seed, a["position_ids"])
    plain = PoseCollator(16, None)(examples, [0, 1, 2])["position_ids"]
    assert torch.equal(plain, torch.arange(16).expand(3, -1))
    with pytest.raises(ValueError, match="must hold window=16 tokens"):
        col([torch.arange(15)], [0])


def _tiny_llama(max_pos=64):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                        max_position_embeddings=max_pos)).eval()


def test_collator_batch_lets_the_second_chunk_attend_to_the_first():
    # transformers >= 5 reads jumps in position_ids as packed-sequence boundaries when no
    # attention mask is given; the collator's explicit mask must keep attention across the skip.
    model = _tiny_llama()
    col = PoseCollator(window=16, target=64, num_chunks=2, seed=0)
    idx = next(i for i in range(100) if len(_chunks(
        sample_pose_position_ids(16, 64, 2, example_generator(0, i)))) == 2)
    ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(1))
    batch = col([ids], [idx])
    first_len = len(_chunks(batch["position_ids"][0])[0])
    changed = ids.clone()
    changed[0] = (changed[0] + 1) % 128                       # a token of the first chunk only
    batch2 = col([changed], [idx])
    with torch.no_grad():
        out1 = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        out2 = model(**{k: v for k, v in batch2.items() if k != "labels"}).logits
        # reference: the same positions with a hand-built full causal mask (4-D, additive)
        causal = torch.full((16, 16), float("-inf")).triu(1)[None, None]
        ref = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                    attention_mask=causal).logits
    assert (out1[0, -1] - out2[0, -1]).abs().max() > 1e-4     # the last token sees token 0
    assert first_len < 16
    torch.testing.assert_close(out1, ref, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------ data
def test_split_holdout_by_name_and_count_never_overlaps():
    docs = [Document(f"d{i}", f"text {i}") for i in range(5)]
    train, held = datalib.split_holdout(docs, ["d1", "d3"])
    assert [d.name for d in held] == ["d1", "d3"] and [d.name for d in train] == ["d0", "d2", "d4"]
    train, held = datalib.split_holdout(docs, 2)
    assert [d.name for d in held] == ["d3", "d4"] and len(train) == 3
    with pytest.raises(ValueError, match="not among the loaded"):
        datalib.split_holdout(docs, ["nope"])
    with pytest.raises(ValueError, match="0 < holdout < 5"):
        datalib.split_holdout(docs, 5)
    dup = docs + [Document("copy", "text 1")]
    with pytest.raises(ValueError, match="also appear in the training set"):
        datalib.split_holdout(dup, ["d1"])


def test_load_local_documents_and_missing_column(tmp_path):
    (tmp_path / "a.txt").write_text("alpha text")
    (tmp_path / "b.md").write_text("beta text")
    docs = datalib.recipe_documents(DataConfig(str(tmp_path)))
    assert [(d.name, d.text) for d in docs] == [("a", "alpha text"), ("b", "beta text")]
    rows = tmp_path / "rows"
    rows.mkdir()
    (rows / "x.jsonl").write_text("\n".join(json.dumps({"body": f"row {i}"}) for i in range(3)))
    assert [d.text for d in datalib.recipe_documents(DataConfig(str(rows), text_column="body"))] == \
        ["row 0", "row 1", "row 2"]
    with pytest.raises(ValueError, match="has no column 'text'; its columns are \\['body'\\]. Pass data.text_column"):
        datalib.recipe_documents(DataConfig(str(rows)))


def test_epoch_order_is_a_seeded_permutation():
    a = datalib.epoch_order(50, seed=1, epoch=0)
    assert sorted(a) == list(range(50))
    assert a == datalib.epoch_order(50, seed=1, epoch=0)
    assert a != datalib.epoch_order(50, seed=1, epoch=1) and a != datalib.epoch_order(50, seed=2, epoch=0)


# ----------------------------------------------------------------------------------------- optim
def test_schedule_warms_up_linearly_then_holds():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=2e-5)
    sched = build_scheduler(opt, "constant_with_warmup", warmup_steps=4, total_steps=10)
    lrs = []
    for _ in range(7):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    # transformers' constant_with_warmup (the Trainer's): lr x step / warmup, then lr
    assert lrs == pytest.approx([0.0, 0.5e-5, 1e-5, 1.5e-5, 2e-5, 2e-5, 2e-5])
    with pytest.raises(ValueError, match="Unknown lr schedule"):
        build_scheduler(opt, "triangle", 1, 2)


def test_accelerate_clipping_really_clips_to_max_norm():
    from accelerate import Accelerator
    model = _tiny_llama()
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.mul(100.0).backward()
    before = {n: p.grad.clone() for n, p in model.named_parameters()}
    flat = torch.cat([g.flatten().double() for g in before.values()])
    expected_pre = float(flat.norm())
    assert grad_norm(model.parameters()) == pytest.approx(expected_pre, rel=1e-9)
    max_norm = expected_pre / 10
    pre = Accelerator(cpu=True).clip_grad_norm_(model.parameters(), max_norm)
    assert float(pre) == pytest.approx(expected_pre, rel=1e-5)
    assert grad_norm(model.parameters()) == pytest.approx(max_norm, rel=1e-5)
    for n, p in model.named_parameters():   # every gradient scaled by the same max/pre
        torch.testing.assert_close(p.grad, before[n] * (max_norm / expected_pre), rtol=1e-4, atol=1e-9)


def test_hub_name_goes_through_datasets_load_dataset(monkeypatch):
    # The real Hub code path (PG19 in the papers), fed local rows instead of the network.
    import datasets
    calls = []

    def fake_load_dataset(name, subset=None, split=None, streaming=False):
        calls.append((name, subset, split, streaming))
        ds = datasets.Dataset.from_dict({"text": ["a b", "c d", "e f"], "short_book_title": ["A", "B", "C"]})
        return ds.to_iterable_dataset() if streaming else ds

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    docs = datalib.recipe_documents(DataConfig("pg19", split="test", max_documents=2))
    assert calls == [("pg19", None, "test", False)]
    assert [(d.name, d.text) for d in docs] == [("A", "a b"), ("B", "c d")]
    streamed = datalib.recipe_documents(DataConfig("emozilla/pg19", max_documents=1, streaming=True))
    assert calls[-1] == ("emozilla/pg19", None, "train", True) and streamed[0].text == "a b"
    with pytest.raises(ValueError, match="no column 'body'"):
        datalib.recipe_documents(DataConfig("pg19", text_column="body"))
