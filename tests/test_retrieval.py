"""The retrieval suite: prompts of every task (length, depth, shared prefix, answers present),
the grid on a stub that answers some trials right, the command end to end with resume, the
document haystack, `--dtype auto`, and bad inputs failing in one line before the model loads."""

import dataclasses
import re

import pytest
import transformers

import hf_posext.cli as cli
from _evalkit import char_tokenizer, no_probe, probe, tiny_checkpoint, tiny_model
from hf_posext.commands import model_args
from hf_posext.commands import auto_dtype
from hf_posext.evaluation.retrieval import (TASKS, RetrievalGrid, build_cell, evaluate_retrieval,
                                            get_task, noise_haystack)
from hf_posext.evaluation.retrieval.haystack import document_haystack
from hf_posext.evaluation.retrieval.tasks import NOISE
from hf_posext.data.documents import TextSource
from hf_posext.evaluation.shared.record import read_rows

pytestmark = pytest.mark.usefixtures("one_thread")
RULER_NOISE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and "
               "back again.")


def test_noise_haystack_is_rulers():
    assert NOISE.strip() == RULER_NOISE


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_prompts_of_every_task(task, depth):
    tok = char_tokenizer()
    cell = build_cell(tok, get_task(task), noise_haystack(tok), 1500, depth, range(4))
    for i, trial in enumerate(cell.trials):
        ids = cell.prompt(i)       # prompt and answer within the length, as RULER sizes them
        assert 1500 - len(NOISE) - 10 < len(ids) + cell.max_new_tokens[i] <= 1500
        text = tok.decode(ids)
        assert text.endswith(trial.question)
        for needle in trial.needles:
            assert needle in text
        for answer in trial.answers:            # every answer is written in the haystack
            assert answer in "".join(trial.needles)
        # the queried needle sits at the depth: that fraction of the haystack precedes it
        hay = len(text) - len(trial.head) - len(trial.question) - sum(map(len, trial.needles))
        assert abs((text.index(trial.needles[0]) - len(trial.head)) / hay - depth) < 0.08
        assert len(tok(" " + ", ".join(trial.answers))["input_ids"]) < cell.max_new_tokens[i]
    assert cell.trials == build_cell(tok, get_task(task), noise_haystack(tok), 1500, depth, range(4)).trials
    assert len({t.answers for t in cell.trials}) == 4        # seeds give different trials


def test_single_needle_is_the_passkey():
    from hf_posext.evaluation.passkey import build_prompt, passkey_for_seed
    tok = char_tokenizer()
    cell = build_cell(tok, get_task("single_needle"), noise_haystack(tok), 2000, 0.5, [7])
    assert cell.trials[0].answers == (str(passkey_for_seed(7)),)
    assert cell.prompt(0) == build_prompt(tok, 2000, 0.5, passkey_for_seed(7)).input_ids


def test_multi_key_asks_one_of_several_keys():
    trial = get_task("multi_key").trial(3)
    keys = [n.split(" for ")[1].split(" is")[0] for n in trial.needles]
    assert len(set(keys)) == len(keys) == 4 and f"for {keys[0]} mentioned" in trial.question
    vt = get_task("variable_tracking").trial(3)
    assert vt.needles[0].startswith(f"VAR {vt.answers[0]} = ")
    assert all(f"VAR {b} = VAR {a}." in "".join(vt.needles) for a, b in zip(vt.answers, vt.answers[1:]))


def test_grid_rows_on_a_stub(tmp_path):
    tok, model = char_tokenizer(), tiny_model()

    def half_right(model, tokenizer, cell, reuse_prefix):    # trials 0 and 2 right
        return [", ".join(t.answers) if i % 2 == 0 else "no idea" for i, t in enumerate(cell.trials)]

    grid = RetrievalGrid(["yarn"], [800], depths=[0.5], tasks=["single_needle", "multi_query"], trials=4)
    rows = evaluate_retrieval(model, tok, grid, answer_fn=half_right, progress=False)
    assert {(r["task"], r["method"]) for r in rows} == {(t, m) for t in grid.tasks for m in ("none", "yarn")}
    for r in rows:
        assert (r["correct"], r["trials"], r["accuracy"]) == (2, 4, 0.5)
        assert r["ci_low"] < 0.5 < r["ci_high"] and "no idea" in r["outputs"]
        assert r["dtype"] == "float32" and [len(a) for a in r["answers"]] == [4 if r["task"] == "multi_query" else 1] * 4


