"""The rough edges a new user meets first: each simply works, or is a one-line
error naming the problem and the fix before any weight loads.

1. `hf-posext lm-eval` defaults to its own model type and hands RULER a folder with the tokenizer
   of a GGUF (the embedded default), saved once and reused;
2. an entry written by a newer hf_posext names that version and the upgrade;
3. `eval --methods all` skips the cells STRING's defaults cannot run (a note), `--methods string`
   refuses them;
4. a wrong value inside a saved entry names the file and the entry;
5. the results table keeps its natural width where there is no terminal.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import transformers
from _evalkit import char_tokenizer
from conftest import TRAINED, tiny_model

import hf_posext
from hf_posext import cli
from hf_posext.errors import ConfigError
from hf_posext.evaluation.shared.record import read_rows

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_load(monkeypatch):
    """Any weight load fails the test: the error must come first."""
    def refuse(*a, **k):
        raise AssertionError("weights were loaded before the error")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def _cli_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert stop.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------------ 1. lm-eval and a GGUF's tokenizer
@pytest.fixture
def lm_run(monkeypatch, tmp_path):
    """`hf-posext lm-eval ARGS` up to lm-eval's run: returns (the arguments lm-eval runs with,
    how often a GGUF's tokenizer was read). The GGUF tokenizer reader gives the character
    tokenizer (reading the embedded one takes ~20 s); nothing runs."""
    pytest.importorskip("lm_eval")
    from lm_eval._cli import HarnessCLI

    from hf_posext.evaluation.integrations import harness
    monkeypatch.setenv("HF_POSEXT_CACHE", str(tmp_path / "cache"))
    reads = []

    def read(folder, gguf):
        reads.append((folder, gguf))
        return char_tokenizer()
    monkeypatch.setattr(harness, "load_tokenizer", read)
    ran = []
    monkeypatch.setattr(HarnessCLI, "execute", lambda self, ns: ran.append(ns))

    def run(*argv):
        assert cli.main(["lm-eval", *argv]) == 0
        return ran[-1], len(reads)
    return run


def _ruler_tokenizer_name(ns):
    """The tokenizer name lm-eval's RULER builders get: lm-eval's own config merges model_args
    and --metadata into the tasks' metadata, and RULER picks its name from it."""
    from lm_eval.config.evaluate_config import EvaluatorConfig
    from lm_eval.tasks.ruler.common_utils import resolve_tokenizer_name
    return resolve_tokenizer_name(EvaluatorConfig.from_cli(ns).metadata)


@pytest.mark.parametrize("model", ["embedded", "gguf_file"])
def test_lm_eval_defaults_to_hf_posext_and_gives_ruler_the_gguf_tokenizer(lm_run, tmp_path, model):
    if model == "embedded":
        args = "pretrained=embedded:smollm2-135m,method=yarn,factor=2"
    else:
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "m.gguf").write_bytes(b"GGUF one")
        args = f"pretrained={tmp_path / 'm'},gguf_file=m.gguf,method=yarn,factor=2"
    ns, reads = lm_run("--model_args", args, "--tasks", "niah_single_1")
    assert ns.model == "hf-posext" and reads == 1              # no --model: hf_posext's own type
    folder = ns.model_args["tokenizer"]
    assert Path(folder).parent == tmp_path / "cache" / "tokenizers"
    assert _ruler_tokenizer_name(ns) == folder                  # what RULER loads, lm-eval's way
    saved = transformers.AutoTokenizer.from_pretrained(folder)  # as RULER's get_tokenizer does
    text = "What is the special magic number for 1234567?"
    assert saved(text).input_ids == char_tokenizer()(text).input_ids
    again, reads = lm_run("--model", "hf-posext", "--model_args", args, "--tasks", "niah_single_1")
    assert again.model_args["tokenizer"] == folder and reads == 1   # reused, not read again
    if model == "gguf_file":   # another GGUF at that path: another folder
        (tmp_path / "m" / "m.gguf").write_bytes(b"GGUF two, longer")
        other, reads = lm_run("--model_args", args, "--tasks", "niah_single_1")
        assert other.model_args["tokenizer"] != folder and reads == 2


