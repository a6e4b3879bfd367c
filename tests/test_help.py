"""Help for people: every `--help` at most 80 lines, each option's default shown, the top level
saying what the tool does and the usual order of commands; `lm-eval --help` leads with hf_posext's
own model_args."""

from __future__ import annotations

import argparse

import pytest

from hf_posext import cli

PARSER = cli.build_parser()
SUBCOMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_the_top_level_says_what_and_in_which_order():
    text = PARSER.format_help()
    assert len(text.splitlines()) <= 80
    order = [text.index(f"hf-posext {c}") for c in ("methods", "extend", "check", "serve", "compare")]
    assert order == sorted(order)


@pytest.mark.parametrize("name", sorted(n for n in SUBCOMMANDS if n != "lm-eval"))
def test_every_help_is_short_and_shows_defaults(name):
    sub = SUBCOMMANDS[name]
    assert len(sub.format_help().splitlines()) <= 80, name
    formatter = sub._get_formatter()
    for action in sub._actions:
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) \
                and not isinstance(action, argparse._HelpAction):
            shown = formatter._expand_help(action) if action.help else ""
            assert "default" in shown, f"{name} {action.option_strings[0]}: no default shown"


def test_lm_eval_help_leads_with_our_model_args(capsys):
    assert cli.main(["lm-eval", "--help"]) == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) <= 80 and "method=M" in text and "factor=S" in text