def test_a_task_added_or_reworded_leaves_the_other_tasks_stored_cells(tmp_path, monkeypatch):
    """The data hash is the cell's own task's: adding a task to TASKS (as niah_single was) must
    not re-identify the stored cells of the others, while rewording a task must."""
    from hf_posext.evaluation.retrieval import tasks as tasks_mod
    from hf_posext.evaluation.shared.store import ResultsStore
    tok, model = char_tokenizer(), tiny_model()
    computed = []

    def answer(model, tokenizer, cell, reuse_prefix):
        computed.append(cell.trials[0].question)
        return ["no idea"] * len(cell.trials)

    grid = RetrievalGrid(["yarn"], [700], depths=[0.5], tasks=["single_needle", "multi_key"], trials=2)

    def run():
        computed.clear()
        with ResultsStore(tmp_path, "retrieval", resume=True) as store:
            rows = evaluate_retrieval(model, tok, grid, store=store, answer_fn=answer, progress=False)
        return len(computed), {r["task"]: r["data_hash"] for r in rows}

    n, first = run()
    assert n == 4 and first["single_needle"] != first["multi_key"]
    extra = dataclasses.replace(TASKS["multi_key"], name="toy", make=lambda rng, seed: tasks_mod.Trial(
        seed, "A new head.", ("The toy is 5.",), "What is the toy?", ("5",)))
    monkeypatch.setitem(TASKS, "toy", extra)                   # a task added: nothing recomputed
    assert run() == (0, first)
    reworded = dataclasses.replace(TASKS["multi_key"], make=lambda rng, seed: dataclasses.replace(
        tasks_mod._multi_key(rng, seed), head="Reworded head."))
    monkeypatch.setitem(TASKS, "multi_key", reworded)          # a task reworded: its cells only
    n, after = run()
    assert n == 2 and after["single_needle"] == first["single_needle"]
    assert after["multi_key"] != first["multi_key"]


def test_document_haystack_cuts_at_line_ends(tmp_path):
    tok = char_tokenizer()
    path = tmp_path / "play.txt"
    path.write_text("".join(f"Line {i} of the play.\n" for i in range(200)))
    hay = document_haystack(tok, TextSource(str(path)), 1000)
    assert all(tok.decode(list(piece)).endswith("\n") for piece in hay.pieces)
    cell = build_cell(tok, get_task("multi_key"), hay, 1000, 0.3, [0, 1])
    assert "Line 0 of the play." in tok.decode(cell.prefix)
    with pytest.raises(ValueError, match="no document"):
        document_haystack(tok, TextSource(str(path)), 100_000)


