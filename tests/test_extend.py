"""`hf-posext extend`: a base checkpoint to an extended folder with its tokenizer and a model card;
`--eval` figures in the card and the folder's summary; `--push-to-hub` up to the upload call;
every bad input refused in one line before anything loads. `hf-posext compare` over two runs."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from hf_posext import cli
from hf_posext.evaluation import read_rows
from hf_posext.portability.serving import command
from _evalkit import char_tokenizer

TRAINED = 512


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny random Llama trained (nominally) at 512 positions, with a character tokenizer, and a
    text of 2,000 words to measure on."""
    root = tmp_path_factory.mktemp("extend")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=128,
                                 max_position_embeddings=TRAINED)).save_pretrained(root / "base")
    char_tokenizer().save_pretrained(root / "base")
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far"]
    (root / "text.txt").write_text(" ".join(words[(i * 7) % 10] for i in range(2000)))
    return root


def run(argv, capsys):
    code = cli.main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_extend_writes_a_checkpoint_transformers_loads_and_a_card(base, tmp_path, capsys):
    out = tmp_path / "tiny-yarn-1k"
    code, said, _ = run(["extend", str(base / "base"), str(out), "--method", "yarn", "--factor", "2",
                         "--engine", "vllm"], capsys)
    assert code == 0 and "wrote" in said
    # plain transformers (hf_posext's registrations play no part in a native yarn type) reads the
    # extension: its own yarn at factor 2 over 512 positions, 1,024 positions in all
    config = AutoConfig.from_pretrained(out)
    rope = getattr(config, "rope_parameters", None) or config.rope_scaling
    assert rope["rope_type"] == "yarn" and rope["factor"] == 2.0
    assert rope["original_max_position_embeddings"] == TRAINED and config.max_position_embeddings == 2 * TRAINED
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model(torch.arange(2 * TRAINED)[None] % 128).logits.shape[1] == 2 * TRAINED
    assert (out / "tokenizer.json").is_file()
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers" and "yarn" in card.data.tags
    # the serve line is the one `hf-posext serve` derives for the folder
    assert command(str(out), "vllm").line() in card.text
    assert "yarn" in card.text and "512" in card.text and "1,024" in card.text
    assert "hf-posext extend" in card.text


def test_extend_eval_puts_stored_figures_in_the_card_and_a_summary(base, tmp_path, capsys):
    out = tmp_path / "tiny-ntk"
    code, _, _ = run(["extend", str(base / "base"), str(out), "--method", "ntk", "--target-length", "1024",
                      "--eval", "--eval-text", str(base / "text.txt"), "--eval-trials", "1",
                      "--eval-depths", "0.5"], capsys)
    assert code == 0
    rows = read_rows(out / "eval" / "perplexity.json")
    stored = next(r for r in rows if r["method"] == "ntk" and r["length"] == 1024 and r["protocol"] == "truncate")
    card = ModelCard.load(out / "README.md")
    metrics = {m["type"]: m["value"] for result in card.data.to_dict()["model-index"][0]["results"]
               for m in result["metrics"]}
    assert metrics["perplexity"] == pytest.approx(stored["perplexity"], rel=1e-4)
    assert metrics["perplexity_ratio"] == pytest.approx(stored["ratio_to_sliding"])
    hits = [r for r in read_rows(out / "eval" / "retrieval.json") if r["method"] == "ntk" and r["length"] == 1024]
    assert metrics["accuracy"] == pytest.approx(sum(r["correct"] for r in hits) / sum(r["trials"] for r in hits))
    summary = json.loads((out / "eval" / "summary.json").read_text())
    assert [s["kind"] for s in summary["sections"]] == ["perplexity", "retrieval"]
    assert (out / "eval" / "summary.md").read_text().startswith("# Summary")
    # two runs side by side: a table and one plot
    other = tmp_path / "tiny-yarn"
    assert run(["extend", str(base / "base"), str(other), "--method", "yarn", "--factor", "2", "--eval",
                "--eval-text", str(base / "text.txt"), "--eval-trials", "1", "--eval-depths", "0.5"], capsys)[0] == 0
    code, said, _ = run(["compare", str(out / "eval"), str(other / "eval"), "--out", str(tmp_path / "c.png")], capsys)
    assert code == 0 and "ntk" in said and "yarn" in said and (tmp_path / "c.png").stat().st_size > 10_000


def test_push_to_hub_uploads_the_folder(base, tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr("huggingface_hub.HfApi.create_repo", lambda self, repo, **kw: calls.append(("create", repo, kw)))
    monkeypatch.setattr("huggingface_hub.HfApi.upload_folder", lambda self, **kw: calls.append(("upload", kw)))
    out = tmp_path / "pushed"
    code, said, _ = run(["extend", str(base / "base"), str(out), "--method", "linear", "--factor", "2",
                         "--push-to-hub", "me/tiny-linear", "--private"], capsys)
    assert code == 0 and "uploaded" in said
    assert calls == [("create", "me/tiny-linear", {"private": True, "exist_ok": True}),
                     ("upload", {"folder_path": str(out), "repo_id": "me/tiny-linear",
                                 "commit_message": "hf-posext extend"})]


@pytest.mark.parametrize("extra, says", [
    (["--method", "nope", "--factor", "2"], "nope"),
    (["--method", "yarn", "--factor", "0.5"], "--factor"),
    (["--method", "yarn", "--target-length", "256"], "not past the trained length"),
    (["--method", "self_extend", "--factor", "2", "--engine", "vllm"], "attention-level"),
    (["--method", "dynamic_yarn", "--factor", "2", "--engine", "vllm"], "cannot run dynamic_yarn"),
    (["--method", "yarn", "--factor", "2", "--push-to-hub", "bad//name"], "--push-to-hub"),
    (["--method", "yarn", "--factor", "2", "--eval", "--eval-text", "/no/such.txt"], "such"),
])
def test_bad_input_is_one_line_before_any_load(base, tmp_path, capsys, monkeypatch, extra, says):
    def no_load(*a, **k):
        raise AssertionError("the model loaded")
    monkeypatch.setattr("hf_posext.data.embedded.load_model", no_load)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["extend", str(base / "base"), str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("hf-posext extend")
    if says:
        assert says in err
    assert not (tmp_path / "o").exists()


def test_an_occupied_out_is_refused(base, tmp_path, capsys):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit):
        cli.main(["extend", str(base / "base"), str(tmp_path / "o"), "--method", "yarn", "--factor", "2"])
    assert "not empty" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["keep.txt"]


def test_a_base_with_its_own_theta_is_extended_for_an_engine(tmp_path, capsys):
    """A base transformers 5 saved states θ in rope_parameters only; the engine check reads it as
    the extension will be written (both layouts), not as a 4.x reader would read the base."""
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=128, max_position_embeddings=TRAINED,
                                 rope_theta=100000.0)   # 5.x keeps it in rope_parameters only
                     ).save_pretrained(tmp_path / "base")
    char_tokenizer().save_pretrained(tmp_path / "base")
    code, _, _ = run(["extend", str(tmp_path / "base"), str(tmp_path / "out"), "--method", "yarn", "--factor", "2",
                      "--engine", "vllm"], capsys)
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert code == 0 and saved["rope_theta"] == 100000.0 and saved["rope_scaling"]["rope_type"] == "yarn"
