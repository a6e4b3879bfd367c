"""`hf-posext`: argument parsing, every bad input failing before a model loads, and end-to-end
runs on a tiny local model folder (no Hub)."""

import json

import pytest

import hf_posext.cli as cli
from hf_posext.commands import model_args
from hf_posext.evaluation.shared import inputs
from _evalkit import char_tokenizer, tiny_model
from hf_posext.evaluation.shared.record import read_rows


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama (trained length 64) and a character tokenizer saved as a local checkpoint."""
    path = tmp_path_factory.mktemp("tiny")
    tiny_model().save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "docs.jsonl"
    lines = [json.dumps({"body": ("To be, or not to be, that is the question. " * 12)[:i]})
             for i in (500, 300)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def no_model_load(monkeypatch):
    def refuse(args):
        raise AssertionError("the model was loaded before the input was checked")
    monkeypatch.setattr(model_args, "load_model_from", refuse)


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    return exc.value.code, capsys.readouterr().err


def test_parse_lengths_and_factors():
    assert inputs.parse_lengths("4k,16384,2K,4k") == [2048, 4096, 16384]
    assert inputs.parse_lengths("1.5k") == [1536]
    assert inputs.parse_factors("auto,2,4.5") == ["auto", 2.0, 4.5]
    assert inputs.parse_methods("yarn,pi,none,dynamic") == ["yarn", "linear", "none", "dynamic_ntk"]
    assert inputs.parse_seed("3") == 3 and inputs.parse_seed(" 0") == 0
    assert inputs.parse_floats01("0,50%,1", "--depths") == [0.0, 0.5, 1.0]


def test_methods_and_knobs_come_from_the_config(monkeypatch):
    import dataclasses

    import hf_posext.catalog as config   # every method name (rope + attention)
    from hf_posext.rope.config import RopeExtensionConfig
    from hf_posext.evaluation.shared.grid import knob_names
    from hf_posext.attention import AttentionExtensionConfig
    fields = {f.name for f in dataclasses.fields(RopeExtensionConfig)} - {"method", "factor"}
    attention = {f.name for f in dataclasses.fields(AttentionExtensionConfig)} - {
        "method", "trained_length", "target_length"}
    assert set(knob_names()) == fields | attention
    assert inputs.parse_methods("all") == list(config.METHODS)
    assert inputs.parse_knobs("yarn:beta_fast=64,mscale_coefficient=0.07", ["yarn", "dynamic_yarn"]) == \
        {"yarn": {"beta_fast": 64.0}, "*": {"mscale_coefficient": 0.07}}
    with pytest.raises(inputs.InputError, match="'ntk' does not use 'beta_fast'"):
        inputs.parse_knobs("beta_fast=64", ["ntk", "yarn"])
    with pytest.raises(inputs.InputError, match="unknown knob 'alpha'"):
        inputs.parse_knobs("alpha=1", ["yarn"])
    with pytest.raises(inputs.InputError, match="beta_fast must be greater than beta_slow"):
        inputs.parse_knobs("yarn:beta_fast=0.5", ["yarn"])
    with pytest.raises(inputs.InputError, match="not among the methods run"):
        inputs.parse_knobs("yarn:beta_fast=64", ["ntk"])
    # attention methods' knobs: integers, auto, true/false; each checked by its own config
    assert inputs.parse_knobs("leaky_rerope:window=4096,leaky_rerope:leak=auto,self_extend:logn=true",
                           ["leaky_rerope", "self_extend"]) == \
        {"leaky_rerope": {"window": 4096, "leak": "auto"}, "self_extend": {"logn": True}}
    with pytest.raises(inputs.InputError, match="'self_extend' does not use 'leak'"):
        inputs.parse_knobs("self_extend:leak=3", ["self_extend"])
    with pytest.raises(inputs.InputError, match="leak .* must be a number > 1"):
        inputs.parse_knobs("leaky_rerope:leak=0.5", ["leaky_rerope"])
    with pytest.raises(inputs.InputError, match="not a number, true/false or auto"):
        inputs.parse_knobs("leaky_rerope:leak=big", ["leaky_rerope"])
    # A method added to the config's table (as the attention-level ones are) is accepted as is.
    real = config.canonical_method
    monkeypatch.setattr(config, "canonical_method",
                        lambda m: "toy_attention" if m == "toy_attention" else real(m))
    monkeypatch.setattr(config, "METHODS", config.METHODS + ("toy_attention",))
    assert inputs.parse_methods("toy_attention,all")[0] == "toy_attention"
    assert "toy_attention" in inputs.parse_methods("all") and inputs.parse_knobs(None, ["toy_attention"]) == {}


@pytest.mark.parametrize("argv,message", [
    (["eval", "--lengths", "0"], "--lengths: '0' must be a positive"),
    (["eval", "--lengths=4k,-4k"], "--lengths: '-4k' must be a positive"),
    (["eval", "--lengths", "four"], "--lengths: 'four' is not a length"),
    (["eval", "--methods", "yarn,rope2"], "--methods: unknown method 'rope2'"),
    (["eval", "--factor", "0.5"], "--factor: factor must be >= 1.0, got 0.5"),
    (["eval", "--protocol", "chunked"], "--protocol: unknown protocol 'chunked'"),
    (["eval", "--protocol", "sliding", "--lengths", "128", "--stride", "512"], "--stride 512 is longer"),
    (["eval", "--stride", "0"], "--stride must be a positive integer"),
    (["eval", "--max-docs", "0"], "--max-docs must be a positive integer"),
    (["eval", "--protocol", "sliding", "--eval-tokens", "0"], "--eval-tokens: '0' must be a positive"),
    (["eval", "--protocol", "sliding", "--eval-tokens", "1k"], "--eval-tokens 1024 is shorter"),
    (["eval", "--dataset", "./no/such/file.jsonl"], "no such file or folder"),
    (["eval", "--model", "./no/such/model"], "--model './no/such/model': no such folder"),
    (["eval", "--device", "gpu0"], "--device 'gpu0': use cpu"),
    (["passkey", "--depths", "0.5,2"], "--depths: 2 must be between 0 and 1"),
    (["passkey", "--trials", "0"], "--trials must be at least 1, got 0"),
    (["passkey", "--seed", "-1"], "--seed must be an integer >= 0 (where the random numbers start; default 0), got -1"),
    (["passkey", "--seeds", "5"], "passkey has no --seeds: it takes --trials N (seeds 0 .. N-1) and --seed S"),
    (["retrieval", "--seed", "x"], "--seed must be an integer >= 0, got 'x'"),
])
def test_bad_input_fails_before_loading(argv, message, capsys, no_model_load, tmp_path):
    code, err = run(argv + ["--out", str(tmp_path / "out")], capsys)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


def test_missing_column_and_too_long_lengths(model_dir, text_file, capsys, no_model_load, tmp_path):
    base = ["eval", "--model", str(model_dir), "--dataset", str(text_file), "--out", str(tmp_path)]
    code, err = run(base + ["--lengths", "64"], capsys)
    assert code == 2 and "no column 'text'" in err and "body" in err
    code, err = run(base + ["--column", "body", "--lengths", "64,1k"], capsys)
    assert code == 2 and "--lengths" in err and "1024 tokens" in err and "longest has 500" in err
    code, err = run(["eval", "--model", str(model_dir), "--gguf-file", "m.gguf"], capsys)
    assert code == 2 and "--gguf-file 'm.gguf' is not in" in err
    code, err = run(["passkey", "--model", str(model_dir), "--lengths", "100", "--out",
                     str(tmp_path / "pk")], capsys)
    assert code == 2 and "too short for a passkey prompt" in err


@pytest.mark.slow
def test_eval_end_to_end_and_resume(model_dir, text_file, capsys, tmp_path):
    out = tmp_path / "out"
    argv = ["eval", "--model", str(model_dir), "--dataset", str(text_file), "--column", "body",
            "--lengths", "32,64,128", "--methods", "linear,yarn", "--protocol", "truncate,sliding",
            "--stride", "16", "--eval-tokens", "128", "--max-docs", "2", "--out", str(out), "--no-progress",
            "--cache-dir", str(tmp_path / "cache")]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    rows = read_rows(out / "perplexity.json")
    assert len(rows) == 2 * 3 * 3 + 1 and {r["docs"] for r in rows} == {2}
    # The sliding-window baseline: unpatched, window = trained length 64, over the first 128 tokens.
    base = [r for r in rows if r["protocol"] == "baseline"]
    assert [(b["method"], b["length"], b["window"], b["stride"]) for b in base] == [("none", 128, 64, 16)]
    yarn128 = next(r for r in rows if (r["method"], r["length"], r["protocol"]) == ("yarn", 128, "truncate"))
    assert yarn128["ratio_to_sliding"] == pytest.approx(yarn128["perplexity"] / base[0]["perplexity"], abs=1e-4)
    assert "ratio to sliding" in printed
    assert {r["tokens"] for r in rows if r["protocol"] == "sliding"} == {2 * 127}
    assert (out / "perplexity_truncate.png").stat().st_size > 0
    assert (out / "perplexity_sliding.png").stat().st_size > 0
    assert "linear" in printed and "128" in printed
    code, err = run(argv, capsys)                       # results exist, no --resume
    assert code == 2 and "--resume" in err
    assert cli.main(argv + ["--resume"]) == 0
    assert len(read_rows(out / "perplexity.json")) == 19


@pytest.mark.slow
def test_passkey_end_to_end(model_dir, capsys, tmp_path):
    out = tmp_path / "pk"
    assert cli.main(["passkey", "--model", str(model_dir), "--lengths", "400,500", "--methods", "ntk",
                     "--depths", "0,1", "--trials", "2", "--out", str(out), "--no-progress"]) == 0
    rows = read_rows(out / "passkey.json")
    assert len(rows) == 2 * 2 * 2 and all(r["seeds"] == 2 for r in rows)
    assert (out / "passkey_none.png").exists() and (out / "passkey_ntk.png").exists()


@pytest.mark.slow
def test_a_resumed_run_draws_every_row_of_its_series(model_dir, text_file, capsys, tmp_path,
                                                     monkeypatch):
    """A later run with other lengths plots (and tabulates) the folder's rows of its series, not
    its own cells only; rows of other knobs stay out."""
    from hf_posext.commands import eval as eval_command, passkey as passkey_command

    # each command imports its plotting function at its top: patch it where it is read
    drawn = {}
    monkeypatch.setattr(passkey_command, "plot_passkey_heatmap",
                        lambda rows, path, title: drawn.setdefault(path.name, []).append(rows))
    monkeypatch.setattr(eval_command, "plot_perplexity",
                        lambda rows, path, title: drawn.setdefault(path.name, []).append(rows))
    pk = ["passkey", "--model", str(model_dir), "--methods", "ntk", "--depths", "1", "--trials", "1",
          "--out", str(tmp_path / "pk"), "--no-progress", "--resume"]
    assert cli.main(pk + ["--lengths", "400"]) == 0
    assert cli.main(pk + ["--lengths", "500"]) == 0
    last = drawn["passkey_ntk.png"][-1]
    assert sorted(r["length"] for r in last) == [400, 500]
    ev = ["eval", "--model", str(model_dir), "--dataset", str(text_file), "--column", "body",
          "--methods", "self_extend", "--max-docs", "1", "--out", str(tmp_path / "ev"),
          "--no-progress", "--resume", "--cache-dir", str(tmp_path / "cache")]
    assert cli.main(ev + ["--lengths", "96", "--knobs", "self_extend:window=16"]) == 0
    assert cli.main(ev + ["--lengths", "128", "--knobs", "self_extend:window=16"]) == 0
    assert cli.main(ev + ["--lengths", "128", "--knobs", "self_extend:window=32"]) == 0
    capsys.readouterr()
    second, third = drawn["perplexity_truncate.png"][-2:]
    assert sorted((r["method"], r["length"]) for r in second if r["protocol"] == "truncate") == \
        [("none", 96), ("none", 128), ("self_extend", 96), ("self_extend", 128)]
    assert {r["knobs"] for r in third if r["method"] == "self_extend"} == {"window=32"}


def test_version_and_model_keyword_arguments(model_dir, capsys, tmp_path):
    import hf_posext
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"hf-posext {hf_posext.__version__}"
    args = cli.build_parser().parse_args(["eval", "--model", "m", "--revision", "v2", "--dtype", "auto",
                                          "--attn-implementation", "eager", "--device-map", "auto"])
    assert model_args.ModelSpec.from_args(args).model_kwargs() == {"dtype": "auto", "revision": "v2",
                                       "attn_implementation": "eager", "device_map": "auto"}
    # They reach the model: the rows record the attention implementation and the resolved dtype.
    out = tmp_path / "pk"
    assert cli.main(["passkey", "--model", str(model_dir), "--lengths", "400", "--methods", "none",
                     "--depths", "1", "--trials", "1", "--dtype", "float32", "--attn-implementation",
                     "eager", "--out", str(out), "--no-progress", "--no-plot"]) == 0
    row = read_rows(out / "passkey.json")[0]
    assert row["attn_implementation"] == "eager" and row["dtype"] == "float32"
