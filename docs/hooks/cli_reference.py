"""MkDocs hook: the command-line reference, generated from the ``shardio`` parser so that it cannot drift.

A page holding the line ``<!-- cli-reference -->`` gets, in its place, every subcommand of
:func:`shardio.cli.main.build_parser` in ``--help`` order: its description, usage line and a table of its
arguments with their help (defaults filled in as ``--help`` shows them), then the exit codes.
"""

from __future__ import annotations

import argparse
from typing import Any

from shardio.cli.main import EXIT_CODES, build_parser

MARKER = "<!-- cli-reference -->"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = ["| argument | meaning |", "|---|---|"]
    for action in parser._actions:
        skipped = isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
        if skipped or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = formatter._format_args(action, action.dest.upper()) if action.nargs != 0 else ""
            name = ", ".join(f"`{flag}{' ' + metavar if metavar else ''}`" for flag in action.option_strings)
        else:
            name = f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
        meaning = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {_cell(name)} | {_cell(meaning)} |")
    return rows


def reference() -> str:
    """The Markdown of the whole command-line reference."""
    parser = build_parser()
    lines = [
        f"```text\n{parser.format_usage().strip()}\n```",
        "",
        _cell(parser.description or ""),
        "",
        *_arguments(parser),
        "",
    ]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in subparsers._choices_actions}
    for name, sub in subparsers.choices.items():
        lines += [
            f"## shardio {name}",
            "",
            _cell(sub.description or helps.get(name) or ""),
            "",
            f"```text\n{sub.format_usage().strip()}\n```",
            "",
            *_arguments(sub),
            "",
        ]
        if sub.epilog:
            lines += [_cell(sub.epilog), ""]
    lines += ["## Exit codes", "", "| code | meaning |", "|---:|---|"]
    lines += [f"| {code} | {_cell(meaning)} |" for code, meaning in EXIT_CODES.items()]
    return "\n".join(lines) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Put the generated reference where the page holds :data:`MARKER`."""
    return markdown.replace(MARKER, reference()) if MARKER in markdown else markdown