def test_lm_eval_leaves_a_given_tokenizer_and_plain_folders_alone(lm_run, tmp_path):
    ns, reads = lm_run("--model_args", "pretrained=embedded:smollm2-135m,tokenizer=tok", "--tasks", "x")
    assert ns.model_args["tokenizer"] == "tok" and reads == 0
    ns, reads = lm_run("--model_args", "pretrained=embedded:smollm2-135m",
                       "--metadata", '{"tokenizer": "tok2"}', "--tasks", "x")
    assert "tokenizer" not in ns.model_args and _ruler_tokenizer_name(ns) == "tok2" and reads == 0
    ns, reads = lm_run("--model", "hf", "--model_args", f"pretrained={tmp_path}", "--tasks", "x")
    assert ns.model == "hf" and "tokenizer" not in ns.model_args and reads == 0


def test_lm_eval_hf_type_cannot_read_the_embedded_name(capsys, no_load):
    pytest.importorskip("lm_eval")
    line = _cli_error(capsys, ["lm-eval", "--model", "hf", "--model_args",
                               "pretrained=embedded:smollm2-135m", "--tasks", "niah_single_1"])
    assert "--model hf-posext (the default here" in line


@pytest.mark.slow
def test_lm_eval_runs_ruler_on_the_embedded_model_offline(tmp_path, monkeypatch):
    """The documented lm-eval command on the embedded GGUF model, no --model, no tokenizer=: lm-eval's own
    niah_single_1 runs offline (1k tokens, one sample, to be quick)."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_POSEXT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "lm"
    assert cli.main(["lm-eval", "--model_args", "pretrained=embedded:smollm2-135m,method=yarn,factor=2",
                     "--tasks", "niah_single_1", "--metadata", '{"max_seq_lengths":[1024]}', "--limit", "1",
                     "--gen_kwargs", "max_gen_toks=16", "--device", "cpu", "--output_path", str(out)]) == 0
    (result,) = out.rglob("results_*.json")
    data = json.loads(result.read_text())
    assert data["config"]["model"] == "hf-posext"
    assert "1024,none" in data["results"]["niah_single_1"]
    (folder,) = (tmp_path / "cache" / "tokenizers").iterdir()
    assert data["config"]["model_args"]["tokenizer"] == str(folder)


# ------------------------------------------------------------------ 2 and 4. the saved entry
def _saved_with_entry(tmp_path: Path, **edit) -> Path:
    hf_posext.patch(tiny_model(), "yarn", 2.0).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["hf_posext"].update(edit)
    (tmp_path / "config.json").write_text(json.dumps(data))
    return tmp_path


def test_an_entry_from_a_newer_version_names_it_and_the_upgrade(tmp_path, no_load):
    folder = _saved_with_entry(tmp_path, version="9.1.0", future_knob=3)
    with pytest.raises(ConfigError) as err:
        hf_posext.from_pretrained(folder)
    line = str(err.value)
    assert line.startswith(f"{folder / 'config.json'}: entry 'hf_posext' was written by hf_posext 9.1.0")
    assert "['future_knob']" in line and "pip install -U 'hf_posext>=9.1.0'" in line
    assert "\n" not in line
    # the same key from this version (or an unreadable version) is a mistake, not a newer format
    for version in (hf_posext.__version__, "not-a-version"):
        folder = _saved_with_entry(tmp_path / version, version=version, future_knob=3)
        with pytest.raises(ConfigError, match=r"Unknown RopeExtensionConfig keys \['future_knob'\]"):
            hf_posext.from_pretrained(folder)


def test_a_newer_entry_with_a_value_this_version_refuses_names_the_upgrade(tmp_path, no_load):
    folder = _saved_with_entry(tmp_path, version="9.1.0", method="yarn_v2")
    with pytest.raises(ConfigError, match=r"Unknown RoPE extension method 'yarn_v2'.*written by "
                                          r"hf_posext 9\.1\.0 \(installed: .*upgrade"):
        hf_posext.from_pretrained(folder)


@pytest.mark.parametrize("key, value, says", [
    ("factor", "2", "factor must be a number, got '2'"),
    ("beta_fast", -1, "beta_fast"),
    ("rope_theta", "theta", "could not convert string to float"),
])
def test_a_wrong_value_in_the_entry_names_the_file_and_entry(tmp_path, capsys, no_load, key, value, says):
    folder = _saved_with_entry(tmp_path, **{key: value})
    with pytest.raises(ConfigError) as err:
        hf_posext.from_pretrained(folder)
    line = str(err.value)
    assert line.startswith(f"{folder / 'config.json'}: entry 'hf_posext': ") and says in line
    assert "restore the value hf_posext saved" in line and "\n" not in line
    # the commands load through the same check: one line, before any weight
    line = _cli_error(capsys, ["eval", "--model", str(folder), "--methods", "yarn", "--lengths", "64"])
    assert str(folder / "config.json") in line and "entry 'hf_posext'" in line


# ------------------------------------------------------------------ 3. --methods all and STRING
def test_methods_all_skips_cells_string_defaults_cannot_run(tmp_path, capsys):
    """At L = 64 STRING's defaults give W = S (attention_methods.md): under `--methods all` its
    cells are left out with a note; named, or with knobs given for it, they are refused."""
    from hf_posext.evaluation.shared.inputs import InputError, check_cells
    from hf_posext.evaluation.shared.grid import normalize_methods
    config = tiny_model().config
    assert config.max_position_embeddings == TRAINED
    every = normalize_methods(["all"])
    skipped = check_cells(config, every, [64, 128], ["auto"], {}, skip_unfit=True)
    assert skipped == (("string", 64, 1.0), ("string", 128, 2.0))
    note = capsys.readouterr().err.strip()
    assert note.startswith("note: --methods all: string skipped at 64 tokens (s = 1), 128 tokens (s = 2)")
    assert "shifts nothing" in note and "\n" not in note
    with pytest.raises(InputError, match=r"string at --lengths 64 .*shifts nothing"):
        check_cells(config, normalize_methods(["string"]), [64, 128], ["auto"], {})
    bad = {"string": {"local_value": 21}}     # the user's own knob: W = 21 = the default S
    with pytest.raises(InputError, match="shifts nothing"):
        check_cells(config, every, [64], ["auto"], bad, skip_unfit=True)


def test_eval_string_at_such_a_length_refuses_before_loading(tmp_path, capsys, no_load):
    folder = tmp_path / "tiny"
    tiny_model().save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    line = _cli_error(capsys, ["eval", "--model", str(folder), "--methods", "string", "--lengths", "128",
                               "--out", str(tmp_path / "out")])
    assert "string at --lengths 128" in line and "pass both knobs" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_eval_methods_all_runs_the_rest_with_a_note(tmp_path, capsys):
    folder = tmp_path / "tiny"
    tiny_model().save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("".join(chr(32 + (i * 7) % 90) for i in range(400)))
    assert cli.main(["eval", "--model", str(folder), "--dataset", str(tmp_path / "docs"), "--methods", "all",
                     "--lengths", "128", "--no-baseline", "--no-plot", "--no-progress",
                     "--out", str(tmp_path / "out")]) == 0
    assert "note: --methods all: string skipped at 128 tokens" in capsys.readouterr().err
    rows = read_rows(tmp_path / "out" / "perplexity.json")
    assert {r["method"] for r in rows} == {"none", *hf_posext.METHODS} - {"string"}


# ------------------------------------------------------------------ 5. the table without a terminal
def test_the_table_keeps_its_natural_width_without_a_terminal(capsys):
    from hf_posext.evaluation.shared.results import print_table
    rows = [{"method": m, "length": n, "protocol": "truncate", "perplexity": p, "trained_length": 8192,
             "ratio_to_sliding": p / 20.0 if n == 32768 else None}
            for m, p in (("none", 300.0), ("yarn", 21.5), ("dual_chunk", 20.9))
            for n in (2048, 4096, 8192, 16384, 32768)]
    rows.append({"method": "none", "protocol": "baseline", "window": 8192, "stride": 4096,
                 "length": 32768, "perplexity": 20.0})
    assert not sys.stdout.isatty()          # captured: what `make demo > log` sees
    print_table(rows, "perplexity", "perplexity, truncate", "a caption")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "perplexity, truncate" and lines[-1] == "a caption"
    assert re.match(r"method +2k +4k +8k +16k +32k +ratio to sliding @32k$", lines[1])
    body = lines[3:-1]                      # one line a series, nothing wrapped
    assert [ln.split("  ")[0].strip() for ln in body] == [
        "none", "yarn", "dual_chunk", "none, sliding 8k window (stride 4k)"]
    assert body[1].split()[1:] == ["21.50"] * 5 + [f"{21.5 / 20:.3f}"]
    assert max(map(len, lines)) > 80        # wider than rich's 80 columns, as it is
    assert len({len(ln) for ln in lines[1:-1]}) == 1


def test_the_table_is_drawn_by_rich_on_a_terminal(monkeypatch, capsys):
    pytest.importorskip("rich")
    import rich.console

    from hf_posext.evaluation.shared.results import print_table
    monkeypatch.setattr(rich.console.Console, "is_terminal", property(lambda self: True))
    print_table([{"method": "none", "length": 64, "protocol": "truncate", "perplexity": 3.0}])
    assert "┃" in capsys.readouterr().out or os.environ.get("TERM") == "dumb"
