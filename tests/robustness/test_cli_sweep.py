"""Every option of every `python -m engine` subcommand, with bad values: the wrong type, out of range, empty,
blank, NaN and infinities, a missing file, a folder where a file belongs and the reverse.

The options and what counts as bad for each come from the argparse parser itself (engine/cli.py `_parser`): its
type (int, float, a path), its choices, store_true flags, plain strings. Each bad value is given alone on an
otherwise valid command line (run in process, engine.cli.main), and must end in exit status 2 with exactly one
`error:` line that names the option (its flag, or the field it sets: "the text is empty"), and no traceback.
Where a value is valid for an option (an empty --instruct is no instruction), it must simply work (exit 0).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

import pytest

from engine import cli

OUTCOMES: dict[str, list[str]] = {}  # option -> outcome of every value tried
# Options whose empty value means something: no instruction, no transcript (x-vector cloning).
EMPTY_IS_VALID = {"--instruct": "no instruction", "--ref-text": "no transcript: x-vector cloning"}
# Options that take any text (a bad value of these is only an empty or blank one; any key is a valid key).
FREE_TEXT = {"--text", "--instruct", "--ref-text", "--api-key"}
CLONE_ONLY = {"--ref-audio", "--ref-text", "--xvec-only", "--voice"}  # meaningful in clone mode only


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli._parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: p for a in subs for name, p in a.choices.items()}


def _options(sub: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in sub._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _bad_values(action: argparse.Action, where: dict) -> list[tuple[str, list[str], bool]]:
    """(label, the argv for the option, whether the value is valid) for every bad value of this option's kind."""
    flag = action.option_strings[-1]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return [("explicit value", [f"{flag}=yes"], False), ("empty value", [f"{flag}="], False)]
    if action.choices:
        return [(label, [flag, v], False) for label, v in (("empty", ""), ("unknown", "bogus"), ("nan", "nan"),
                                                           ("other case", str(action.choices[0]).upper()))]
    if action.type is int:
        values = {"empty": "", "word": "abc", "fraction": "1.5", "nan": "nan", "inf": "inf", "negative": "-1",
                  "huge": "9" * 30, "blank": " "}
    elif action.type is float:
        values = {"empty": "", "word": "abc", "nan": "nan", "inf": "inf", "-inf": "-inf", "negative": "-1",
                  "overflow": "1e999", "huge": "1e300", "blank": " "}
    elif action.type is cli.path_option:
        values = {"empty": "", "missing": str(where["tmp"] / "missing" / "x"), "blank": " "}
        wants_dir = "director" in (action.help or "") or "folder" in (action.help or "")
        values["a file, not a folder" if wants_dir else "a folder, not a file"] = str(
            where["file"] if wants_dir else where["tmp"])
    else:
        values = {"empty": "", "blank": "  "}
        if flag not in FREE_TEXT:
            values.update(nan="nan", unknown="bogus-value")
    return [(label, [flag, v], flag in EMPTY_IS_VALID and not v.strip()) for label, v in values.items()]


def _cases() -> list:
    cases = []
    for name, sub in _subcommands().items():
        for action in _options(sub):
            for label, argv, valid in _bad_values(action, {"tmp": Path("/TMP"), "file": Path("/FILE")}):
                cases.append(pytest.param(name, action.option_strings[-1], label, id=f"{name} {action.option_strings[-1]} {label}"))
    return cases


@pytest.fixture(scope="module")
def where(tiny_checkpoints, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli_sweep")
    (tmp / "file.txt").write_text("not a checkpoint")
    return {"tmp": tmp, "file": tmp / "file.txt", "ckpts": tiny_checkpoints}


def _base(sub: str, flag: str, where: dict) -> list[str]:
    """A valid command line of `sub` that the option under test is added to (or replaces)."""
    if sub == "serve":  # the server binds its port, then stops at once (see the `no_serving` fixture)
        return ["serve", "--model", str(where["ckpts"]["custom_voice"]), "--device", "cpu", "--dtype", "fp32",
                "--port", "0", "--max-takes", "1"]
    assert sub == "synth", f"new subcommand {sub}: give it a valid base command line here"
    clone = flag in CLONE_ONLY
    model = where["ckpts"]["base" if clone else "custom_voice"]
    return ["synth", "--model", str(model), "--mode", "clone" if clone else "custom", "--device", "cpu",
            "--dtype", "fp32", "--max-new-tokens", "2", "--out", str(where["tmp"] / "sweep.wav")]


def _without(argv: list[str], flag: str) -> list[str]:
    """argv with `flag` and its value removed (the value under test replaces it)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        else:
            out.append(a)
    return out


def _run(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = cli.main(argv)
        except SystemExit as exc:  # argparse refusing the value: usage and one error line, exit 2
            rc = exc.code
    return rc, err.getvalue()


def _names(message: str, action: argparse.Action) -> bool:
    """Whether an error message names the option: its flag, or the field it sets (with _ or a blank)."""
    words = {*action.option_strings, action.dest, action.dest.replace("_", " ")}
    return any(re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", message) for w in words)


@pytest.fixture
def no_serving(monkeypatch):
    """`serve` with valid options loads, binds its port and stops instead of waiting for Ctrl-C."""
    from engine.serve import main as serve_main

    async def stop_now():
        return None

    monkeypatch.setattr(serve_main, "_until_stopped", stop_now)


@pytest.mark.parametrize("sub, flag, label", _cases())
def test_bad_option_value(where, no_serving, sub, flag, label):
    action = next(a for a in _options(_subcommands()[sub]) if a.option_strings[-1] == flag)
    label_argv = {lab: (argv, valid) for lab, argv, valid in _bad_values(action, where)}
    argv, valid = label_argv[label]
    rc, err = _run(_without(_base(sub, flag, where), flag) + argv)
    assert "Traceback" not in err, err
    if valid:
        assert rc == 0, f"{flag} {argv[1:]!r} ({EMPTY_IS_VALID[flag]}) should work: {err}"
        OUTCOMES.setdefault(flag, []).append("ok")
        return
    assert rc == 2, f"{flag} {argv[1:]!r}: exit {rc}, expected 2: {err}"
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, f"{flag} {argv[1:]!r}: expected one error line: {err}"
    assert _names(lines[0], action), f"{flag} {argv[1:]!r}: the error does not name the option: {lines[0]}"
    OUTCOMES.setdefault(flag, []).append("argparse" if "argument " in lines[0] else "checked")


def test_every_option_was_swept(figure):
    options = {a.option_strings[-1] for sub in _subcommands().values() for a in _options(sub)}
    assert options == set(OUTCOMES), f"not swept: {sorted(options - set(OUTCOMES))}"
    runs = [o for v in OUTCOMES.values() for o in v]
    figure(subcommands=len(_subcommands()), options=len(options), bad_values=len(runs),
           refused_by_argparse=runs.count("argparse"), refused_by_checks=runs.count("checked"),
           valid_empty=runs.count("ok"))