def test_probe_shapes_come_from_the_config(model_dir):
    from transformers import LlamaConfig
    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4)
    assert auto_dtype.ProbeShapes.of(config) == auto_dtype.ProbeShapes(64, 96, 4, 64 // 4)
    saved = transformers.AutoConfig.from_pretrained(model_dir)
    assert auto_dtype.auto_inputs(str(model_dir)) == {"shapes": auto_dtype.ProbeShapes(
        saved.hidden_size, saved.intermediate_size, saved.num_attention_heads,
        getattr(saved, "head_dim", None) or saved.hidden_size // saved.num_attention_heads)}


# --- the command ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--depths", "0.5,1.5"], "--depths: 1.5 must be between 0 and 1"),
    (["--depths", "-0.1"], "must be between 0 and 1"),
    (["--tasks", "haystack_sort"], "--tasks: unknown task 'haystack_sort'"),
    (["--trials", "0"], "--trials must be at least 1"),
    (["--lengths", "300"], "--lengths: length 300 is too short for a single_needle prompt"),
    (["--tasks", "multi_value", "--lengths", "600"], "too short for a multi_value prompt"),
    (["--margin", "1.5"], "--margin must be in [0, 1)"),
    (["--dataset", "./no/such.txt"], "no such file or folder"),
])
def test_bad_input_fails_before_loading(extra, message, model_dir, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(model_args, "load_model_from", lambda args: pytest.fail("the model was loaded"))
    code, err = run(["retrieval", "--model", str(model_dir), "--out", str(tmp_path / "o"), *extra], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_api_bad_inputs():
    with pytest.raises(ValueError, match="outside"):
        RetrievalGrid(["yarn"], [1000], depths=[1.2])
    with pytest.raises(ValueError, match="unknown retrieval task"):
        RetrievalGrid(["yarn"], [1000], tasks=["nope"])
    with pytest.raises(ValueError, match="trials must be an integer >= 1"):
        RetrievalGrid(["yarn"], [1000], trials=0)


@pytest.mark.slow
def test_command_end_to_end_and_resume(model_dir, capsys, tmp_path):
    out = tmp_path / "r"
    argv = ["retrieval", "--model", str(model_dir), "--lengths", "700", "--methods", "dynamic_ntk",
            "--tasks", "single_needle", "--depths", "0,1", "--trials", "2", "--out", str(out),
            "--no-progress", "--dtype", "auto"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    printed = captured.out
    chosen = re.search(r"--dtype auto: (\w+) \(", captured.err)
    rows = read_rows(out / "retrieval.json")
    assert len(rows) == 2 * 2 and {r["trials"] for r in rows} == {2}
    assert chosen and {r["dtype"] for r in rows} == {chosen[1]}     # the rows say which dtype ran
    assert "effective length" in printed and "[" in printed
    assert (out / "retrieval_single_needle.png").exists()
    assert (out / "retrieval_single_needle_dynamic_ntk.png").exists()
    assert (out / "retrieval_single_needle_heatmaps.png").exists()
    assert cli.main(argv + ["--resume"]) == 0                  # every cell already there
    assert len(read_rows(out / "retrieval.json")) == 4


def test_dtype_auto_means_the_measured_dtype_for_every_command():
    """`--dtype auto` is the measured faster dtype in every grid command (eval,
    passkey and retrieval alike), and each command's help says so."""
    from hf_posext import cli
    sub = next(a for a in cli.build_parser()._actions if a.choices and "retrieval" in a.choices).choices
    helps = {name: next(a.help for a in sub[name]._actions if "--dtype" in a.option_strings)
             for name in ("retrieval", "eval", "passkey")}
    assert all("probe" in h and "checkpoint" not in h for h in helps.values()), helps


@pytest.mark.parametrize("command", ["eval", "passkey"])
def test_dtype_auto_is_measured_in_eval_and_passkey_too(model_dir, tmp_path, capsys, monkeypatch, command):
    """On a CPU with bf16 matmul instructions the probe decides, for eval and passkey as for
    retrieval; its choice is printed, reaches the rows, and a resumed run keeps it."""
    from hf_posext import cli
    monkeypatch.setattr(auto_dtype, "bf16_matmul_cpu", lambda cpuinfo="": True)
    monkeypatch.setattr(auto_dtype, "probe_times", probe(1.0, 0.5))          # bfloat16 2x faster
    out = tmp_path / command
    extra = ["--depths", "1", "--trials", "1"] if command == "passkey" else ["--no-baseline"]
    argv = [command, "--model", str(model_dir), "--lengths", "400", "--methods", "none", "--dtype",
            "auto", "--out", str(out), "--no-progress", "--no-plot", *extra]
    assert cli.main(argv) == 0
    assert "--dtype auto: bfloat16 (bfloat16 2.00x faster" in capsys.readouterr().err
    name = "passkey" if command == "passkey" else "perplexity"
    assert {r["dtype"] for r in read_rows(out / f"{name}.json")} == {"bfloat16"}
    monkeypatch.setattr(auto_dtype, "probe_times", no_probe)                 # not measured again
    assert cli.main(argv + ["--resume"]) == 0
    assert "--dtype auto: bfloat16 (the run being resumed" in capsys.readouterr().err


def test_heatmap_cells_say_trials_and_the_side_by_side_figure_has_a_panel_per_method(tmp_path, monkeypatch):
    """A cell of 4 trials reads `3/4`, not 75 %; rows without trial counts (older passkey
    results) keep the percentage; the trained length is named on its tick; the side-by-side
    figure draws one panel per series on one scale."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hf_posext.evaluation.shared.results import draw_heatmap
    from hf_posext.evaluation.retrieval import plots
    rows = [{"task": "single_needle", "method": m, "factor_spec": "2", "knobs": "", "length": n,
             "depth": d, "accuracy": k / 4, "correct": k, "trials": 4, "trained_length": 1000}
            for m in ("none", "yarn") for n, k in ((1000, 3), (2000, 1)) for d in (0.0, 1.0)]
    fig, ax = plt.subplots()
    draw_heatmap(ax, rows[:4])
    assert sorted(t.get_text() for t in ax.texts) == ["1/4", "1/4", "3/4", "3/4"]
    assert [t.get_text() for t in ax.get_xticklabels()][0].endswith("= L")
    ax.clear()
    draw_heatmap(ax, [{k: v for k, v in r.items() if k not in ("correct", "trials")} for r in rows[:4]])
    assert sorted(t.get_text() for t in ax.texts) == ["25%", "25%", "75%", "75%"]
    plt.close(fig)
    panels = []
    monkeypatch.setattr(plots, "draw_heatmap", lambda ax, part: panels.append(part) or draw_heatmap(ax, part))
    path = plots.plot_heatmaps(rows, tmp_path / "h.png", "t")
    assert path.read_bytes()[:4] == b"\x89PNG" and [p[0]["method"] for p in panels] == ["none", "yarn"]


def test_resume_with_dtype_auto_keeps_the_runs_dtype_without_probing(model_dir, capsys, tmp_path, monkeypatch):
    """The probe's answer depends on the machine's load; a resumed run keeps the dtype it
    started with (the rows say it) instead of measuring again and refusing its own folder."""
    out = tmp_path / "r"
    argv = ["retrieval", "--model", str(model_dir), "--lengths", "700", "--methods", "none", "--depths", "1",
            "--trials", "1", "--out", str(out), "--no-progress", "--no-plot", "--dtype", "auto"]
    monkeypatch.setattr(auto_dtype, "bf16_matmul_cpu", lambda cpuinfo="": True)   # the probe's branch
    monkeypatch.setattr(auto_dtype, "probe_times", probe(1.0, 2.0))          # float32 faster
    assert cli.main(argv) == 0
    assert read_rows(out / "retrieval.json")[0]["dtype"] == "float32"
    capsys.readouterr()
    monkeypatch.setattr(auto_dtype, "probe_times", no_probe)                 # not measured again
    assert cli.main(argv + ["--resume", "--depths", "0,1"]) == 0
    err = capsys.readouterr().err
    assert "--dtype auto: float32 (the run being resumed" in err, err
    rows = read_rows(out / "retrieval.json")
    assert len(rows) == 2 and {r["dtype"] for r in rows} == {"float32"}
    monkeypatch.setattr(auto_dtype, "probe_times", probe(2.0, 1.0))          # a new run: measured
    assert cli.main(argv + ["--out", str(tmp_path / "fresh")]) == 0
    assert read_rows(tmp_path / "fresh" / "retrieval.json")[0]["dtype"] == "bfloat16"


@pytest.mark.slow
def test_niah_single_is_lm_eval_rulers_niah_single_1():
    """The niah_single task against lm-evaluation-harness's own generator of RULER's
    niah_single_1 (prepare_niah.generate_input_output, the noise haystack): the same head, needle
    sentence and question, so the suite and `lm_eval --tasks niah_single_1` ask the same thing."""
    pytest.importorskip("wonderwords")
    pytest.importorskip("nltk")
    from lm_eval.tasks.ruler import niah_utils, prepare_niah

    from hf_posext.evaluation.retrieval.tasks import NOISE, get_task
    text, answers, query = prepare_niah.generate_input_output(
        3, NOISE.strip(), type_haystack="repeat", num_needle_k=1, type_needle_k="words", num_needle_v=1,
        type_needle_v="numbers", template=niah_utils.TEMPLATE)
    ours = get_task("niah_single").trial(7)
    assert text.startswith(ours.head.strip() + "\n")                     # the singular head
    needle = ours.needles[0].strip().replace(ours.answers[0], answers[0])
    key = re.search(r"numbers for (.+) is:", needle).group(1)
    assert needle.replace(key, query) in text.splitlines()               # the needle sentence
    theirs = text.splitlines()[-1] + " " + (f"The special magic number for {query} mentioned in the "
                                            "provided text is")   # prepare_niah's gen_prefix
    assert ours.question.replace(key, query) == theirs
    assert re.fullmatch(r"\d{7}", ours.answers[0]) and len(ours.needles) == 1
