"""The command line's conventions, checked by running `taskcard` as a user at a shell would."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import IO

import pytest

from taskcard.bridge.cli import build_parser, main
from taskcard.bridge.config import parse_config
from taskcard.bridge.run.serve_cli import nothing_served
from taskcard.producers.task_card.mcp_server import TOOLS
from tests.e2e.harness import ROOT, ServeProcess, eventually


def taskcard(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("TASKCARD_") or k.endswith("_DIR")
    }
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        input=stdin,
    )


def refused_by_every_command(
    config: Path, key: str, *, serve: bool = True
) -> list[tuple[str, subprocess.CompletedProcess[str]]]:
    """The one stderr line naming `key` that `config check`, `serve --check` and `serve` each
    print when they refuse `config` (exit 2, no traceback), with each command's result.
    Without `serve`, only the pre-flight two (`serve` starts: `warned_by_serve`)."""
    lines = []
    commands = [("config", "check", str(config)), ("serve", "--config", str(config), "--check")]
    if serve:
        commands.append(("serve", "--config", str(config)))
    for args in commands:
        result = taskcard(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        named = [line for line in result.stderr.splitlines() if f" {key}: " in line]
        assert len(named) == 1, result.stderr
        lines.append((named[0], result))
    return lines


def warned_by_serve(config: Path, key: str, timeout_s: float = 60.0) -> str:
    """The WARNING line naming `key` that `serve` logs when it starts on `config` all the
    same (an agent's workdir that cannot be one is that agent's problem alone), stopped
    cleanly afterwards, no traceback."""
    with ServeProcess(config) as serve:
        deadline = time.monotonic() + timeout_s
        while True:
            named = [
                line
                for line in serve.logs.splitlines()
                if "WARNING" in line and f" {key}: " in line
            ]
            if named or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(named) == 1, serve.logs
        assert serve.terminate() == 0, serve.logs
    assert "Traceback" not in serve.logs, serve.logs
    return named[0]


def console_config(tmp_path: Path, agents: str = "", extra: str = "") -> Path:
    config = tmp_path / "taskcard.toml"
    config.write_text('state_dir = ".taskcard"\n' + extra + agents)
    return config


AGENT = '[[agents]]\nid = "builder"\nworkdir = "agents/builder"\n'


def test_no_arguments_prints_help_and_exits_2() -> None:
    result = taskcard()
    assert result.returncode == 2
    assert "usage: taskcard" in result.stdout
    assert "serve" in result.stdout and "card" in result.stdout


def test_a_command_group_without_its_subcommand_prints_its_help_and_exits_2() -> None:
    """README promises it for every group; `ledger` and `init` printed argparse's one-line
    "the following arguments are required" instead of their commands."""
    for group in ("card", "config", "ledger", "init"):
        result = taskcard(group)
        assert result.returncode == 2, group
        assert f"usage: taskcard {group}" in result.stdout
        assert "positional arguments:" in result.stdout and result.stderr == "", group
    # An agent host runs `hook`: its usage errors never fail the agent (exit 0, stderr).
    result = taskcard("hook")
    assert result.returncode == 0 and "taskcard hook: " in result.stderr
    assert "see `taskcard hook --help`" in result.stderr


def test_a_usage_error_is_one_line_naming_the_argument_and_the_help() -> None:
    """argparse printed its usage block before the line that matters (`taskcard report
    --verdict aproved` gave four lines), where the docs promise one line naming the field."""
    for args, words in (
        (("report", "--ok", "--verdict", "aproved"), "argument --verdict: invalid choice"),
        (("reports", "--after", "x"), "argument --after: 'x'"),
        (("spawn", "--reason", "r"), "required: --workdir, --parent"),
        (("card", "start", "--interval-s", "soon", "r.py"), "argument --interval-s"),
    ):
        result = taskcard(*args)
        assert result.returncode == 2, args
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and words in lines[0], (args, result.stderr)
        assert lines[0].startswith(f"taskcard {args[0]}"), lines[0]
        assert lines[0].endswith("--help`"), lines[0]
    # An unknown option is said by the command it was given to, not by `taskcard`.
    result = taskcard("card", "start", "r.py", "--every")
    assert result.returncode == 2
    assert result.stderr == (
        "taskcard card start: unrecognized arguments: --every; see `taskcard card start --help`\n"
    )


def _group_subcommands() -> list[tuple[str, ...]]:
    """Every subcommand of every command group (`card start`, `ledger show`, `init codex`,
    ...), found by walking the parser, each with dummy values for what it requires."""
    found = []
    for top in build_parser()._actions:
        if not isinstance(top, argparse._SubParsersAction):
            continue
        for group_name, group in top.choices.items():
            for inner in group._actions:
                if not isinstance(inner, argparse._SubParsersAction):
                    continue
                for name, sub in inner.choices.items():
                    words = [group_name, name]
                    for action in sub._actions:
                        value = str(next(iter(action.choices)) if action.choices else "x")
                        if not action.option_strings and action.nargs not in ("?", "*"):
                            words.append(value)
                        elif action.required and action.option_strings:
                            words += [action.option_strings[0], value]
                    found.append(tuple(words))
    return found


GROUP_SUBCOMMANDS = _group_subcommands()


@pytest.mark.parametrize("words", GROUP_SUBCOMMANDS, ids=" ".join)
def test_an_unknown_option_of_any_group_subcommand_is_said_by_that_subcommand(
    words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """`taskcard ledger show --bogus` was refused as `taskcard ledger: ...; see `taskcard
    ledger --help``, the group's usage, where every other subcommand names itself."""
    command = f"taskcard {words[0]} {words[1]}"
    with pytest.raises(SystemExit) if words[0] != "hook" else contextlib.nullcontext():
        main([*words, "--no-such-option"])
    assert capsys.readouterr().err == (
        f"{command}: unrecognized arguments: --no-such-option; see `{command} --help`\n"
    )


def test_the_walk_finds_the_subcommands_of_every_group() -> None:
    groups = {words[0] for words in GROUP_SUBCOMMANDS}
    assert groups == {"card", "config", "ledger", "hook", "init"}
    assert ("ledger", "show") in GROUP_SUBCOMMANDS


@pytest.mark.parametrize(
    ("args", "argument", "way"),
    [
        (("serve", "--check"), "--check", "--config FILE"),
        (("config", "check"), "FILE", "FILE"),
        (("status",), "--config", "--config FILE"),
        (("status", "--json"), "--config", "--config FILE"),
        (("chats",), "--config", "--config FILE"),
        (("chats", "--json"), "--config", "--config FILE"),
    ],
)
@pytest.mark.parametrize("variable", [None, ""])
def test_a_missing_configuration_file_is_one_usage_line_naming_both_ways(
    args: tuple[str, ...], argument: str, way: str, variable: str | None
) -> None:
    """`serve --check` and `config check` without a file said "taskcard: ..." and stopped,
    where every other missing argument is one line by the command, ending with its help;
    `status` and `chats` named only the option, not TASKCARD_CONFIG. Every command that
    needs a configuration says the same line, naming both ways to give it."""
    result = taskcard(*args, env=None if variable is None else {"TASKCARD_CONFIG": variable})
    assert result.returncode == 2, args
    command = "taskcard " + " ".join(a for a in args if not a.startswith("-"))
    assert result.stderr == (
        f"{command}: {argument}: no configuration file given; pass {way} or set"
        f" TASKCARD_CONFIG; see `{command} --help`\n"
    )
    assert result.stdout == ""


def test_activity_without_a_kind_names_only_the_kind_as_missing(tmp_path: Path) -> None:
    """`taskcard activity` alone said "required: KIND, key=value", though the fields are
    optional (`taskcard activity turn.end` takes none)."""
    result = taskcard("activity", "--workdir", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr == (
        "taskcard activity: the following arguments are required: KIND;"
        " see `taskcard activity --help`\n"
    )
    assert taskcard("activity", "--workdir", str(tmp_path), "turn.end").returncode == 0
    [line] = (tmp_path / "logs" / "events.jsonl").read_text().splitlines()
    assert json.loads(line)["kind"] == "turn.end"


def test_the_demo_says_its_own_log_level_default() -> None:
    """`taskcard demo --help` said "default: the config's log_level" of a command that takes
    no configuration; the demo runs at WARNING."""
    from taskcard.bridge.run.demo import DEMO_LOG_LEVEL

    result = taskcard("demo", "--help")
    assert result.returncode == 0
    assert f"default: {DEMO_LOG_LEVEL})" in " ".join(result.stdout.split())
    assert "the config's log_level" not in " ".join(result.stdout.split())


def test_version_comes_from_the_package_metadata() -> None:
    result = taskcard("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"taskcard {version('taskcard')}"


def test_help_lists_the_exit_codes_and_environment() -> None:
    text = taskcard("--help").stdout
    for line in ("0    done", "1    runtime failure", "2    usage or configuration error"):
        assert line in text
    assert "3    already running" in text and "4    no task card host" in text
    assert "TASKCARD_CONFIG" in text and "TASKCARD_LOG_LEVEL" in text
    # Read by the task card commands and the hooks: a user meets them, the help names them.
    assert "TASKCARD_RUNTIME_DIR" in text and "TASKCARD_ORIGIN" in text
    assert "serve, demo and host take it as a stop and exit 0" in text


def test_help_lists_every_exit_code_the_readme_table_gives() -> None:
    """The README's table of exit codes gives 129 and 143 (`taskcard inbox` stopped by a
    signal), which `taskcard --help` left out although the README says it lists them."""
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| code | meaning |") :].split("\n\n")[0]
    codes = {
        code.strip() for row in table.splitlines()[2:] for code in row.split("|")[1].split(",")
    }
    assert {"0", "129", "141"} <= codes, codes
    text = taskcard("--help").stdout
    listed = text[text.index("exit codes:") : text.index("environment:")]
    for code in sorted(codes):
        assert re.search(rf"^  (\d+, )*{code}\b", listed, re.MULTILINE), (code, listed)


def test_the_mcp_command_names_every_tool_it_serves() -> None:
    """Its help said "serve the task_card tool" while it serves five."""
    text = " ".join(taskcard("--help").stdout.split())
    line = text[text.index(" mcp ") :].split(" ledger long task")[0]
    for tool in TOOLS:
        assert tool.name in line, (tool.name, line)


def _all_parsers(
    parser: argparse.ArgumentParser, path: str = "taskcard"
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _all_parsers(sub, f"{path} {name}")
    return found


def test_every_option_has_help_and_shows_its_default() -> None:
    parsers = _all_parsers(build_parser())
    assert len(parsers) > 15
    for path, parser in parsers:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
                continue
            assert action.help, f"{path}: {action.dest} has no help text"
            shown = parser._get_formatter()._get_help_string(action) or ""
            if action.nargs == 0:  # a flag: `--failed` showed "(default: True)"
                assert "(default: " not in shown, f"{path}: {action.dest} shows a default"
                continue
            meaningful = action.default not in (None, False, argparse.SUPPRESS)
            if action.option_strings and meaningful:
                assert "default" in shown, f"{path}: {action.dest} does not show its default"
    idle = taskcard("card", "start", "--help").stdout
    assert "(default: .)" in idle  # --workdir
    assert "(default: text)" in taskcard("serve", "--help").stdout  # --log-format


# (command, what its --help must say): a default or a limit a user needs and the help left
# out (an option whose default is None, looked up later, or a text cut at a length).
HELP_SAYS = [
    (("tool",), "the envelope as JSON, at most 256 KiB, or - for stdin (default: stdin)"),
    (("tool",), "before exiting (default: 120)"),  # it said "(default 120)", unlike the rest
    (("mcp",), "before exiting (default: 120)"),
    (("card", "start"), "(default: the workdir's settings, which say 5 unless its"),
    (("card", "start"), "(default: the settings, 10 unless taskcard.json sets timeout_s)"),
    (("card", "start"), "(default: the settings, 2000 unless taskcard.json sets max_refreshes)"),
    (("reports",), "last seq read (default: print the latest report)"),
    (("report",), "one short paragraph, at most 2000 characters"),
    (("spawn",), "why the child is created, at most 1000 characters"),
    (("ledger", "init"), "what the task is for, one line, at most 500 characters"),
    (("ledger", "checkpoint"), "(TASK_COMPLETED: the evidence), at most 500 characters"),
    (("ledger", "block"), "what stops the task, in one sentence, at most 500 characters"),
    (("ledger", "owner-reply"), "what the owner observed, at most 500 characters"),
    (("ledger", "heartbeat"), "what the executor is doing, at most 500 characters"),
]


def test_help_shows_the_defaults_and_limits_a_user_needs() -> None:
    for command, says in HELP_SAYS:
        result = taskcard(*command, "--help", env={"COLUMNS": "300"})
        assert result.returncode == 0, result.stderr
        text = " ".join(result.stdout.split())
        assert says in text, (command, says, text)
    for path, parser in _all_parsers(build_parser()):
        text = " ".join(parser.format_help().split())
        assert "(default " not in text, f"{path}: a default not written '(default: X)'"


def test_completion_scripts_for_bash_and_zsh() -> None:
    bash = taskcard("completion", "bash")
    assert bash.returncode == 0
    assert "complete" in bash.stdout and "serve" in bash.stdout and "--workdir" in bash.stdout
    checked = subprocess.run(["bash", "-n"], input=bash.stdout, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    zsh = taskcard("completion", "zsh")
    assert zsh.returncode == 0
    assert zsh.stdout.startswith("#compdef taskcard")


def test_config_check_reports_valid_invalid_and_empty(tmp_path: Path) -> None:
    good = console_config(tmp_path, AGENT)
    result = taskcard("config", "check", str(good))
    assert result.returncode == 0, result.stderr
    assert "valid; 1 agent, 1 route (console)" in result.stdout
    assert "warning" not in result.stderr

    bad = tmp_path / "bad.toml"
    bad.write_text("[[agents]]\nid = 5\n")
    result = taskcard("config", "check", str(bad))
    assert result.returncode == 2
    assert "agents[0].id" in result.stderr and "agents[0].workdir" in result.stderr

    empty = tmp_path / "empty.toml"
    empty.write_text("")
    result = taskcard("config", "check", str(empty))
    assert result.returncode == 0
    assert "nothing is served" in result.stderr


def test_config_check_takes_the_file_from_taskcard_config(tmp_path: Path) -> None:
    config = console_config(tmp_path, AGENT)
    result = taskcard("config", "check", env={"TASKCARD_CONFIG": str(config)})
    assert result.returncode == 0, result.stderr
    assert str(config) in result.stdout
    assert taskcard("config", "check").returncode == 2


@pytest.mark.parametrize("command", ["status", "chats"])
def test_the_state_readers_take_the_file_from_taskcard_config(tmp_path: Path, command: str) -> None:
    """`taskcard --help` gives TASKCARD_CONFIG as the default of --config: the commands an
    operator runs beside the service honour it too."""
    config = console_config(tmp_path, AGENT)
    result = taskcard(command, env={"TASKCARD_CONFIG": str(config)})
    assert result.returncode == 0, result.stderr
    result = taskcard(command)
    assert result.returncode == 2 and "--config" in result.stderr


def test_chats_with_nothing_seen_says_when_no_command_can_arrive(tmp_path: Path) -> None:
    """A console-only configuration (the README's first one) was told to send /taskcard "in
    the chat", which it has none of; so was one whose channels take no commands."""
    console = console_config(tmp_path, AGENT)
    result = taskcard("chats", "--config", str(console))
    assert result.returncode == 0, result.stderr
    assert "none can arrive: this configuration has no chat channel" in result.stdout
    assert "[telegram] or [feishu]" in result.stdout
    telegram = '[telegram]\ntoken_env = "TC_TEST_TOKEN"\n'
    (tmp_path / "off").mkdir()
    off = console_config(tmp_path / "off", AGENT, telegram + "commands = false\n")
    result = taskcard("chats", "--config", str(off))
    assert result.returncode == 0, result.stderr
    assert "receives no commands (telegram.commands = false)" in result.stdout
    (tmp_path / "on").mkdir()
    on = console_config(tmp_path / "on", AGENT, telegram)
    result = taskcard("chats", "--config", str(on))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("No command seen yet. With `taskcard serve` running")


@pytest.mark.parametrize("command", [("status",), ("chats",), ("config", "check")])
def test_a_config_path_that_cannot_be_shown_or_opened_is_said_on_short_lines(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """A --config path holding a line break or an escape was printed raw (the error split in
    two, the escape acting on the terminal), one longer than any path the system opens came
    back whole twice (10 KB), and every path the system refused was told to "check its
    permissions", whatever was wrong with it."""
    option = () if command == ("config", "check") else ("--config",)
    cases = {
        "x\ny\x1b[31m.toml": "x\\ny\\x1b[31m.toml: no such file",
        "a" * 5000: "... (5000 characters): cannot be read (File name too long); the path (or"
        " one of its folder names) is longer than the file system allows; use a shorter path",
        str(tmp_path / "file" / "x.toml"): "a part of the path before the file is not a folder;"
        " fix the path",
    }
    (tmp_path / "file").write_text("")
    for path, says in cases.items():
        result = taskcard(*command, *option, path)
        assert result.returncode == 2, (path[:20], result.stderr[:300])
        lines = result.stderr.splitlines()
        assert len(lines) == 2 and len(result.stderr) < 800, result.stderr[:800]
        assert "\x1b" not in result.stderr and says in lines[1], (says, lines)


async def test_an_empty_config_warns_in_json_logs_from_the_environment(tmp_path: Path) -> None:
    config = console_config(tmp_path)
    with ServeProcess(config, env={"TASKCARD_LOG_FORMAT": "json"}) as serve:
        await eventually(
            lambda: "serving 0 agents on 0 routes" in serve.logs, what="the service start"
        )
        assert serve.terminate() == 0
    records = [json.loads(line) for line in serve.logs.splitlines()]
    warning = next(r for r in records if "nothing is served" in r["message"])
    assert warning["level"] == "WARNING"
    assert warning["logger"] == "taskcard.bridge.run.serve_cli"
    assert {"ts", "level", "logger", "message"} <= set(records[-1])


@pytest.mark.parametrize(
    ("variable", "value", "command"),
    [
        ("TASKCARD_LOG_LEVEL", "verbose", "serve"),
        ("TASKCARD_LOG_FORMAT", "jsonl", "serve"),
        ("TASKCARD_LOG_FORMAT", "xml", "demo"),
    ],
)
def test_a_log_variable_that_is_no_choice_is_a_usage_error(
    tmp_path: Path, variable: str, value: str, command: str
) -> None:
    """A log pipeline set up for JSON must not get text lines without a word because the
    variable is misspelt: the command stops naming the variable and the choices; the
    option on the command line still wins over it."""
    config = console_config(tmp_path, AGENT)
    args = ("serve", "--config", str(config)) if command == "serve" else ("demo",)
    result = taskcard(
        *args, "--check" if command == "serve" else "--duration=1", env={variable: value}
    )
    assert result.returncode == 2
    assert variable in result.stderr and repr(value) in result.stderr
    option = "--log-level=INFO" if variable.endswith("LEVEL") else "--log-format=text"
    if command == "serve":
        result = taskcard(*args, "--check", option, env={variable: value})
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("how", ["config check", "serve --config", "TASKCARD_CONFIG"])
@pytest.mark.parametrize("what", ["missing", "folder"])
def test_an_unusable_config_path_is_named_without_an_option_it_did_not_use(
    tmp_path: Path, how: str, what: str
) -> None:
    """`taskcard config check FILE` (a positional) was told to "fix --config"."""
    path = tmp_path / "missing.toml" if what == "missing" else tmp_path
    if how == "config check":
        result = taskcard("config", "check", str(path))
    elif how == "serve --config":
        result = taskcard("serve", "--config", str(path), "--check")
    else:
        result = taskcard("status", env={"TASKCARD_CONFIG": str(path)})
    assert result.returncode == 2
    assert f"{path}: " in result.stderr and "--config" not in result.stderr, result.stderr


def test_log_level_on_the_command_line_wins_over_the_config(tmp_path: Path) -> None:
    config = console_config(tmp_path, AGENT, extra='log_level = "WARNING"\n')
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    env = {"TASKCARD_CONFIG": str(config), "TASKCARD_LOG_LEVEL": "info"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskcard.bridge.cli", "serve", "--log-level", "INFO"],
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = ""
        while "serving 1 agent on 1 route " not in line:
            line = proc.stderr.readline()
            assert line, f"the service exited with {proc.wait()}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if proc.stderr is not None:
            proc.stderr.close()
    # ISO 8601 with milliseconds and an offset, then the level and the module's logger name.
    stamp, level, name = line.split(" ")[:3]
    assert len(stamp) == len("2026-11-30T14:02:03.123+00:00") and stamp[19] == "."
    assert stamp[23] in "+-" and stamp[26] == ":"
    assert (level, name) == ("INFO", "taskcard.bridge.run.service:")


# Every command that takes an agent's `--workdir`, with the arguments it needs besides.
WORKDIR_COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("card start", ("card.py",)),
    ("card inspect", ("tc_1",)),
    ("card retry", ("tc_1",)),
    ("card stop", ("tc_1",)),
    ("card remove", ()),
    ("card settings", ()),
    ("card manual", ()),
    ("tool", ('{"action":"settings","input":{},"reasoning":"x"}',)),
    ("host", ()),
    ("mcp", ()),
    ("activity", ("turn.start",)),
    ("ledger show", ()),
    ("ledger checkpoint", ("--summary", "x")),
    ("inbox", ()),
    ("reports", ()),
    ("report", ("--ok", "--summary", "x")),
    ("init claude-code", ()),
    ("init codex", ()),
)


@pytest.mark.parametrize("made", ["missing", "a file"])
def test_a_workdir_that_is_no_folder_is_one_usage_line_of_one_shape(
    tmp_path: Path, made: str
) -> None:
    """`card`, `tool` and `host` said "taskcard: the workdir ... does not exist", `mcp`
    "taskcard mcp: --workdir ...", the other agent-side commands argparse's form, and a hook
    "taskcard hook: HookInputError: ...". Each now names its command, the option and the fix
    alike; a hook still exits 0 (it never fails its agent) and says nothing was written."""
    workdir = tmp_path / "nowhere"
    if made == "a file":
        workdir.write_text("not a folder")
    runtime = ("--runtime-dir", str(tmp_path / "r"))
    for words, extra in WORKDIR_COMMANDS:
        command = f"taskcard {words}"
        options = runtime if words.split()[0] in ("card", "tool", "host", "mcp") else ()
        result = taskcard(*words.split(), *extra, "--workdir", str(workdir), *options, stdin="")
        assert (result.returncode, result.stdout) == (2, ""), (words, result)
        assert result.stderr == (
            f"{command}: argument --workdir: {workdir} is not a directory; pass the agent's"
            f" working directory; see `{command} --help`\n"
        )
    for host in ("claude-code", "codex"):
        result = taskcard("hook", host, "--workdir", str(workdir), stdin="{}")
        assert (result.returncode, result.stdout) == (0, "")
        assert result.stderr == (
            f"taskcard hook {host}: argument --workdir: {workdir} is not a directory; pass the"
            " agent's working directory; nothing written\n"
        )
    assert not (tmp_path / "r").exists()  # nothing tried to start a host


def test_card_manual_and_settings_answer_without_a_host(tmp_path: Path, runtime_dir: Path) -> None:
    runtime = runtime_dir / "run"  # never inside the workdir: that is refused
    common = ("--workdir", str(tmp_path), "--runtime-dir", str(runtime))
    manual = taskcard("card", "manual", *common)
    assert manual.returncode == 0
    assert "settings" in manual.stdout and "renderer" in manual.stdout
    settings = taskcard("card", "settings", *common)
    assert settings.returncode == 0, settings.stderr
    assert settings.stdout.startswith("settings: ok")
    assert "interval-s = 5.0 (default 5.0)" in settings.stdout
    as_json = json.loads(taskcard("card", "settings", "--json", *common).stdout)
    assert as_json["status"] == "ok" and len(as_json["settings"]) == 5
    assert not runtime.exists()  # no host was started, so no socket directory either


def test_card_commands_print_a_summary_or_json(tmp_path: Path, runtime_dir: Path) -> None:
    (tmp_path / "card.py").write_text('print("**building** step 1")\n')
    # A short idle grace: the host exits soon after the card is removed.
    common = ("--workdir", str(tmp_path), "--runtime-dir", str(runtime_dir))
    common += ("--idle-grace-s", "1")
    started = taskcard("card", "start", "card.py", "--interval-s", "30", *common)
    try:
        assert started.returncode == 0, started.stderr
        first = started.stdout.splitlines()[0]
        assert first.startswith("start: watching (watch tc_")
        assert "refreshes:" in started.stdout and not started.stdout.lstrip().startswith("{")
        watch_id = first.split("(watch ")[1].rstrip(")")
        inspected = json.loads(taskcard("card", "inspect", watch_id, "--json", *common).stdout)
        assert inspected["watch_id"] == watch_id and inspected["status"] == "watching"
        human = taskcard("card", "inspect", watch_id, *common)
        assert human.returncode == 0
        assert "card (lines: 1): **building** step 1" in human.stdout
    finally:
        removed = taskcard("card", "remove", *common)
        assert removed.returncode == 0, removed.stderr
        assert removed.stdout.startswith("remove: removed")


def test_the_card_summary_does_not_replay_a_renderers_escapes(
    tmp_path: Path, runtime_dir: Path
) -> None:
    """`taskcard card inspect` (no --json) quoted the card's first line and the renderer's
    error as they were: a renderer's escape sequence acted on the terminal of whoever looked
    at the card."""
    (tmp_path / "card.py").write_text('print("**building**\\x1b[2J\\u202e step 1")\n')
    common = ("--workdir", str(tmp_path), "--runtime-dir", str(runtime_dir))
    common += ("--idle-grace-s", "1")
    started = taskcard("card", "start", "card.py", "--interval-s", "30", *common)
    try:
        assert started.returncode == 0, started.stderr
        watch_id = started.stdout.splitlines()[0].split("(watch ")[1].rstrip(")")
        human = taskcard("card", "inspect", watch_id, *common)
        assert human.returncode == 0
        assert "card (lines: 1): **building** [2J step 1" in human.stdout
        assert "\x1b" not in human.stdout and "\u202e" not in human.stdout
    finally:
        removed = taskcard("card", "remove", *common)
        assert removed.returncode == 0, removed.stderr


def test_a_refused_card_command_is_summarised_under_its_own_name(
    tmp_path: Path, runtime_dir: Path
) -> None:
    common = ("--workdir", str(tmp_path), "--runtime-dir", str(runtime_dir))
    common += ("--idle-grace-s", "1")
    (tmp_path / "card.py").write_text('print("# card")\n')
    unusable = taskcard("card", "start", "card.py", "--interval-s", "nan", *common)
    assert unusable.returncode == 2  # a usage error, said by the option's own name
    assert "argument --interval-s: 'nan' is not a finite number" in unusable.stderr
    assert unusable.stdout == ""
    refused = taskcard("card", "start", "card.py", "--interval-s", "0.5", *common)
    assert refused.returncode == 2, refused.stderr  # the envelope's refusal: a usage error
    assert refused.stdout.startswith("start: failed\n  input.interval_s:")
    as_json = json.loads(
        taskcard("card", "start", "card.py", "--interval-s", "0.5", "--json", *common).stdout
    )
    assert (as_json["action"], as_json["status"]) == ("start", "failed")
    assert as_json["message"].startswith("input.interval_s: ")


@pytest.mark.parametrize("shell", ["fish"])
def test_an_unknown_shell_is_a_usage_error(shell: str) -> None:
    result = taskcard("completion", shell)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_an_unknown_route_timezone_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    config = console_config(tmp_path, AGENT, extra='[console]\ntimezone = "Mars/Olympus"\n')
    result = taskcard("config", "check", str(config))
    assert result.returncode == 2
    assert "console.timezone" in result.stderr and "IANA" in result.stderr


def test_an_empty_redis_key_prefix_is_refused_naming_the_key_and_what_to_write(
    tmp_path: Path,
) -> None:
    """`key_prefix = ""` was refused as "cluster: cluster.key_prefix must not be empty": the
    key named twice and no word of what to write instead."""
    cluster = '[cluster]\nredis_url = "redis://127.0.0.1:6379/0"\nkey_prefix = ""\n'
    config = console_config(tmp_path, AGENT, extra=cluster)
    for line, _ in refused_by_every_command(config, "cluster.key_prefix"):
        assert line.endswith(
            "cluster.key_prefix: is empty; write a name of 1-64 of the characters"
            " A-Z a-z 0-9 _ . -, one per fleet (or leave the key out for the default"
            ' "taskcard")'
        ), line
        assert "cluster: cluster." not in line, line
    assert not (tmp_path / ".taskcard").exists()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://bot:PASSWORD@127.0.0.1:8081", "carries credentials"),
        ("http://bot:PASSWORD@127.0.0.1:99999", "is not a URL"),
        ("https://api.example/root?token=PASSWORD", "has a query"),
        ("ftp://bot:PASSWORD@api.example/#PASSWORD", "is not an http(s) URL"),
        # A password holding '/' or '#': the parser's own error quoted a part of it.
        ("https://bot:PASS/WORD@api.example", "is not a URL"),
        ("https://bot:PASSWO#RD@api.example", "is not a URL"),
    ],
)
def test_a_refused_api_url_is_quoted_without_its_secret(
    tmp_path: Path, url: str, problem: str
) -> None:
    """The URL's user information or query may hold a password or token: the error names the
    key and the problem, quoting the URL with them masked, so no secret reaches a terminal
    or a journal (as a Redis URL's problem never quotes it)."""
    config = console_config(tmp_path, AGENT, extra=f'[telegram]\napi_base_url = "{url}"\n')
    for args in (("config", "check", str(config)), ("serve", "--config", str(config))):
        result = taskcard(*args, env={"TELEGRAM_BOT_TOKEN": "1:T"})
        assert result.returncode == 2, result.stderr
        assert "telegram.api_base_url" in result.stderr and problem in result.stderr
        shown = result.stderr + result.stdout
        assert not any(part in shown for part in ("PASS", "WORD", "PASSWO")), shown


@pytest.mark.parametrize(
    "url",
    ["https://api.telegram.org/bot", "https://api.telegram.org/bot/", "http://127.0.0.1:8081/BOT"],
)
def test_an_api_root_ending_in_bot_is_warned_of_saying_to_drop_it(tmp_path: Path, url: str) -> None:
    """python-telegram-bot's `base_url` ends in `/bot`; the same value here was taken without
    a word and the service asked `.../bot/bot<token>/getMe`: Telegram's 404 for that path read
    as "Telegram rejected the bot token", so the operator was sent to replace a good token.
    A warning, not a refusal: a proxy mounted under such a path is a valid root."""
    config = console_config(tmp_path, AGENT, extra=f'[telegram]\napi_base_url = "{url}"\n')
    for args in (("config", "check", str(config)), ("serve", "--config", str(config), "--check")):
        result = taskcard(*args, env={"TELEGRAM_BOT_TOKEN": "1:T"})
        assert result.returncode == 0, result.stderr
        assert "warning: telegram.api_base_url: " in result.stderr, result.stderr
        assert "without the /bot" in result.stderr, result.stderr
    fine = console_config(
        tmp_path, AGENT, extra='[telegram]\napi_base_url = "https://tg.example/botapi"\n'
    )
    check = taskcard("config", "check", str(fine))
    assert check.returncode == 0 and "api_base_url" not in check.stderr, check.stderr


BOT_TOKEN_IN_FILE = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1"


def test_a_bot_token_in_the_api_url_path_is_refused_without_quoting_it(tmp_path: Path) -> None:
    """A Bot API URL copied whole (`.../bot<token>/`) put the token in the file and passed the
    check; it is refused like credentials in the URL, naming the key, the token masked."""
    url = f"https://api.telegram.org/bot{BOT_TOKEN_IN_FILE}/"
    config = console_config(tmp_path, AGENT, extra=f'[telegram]\napi_base_url = "{url}"\n')
    for args in (("config", "check", str(config)), ("serve", "--config", str(config), "--check")):
        result = taskcard(*args)
        assert result.returncode == 2, result.stderr
        assert "telegram.api_base_url" in result.stderr, result.stderr
        assert "carries a bot token" in result.stderr, result.stderr
        assert BOT_TOKEN_IN_FILE.split(":")[1] not in result.stderr + result.stdout


def test_a_feishu_domain_with_a_path_is_refused_by_the_check_without_quoting_the_path(
    tmp_path: Path,
) -> None:
    """A Feishu custom bot's webhook URL pasted as `feishu.domain` passed `config check` and
    `serve --check`; `serve` then stopped with a traceback that quoted the URL, its secret
    hook id included. The check refuses it, naming the key and quoting only the origin."""
    hook = "0b7f3c2e-1111-4222-8333-944455556666"
    config = console_config(
        tmp_path,
        AGENT,
        extra=f'[feishu]\ndomain = "https://open.feishu.cn/open-apis/bot/v2/hook/{hook}"\n'
        'events = "none"\n',
    )
    env = {"FEISHU_APP_ID": "cli_app", "FEISHU_APP_SECRET": "app-secret-value"}
    for args in (
        ("config", "check", str(config)),
        ("serve", "--config", str(config), "--check"),
        ("serve", "--config", str(config)),
    ):
        result = taskcard(*args, env=env)
        assert result.returncode == 2, result.stderr
        assert "feishu.domain" in result.stderr and "only the origin" in result.stderr
        assert "Traceback" not in result.stderr and hook not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        (f'log_level = "{BOT_TOKEN_IN_FILE}"\n', "log_level"),
        (f'[telegram]\ncommands = "{BOT_TOKEN_IN_FILE}"\n', "telegram.commands"),
        (
            f'[telegram]\n[[telegram.routes]]\nchat_id = "{BOT_TOKEN_IN_FILE}"\nagents = ["*"]\n',
            "telegram.routes[0].chat_id",
        ),
        (f'[feishu]\nevents = "sk-proj-{BOT_TOKEN_IN_FILE[10:]}"\n', "feishu.events"),
    ],
    ids=["enum", "bool", "chat-id", "feishu-enum"],
)
def test_a_secret_pasted_under_the_wrong_key_is_not_quoted_back(
    tmp_path: Path, toml: str, key: str
) -> None:
    """A refused value was quoted as written (`got '123456789:AA...'`): a token pasted under
    the wrong key reached the terminal and the journal. The error still names the key."""
    config = console_config(tmp_path, AGENT, extra=toml)
    for args in (("config", "check", str(config)), ("serve", "--config", str(config), "--check")):
        result = taskcard(*args)
        assert result.returncode == 2, result.stderr
        # A choice is quoted redacted; a value of the wrong type is named by its type only,
        # a text where a chat id goes by what it is not.
        quoted = any(
            words in result.stderr
            for words in ("[redacted]", "(got a string)", "not a Telegram chat id")
        )
        assert key in result.stderr and quoted, result.stderr
        assert BOT_TOKEN_IN_FILE[10:] not in result.stderr + result.stdout


# A Feishu app secret: letters and digits, no shape the redaction can recognise.
APP_SECRET_IN_FILE = "Zk3pQ9xLmN2vB7tRwq8YhJ4sD6fGa1Ce"


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        (
            f'[[feishu]]\napp_secret = "{APP_SECRET_IN_FILE}"\n',
            "feishu: Input should be a table (got an array of tables); write it as one"
            " [feishu] table, not [[feishu]]",
        ),
        (
            f'feishu = "{APP_SECRET_IN_FILE}"\n',
            "feishu: Input should be a table (got a string); write it as a [feishu] table",
        ),
        (
            f'[feishu]\napp_secret_env = ["{APP_SECRET_IN_FILE}"]\n',
            "feishu.app_secret_env: Input should be a valid string (got an array); write it in"
            " double quotes",
        ),
        (
            f'[cluster]\nredis_url = ["redis://:{APP_SECRET_IN_FILE}@redis.internal/0"]\n',
            "cluster.redis_url: Input should be a valid string (got an array)",
        ),
        (
            f'[telegram]\norigin_chats = ["{APP_SECRET_IN_FILE}"]\n',
            "telegram.origin_chats[0]: not a Telegram chat id; write the chat's numeric id",
        ),
        (
            f'log_level = {{ level = "{APP_SECRET_IN_FILE}" }}\n',
            "log_level: Input should be 'DEBUG', 'INFO', 'WARNING' or 'ERROR' (got a table)",
        ),
        (
            f'[console]\nenabled = {{ key = "{APP_SECRET_IN_FILE}" }}\n',
            'console.enabled: got a table; use "auto", true or false',
        ),
    ],
    ids=[
        "array-of-tables",
        "string-for-table",
        "env-list",
        "redis-list",
        "origin",
        "enum",
        "console-enabled",
    ],
)
def test_a_secret_with_no_shape_in_a_value_of_the_wrong_type_is_not_quoted_back(
    tmp_path: Path, toml: str, words: str
) -> None:
    """A value of the wrong type was quoted whole (`got [{'app_secret': '...'}]`), and the
    name of a `*_env` key was quoted by the start's "variable ... is not set": a Feishu app
    secret, which no pattern recognises, reached the terminal and the journal. The line names
    the key, what it takes and what the file gives, in TOML's terms, without the value."""
    config = console_config(tmp_path, AGENT, extra=toml)
    env = {"FEISHU_APP_ID": "cli_a1b2c3d4e5f6a7b8"}
    for args in (
        ("config", "check", str(config)),
        ("serve", "--config", str(config), "--check"),
        ("serve", "--config", str(config)),
    ):
        result = taskcard(*args, env=env)
        assert result.returncode == 2, result.stderr
        assert words in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        assert APP_SECRET_IN_FILE not in result.stderr + result.stdout


def test_a_secret_pasted_as_a_variable_name_is_never_quoted_back(tmp_path: Path) -> None:
    """A Feishu app secret pasted into `app_secret_env` is a valid variable name, which the
    start quoted in "the environment variable ... is not set". The file still loads (a
    mixed-case name of that shape may be a real variable), and no line repeats it."""
    config = console_config(
        tmp_path, AGENT, extra=f'[feishu]\napp_secret_env = "{APP_SECRET_IN_FILE}"\n'
    )
    env = {"FEISHU_APP_ID": "cli_a1b2c3d4e5f6a7b8"}
    check = taskcard("config", "check", str(config), env=env)
    assert check.returncode == 0, check.stderr
    start = taskcard("serve", "--config", str(config), env=env)
    assert start.returncode == 2, start.stderr
    assert "feishu.app_secret_env: the environment variable named there (not shown" in (
        start.stderr
    ), start.stderr
    for result in (check, start):
        assert "Traceback" not in result.stderr
        assert APP_SECRET_IN_FILE not in result.stderr + result.stdout


def test_a_mixed_case_variable_name_of_a_secrets_shape_still_loads(tmp_path: Path) -> None:
    """A name someone chose (`myProjectTelegramBotToken2`) loads and is read as given."""
    config = console_config(
        tmp_path, AGENT, extra='[telegram]\ntoken_env = "myProjectTelegramBotToken2"\n'
    )
    check = taskcard("config", "check", str(config))
    assert check.returncode == 0, check.stderr


async def test_a_reload_refused_for_a_value_of_the_wrong_type_does_not_log_it(
    tmp_path: Path,
) -> None:
    """The reload's refusal is logged with the same lines: they must not carry the secret."""
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    config = console_config(tmp_path, AGENT, extra="[console]\nenabled = true\n")
    with ServeProcess(config, env={"TASKCARD_LOG_LEVEL": "INFO"}) as serve:
        await eventually(lambda: "channel console ready" in serve.logs, what="the start")
        config.write_text(config.read_text() + f'[[feishu]]\napp_secret = "{APP_SECRET_IN_FILE}"\n')
        assert serve.proc is not None
        serve.proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "config reload refused" in serve.logs, what="the refusal")
        await eventually(lambda: "not [[feishu]]" in serve.logs, what="the refusal's line")
        assert await serve.aterminate() == 0
    assert APP_SECRET_IN_FILE not in serve.logs + serve.output


@pytest.mark.parametrize(
    ("toml", "key", "words"),
    [
        ('state_dir = "state\\u0000"\n', "state_dir", "U+0000"),
        ('[[agents]]\nid = "a"\nworkdir = "agents/a\\u0000"\n', "agents[0].workdir", "U+0000"),
        ('[discover]\nroots = ["fleet", "r\\u0000"]\n', "discover.roots[1]", "U+0000"),
        ('[metrics]\nlisten = "127.0.0.1\\u0000:9464"\n', "metrics.listen", "U+0000"),
        (
            '[telegram]\napi_base_url = "https://h.example\\u001b"\n',
            "telegram.api_base_url",
            "U+001B",
        ),
        (
            '[feishu]\n[[feishu.routes]]\nchat_id = "oc_a\\u0000"\nagents = ["*"]\n',
            "feishu.routes[0].chat_id",
            "U+0000",
        ),
        ('state_dir = "~no-such-user-here/state"\n', "state_dir", "home folder"),
        ('[[agents]]\nid = "a"\nworkdir = "~no-such-user-here/a"\n', "agents[0].workdir", "~"),
    ],
    ids=[
        "state-nul",
        "workdir-nul",
        "root-nul",
        "listen-nul",
        "url-escape",
        "chat-nul",
        "state-tilde",
        "workdir-tilde",
    ],
)
def test_a_path_no_system_call_takes_is_a_config_error_naming_the_key(
    tmp_path: Path, toml: str, key: str, words: str
) -> None:
    """A NUL in a path (TOML's \\u0000) or a `~user` of no known user ended `config check`
    (a `~user`) or `serve --check` (a NUL in state_dir) with a traceback, or passed it; a
    control character in a listen address, URL or chat id passed the check (a NUL in
    `metrics.listen` then stopped `serve` with a traceback)."""
    config = tmp_path / "taskcard.toml"
    config.write_text(toml)
    for args in (("config", "check", str(config)), ("serve", "--config", str(config), "--check")):
        result = taskcard(*args)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        assert f"{key}: " in result.stderr and words in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("toml", "words"),
    [
        ('state_dir = ""\n', "state_dir: is empty; give a path"),
        ('[[agents]]\nid = "a"\nworkdir = ""\n', "agents[0].workdir: is empty; give a path"),
        ('[discover]\nroots = ["fleet", ""]\n', "discover.roots: entry 1 is empty"),
        ('state_dir = "  "\n', "state_dir: holds only spaces, which would be taken as a folder"),
        (
            '[[agents]]\nid = "a"\nworkdir = " "\n',
            "agents[0].workdir: holds only spaces, which would be taken as a folder",
        ),
        (
            '[discover]\nroots = ["fleet", "\u00a0 "]\n',
            "discover.roots: entry 1 holds only spaces, which would be taken as a folder",
        ),
    ],
    ids=["state-dir", "workdir", "root", "state-dir-spaces", "workdir-space", "root-blanks"],
)
def test_an_empty_path_is_refused_naming_the_key(tmp_path: Path, toml: str, words: str) -> None:
    """An empty path was taken as the config file's folder (`Path("")` is `.`): the state
    kept beside the config, an agent watching that folder, every folder there discovered as
    an agent. A path of spaces only was taken as a folder named by them. Both are refused
    before anything starts, naming the key and how to write the path."""
    config = tmp_path / "taskcard.toml"
    config.write_text(toml)
    for args in (("config", "check", str(config)), ("serve", "--config", str(config))):
        result = taskcard(*args)
        assert result.returncode == 2, result.stderr
        assert words.format(tmp=tmp_path) in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        assert "give a path" in result.stderr, result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["taskcard.toml"]


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("", ["no [[agents]] are configured: nothing is served"]),
        (
            AGENT + "[console]\nenabled = false\n",
            ["no routes are configured: no card reaches any chat"],
        ),
        (
            AGENT
            + '[[agents]]\nid = "idle"\nworkdir = "agents/idle"\n'
            + '[telegram]\n[[telegram.routes]]\nchat_id = 5\nagents = ["builder"]\n',
            ["agent 'idle' is in no route: its card is shown nowhere"],
        ),
        (
            AGENT + '[[agents]]\nid = "twin"\nworkdir = "./agents/builder/"\n',
            [
                "agents[1].workdir: the same folder as agents[0] ('builder'), so 'twin' shows"
                " that agent's card again; give each agent its own workdir"
            ],
        ),
        (AGENT, []),
        # Cards reach the chats a turn comes from: no route is needed for that.
        (AGENT + "[telegram]\norigin_chats = [-1001]\n", []),
        (AGENT + '[feishu]\norigin_chats = ["oc_team"]\n', []),
        (
            AGENT
            + '[[agents]]\nid = "idle"\nworkdir = "agents/idle"\n'
            + "[telegram]\norigin_chats = [-1001]\n"
            + '[[telegram.routes]]\nchat_id = 5\nagents = ["builder"]\n',
            [],
        ),
    ],
)
def test_nothing_served_warnings(tmp_path: Path, toml: str, expected: list[str]) -> None:
    config = parse_config(tomllib.loads(toml), base_dir=tmp_path)
    warnings = nothing_served(config)
    assert len(warnings) == len(expected)
    for warning, start in zip(warnings, expected, strict=True):
        assert warning.startswith(start)


def test_config_check_does_not_say_cards_reach_no_chat_when_turns_bring_them(
    tmp_path: Path,
) -> None:
    """A configuration whose only way into a chat is `origin_chats` (cards follow the chat a
    turn came from, as the README sets it up) was warned of as "no card reaches any chat"."""
    config = tmp_path / "taskcard.toml"
    config.write_text(AGENT + '[feishu]\norigin_chats = ["oc_team"]\n')
    result = taskcard("config", "check", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{config}: valid; 1 agent, 0 routes"), result.stdout
    assert "warning" not in result.stderr, result.stderr


async def test_two_agents_on_one_workdir_are_warned_of_by_check_and_serve(
    tmp_path: Path,
) -> None:
    """Two [[agents]] on one folder (written differently) were taken without a word: one
    agent's card shown twice under two names, a `/tell` to either queued in one inbox."""
    config = console_config(
        tmp_path, AGENT + '[[agents]]\nid = "twin"\nworkdir = "./agents/builder/"\n'
    )
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    words = "agents[1].workdir: the same folder as agents[0] ('builder')"
    check = taskcard("config", "check", str(config))
    assert check.returncode == 0, check.stderr
    assert f"warning: {words}" in check.stderr, check.stderr
    with ServeProcess(config) as serve:
        await eventually(lambda: "channel console ready" in serve.logs, what="the start")
        assert await serve.aterminate() == 0
    assert serve.logs.count(words) == 1, serve.logs


async def test_a_root_listed_twice_is_read_once_with_a_warning(tmp_path: Path) -> None:
    """A discovery root listed twice (written differently, or through a link to it) found
    every agent in it twice, one warning per agent ("already found at" the same folder). It
    is read once, and `config check` and the start say so, once per repeated entry; the
    file still loads (nothing is lost by listing a root twice)."""
    (tmp_path / "fleet" / "builder").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "fleet")
    config = console_config(tmp_path, extra='[discover]\nroots = ["fleet", "./fleet/", "link"]\n')
    words = [
        f"discover.roots[{index}]: {tmp_path / name} is the same folder as discover.roots[0]"
        for index, name in ((1, "fleet"), (2, "link"))
    ]
    check = taskcard("config", "check", str(config))
    assert check.returncode == 0, check.stderr
    for line in words:
        assert f"warning: {line}" in check.stderr, check.stderr
    with ServeProcess(config) as serve:
        await eventually(lambda: "channel console ready" in serve.logs, what="the start")
        assert await serve.aterminate() == 0
    assert "serving 1 agent on 1 route (console)" in serve.logs, serve.logs  # not "1 agents"
    assert "already found" not in serve.logs, serve.logs
    for line in words:
        assert serve.logs.count(line) == 1, serve.logs


@pytest.mark.parametrize(
    ("make", "words"),
    [
        # An endless device was read until memory ran out; it is refused before any read.
        (lambda tmp: Path("/dev/zero"), "is a device"),
        # A byte order mark (Windows editors) got "Invalid statement (at line 1, column 1)".
        (
            lambda tmp: _written(tmp / "bom.toml", b"\xef\xbb\xbf" + AGENT.encode()),
            "byte order mark",
        ),
        # A folder got "cannot be read (Is a directory); check its permissions".
        (lambda tmp: tmp, "is a folder"),
        (lambda tmp: _written(tmp / "big.toml", b"#" * (17 * 1024 * 1024)), "larger than"),
        # One Latin-1 byte got "not UTF-8 text" with no place to look for it.
        (
            lambda tmp: _written(tmp / "latin1.toml", AGENT.encode() + b"# caf\xe9\n"),
            "not UTF-8 text (byte 0xe9 at line 4, column 6); save the file as UTF-8",
        ),
    ],
    ids=["device", "bom", "folder", "huge", "latin-1"],
)
def test_a_config_path_of_the_wrong_kind_says_what_is_wrong(
    tmp_path: Path, make: Callable[[Path], Path], words: str
) -> None:
    path = make(tmp_path)
    for args in (("config", "check", str(path)), ("serve", "--config", str(path))):
        result = taskcard(*args)
        assert result.returncode == 2, result.stderr
        assert words in result.stderr and "Traceback" not in result.stderr


def test_dev_null_is_an_empty_config_not_a_device(tmp_path: Path) -> None:
    # `--config /dev/null` (the embedded defaults) was valid before devices were refused.
    result = taskcard("config", "check", os.devnull)
    assert result.returncode == 0, result.stderr
    assert "valid; 0 agents" in result.stdout


def test_a_config_from_a_pipe_is_still_read(tmp_path: Path) -> None:
    config = console_config(tmp_path, AGENT)
    result = subprocess.run(
        [
            "bash",
            "-c",
            '"$0" -m taskcard.bridge.cli config check <(cat "$1")',
            sys.executable,
            config,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "valid; 1 agent," in result.stdout


def test_a_config_that_is_a_named_pipe_nothing_writes_is_refused_not_awaited(
    tmp_path: Path,
) -> None:
    """`config check FIFO` (or `--config FIFO`) with no writer hung in `open` for ever; it is
    refused, naming the pipe and the fix, once the pipe stayed silent for the wait."""
    fifo = tmp_path / "taskcard.fifo"
    os.mkfifo(fifo)
    result = taskcard("config", "check", str(fifo))
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert f"{fifo}: is a pipe that nothing wrote to within 30 s; give the path" in (result.stderr)
    assert "Traceback" not in result.stderr


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ('[[agents]]\nid = "builder"\nworkdir = "notes.txt/builder"\n', "agents[0].workdir"),
        ('[discover]\nroots = ["notes.txt/agents"]\n', "discover.roots[0]"),
    ],
)
def test_a_path_under_a_file_is_refused_naming_the_file(
    tmp_path: Path, section: str, key: str
) -> None:
    # A workdir or root "may not exist yet", but one under a file never can: it was accepted
    # (a state_dir under a file is refused already).
    (tmp_path / "notes.txt").write_text("a file, not a folder\n")
    config = console_config(tmp_path, section)
    result = taskcard("config", "check", str(config))
    assert result.returncode == 2
    assert f"{key}: {tmp_path / 'notes.txt'} is not a directory" in result.stderr


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (None, "is not set"),
        ("  ", "is empty"),
        # Copied with an accented letter, inner quotes or a space: it would reach the
        # request line, and a server's answer may echo it into the log unscrubbed.
        ("123456:SECRÉT-part", "does not hold a bot token"),
        ('"123456:SECRET-part"', "does not hold a bot token"),
        ("123456:SECRET part", "does not hold a bot token"),
    ],
)
def test_a_missing_or_blank_secret_stops_serve_naming_the_variable(
    tmp_path: Path, value: str | None, words: str
) -> None:
    config = console_config(
        tmp_path,
        AGENT,
        '[telegram]\ntoken_env = "TC_BLANK_TOKEN"\napi_base_url = "http://127.0.0.1:9"\n',
    )
    env = {} if value is None else {"TC_BLANK_TOKEN": value}
    result = taskcard("serve", "--config", str(config), env=env)
    assert result.returncode == 2
    assert f"telegram.token_env: the environment variable TC_BLANK_TOKEN {words}" in result.stderr
    assert "SECR" not in result.stderr


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_every_missing_secret_is_named_at_once(tmp_path: Path, log_format: str) -> None:
    """With the bot token and the Feishu app's variables all unset, the start named the
    bot token alone: the operator fixed it, started again, and only then learnt of the
    next. Every missing variable is one line (one JSON record) of the same stop, exit 2."""
    config = console_config(
        tmp_path,
        AGENT,
        '[telegram]\ntoken_env = "TC_NO_TOKEN"\n'
        '[feishu]\napp_id_env = "TC_NO_APP_ID"\napp_secret_env = "TC_NO_APP_SECRET"\n'
        'events = "webhook"\n[feishu.webhook]\nverification_token_env = "TC_NO_VERIFY"\n',
    )
    result = taskcard("serve", "--config", str(config), "--log-format", log_format)
    assert result.returncode == 2, result.stderr
    for key, variable in (
        ("telegram.token_env", "TC_NO_TOKEN"),
        ("feishu.app_id_env", "TC_NO_APP_ID"),
        ("feishu.app_secret_env", "TC_NO_APP_SECRET"),
        ("feishu.webhook.verification_token_env", "TC_NO_VERIFY"),
    ):
        lines = [line for line in result.stderr.splitlines() if variable in line]
        assert len(lines) == 1, result.stderr
        assert f"{key}: the environment variable {variable} is not set" in lines[0]
        if log_format == "json":
            assert json.loads(lines[0])["level"] == "ERROR"
    assert "Traceback" not in result.stderr


def _with_stdout(stdout: int | IO[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`taskcard ARGS` writing its output to `stdout` (a closed pipe, a full disk)."""
    return subprocess.run(
        [sys.executable, "-m", "taskcard.bridge.cli", *args],
        cwd=ROOT,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("command", ["card manual", "ledger show", "ledger render"])
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path, command: str) -> None:
    """`taskcard ... | head -1`: exit 141 and nothing on stderr (the ledger's commands said
    "cannot write (Broken pipe)" and exited 1, as if the ledger could not be written)."""
    args = command.split()
    if args[0] == "ledger":
        made = taskcard("ledger", "init", "t1", "--purpose", "train", "--workdir", str(tmp_path))
        assert made.returncode == 0, made.stderr
        args += ["t1", "--workdir", str(tmp_path)]
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head -1` that has already read its line
    try:
        done = _with_stdout(write_end, *args)
    finally:
        os.close(write_end)
    assert done.returncode == 141
    assert done.stderr == ""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    "args", [("status",), ("status", "--json"), ("chats",), ("config", "check")]
)
def test_output_to_a_full_disk_is_one_line_and_exit_1(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """`taskcard status > status.txt` on a full disk (here /dev/full): one line naming the
    cause on stderr and exit 1, not a traceback."""
    config = console_config(tmp_path, AGENT)
    where = (str(config),) if args == ("config", "check") else ("--config", str(config))
    with open("/dev/full", "w") as full:
        done = _with_stdout(full, *args, *where)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == "taskcard: cannot write the output (No space left on device)"


@pytest.mark.parametrize("state_dir", ["/proc/x", "/sys/taskcard", "/dev/taskcard", "LINK/x"])
def test_a_state_dir_on_a_kernel_file_system_is_refused_naming_the_key(
    tmp_path: Path, state_dir: str
) -> None:
    """Root may `mkdir` under /dev, and `os.access` says yes to it under /proc and /sys: the
    writability check passed and the service would keep its state there (or fail later)."""
    (tmp_path / "LINK").symlink_to("/proc/self")
    value = state_dir.replace("LINK", str(tmp_path / "LINK"))
    config = tmp_path / "taskcard.toml"
    config.write_text(f'state_dir = "{value}"\n{AGENT}')
    for args in (("config", "check", str(config)), ("serve", "--config", str(config), "--check")):
        result = taskcard(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert f"state_dir: {value} is under /" in result.stderr
        assert "kernel file system" in result.stderr and "Traceback" not in result.stderr
    assert not Path("/dev/taskcard").exists()


def test_a_state_dir_in_shared_memory_is_an_ordinary_folder(tmp_path: Path) -> None:
    """/dev/shm is a tmpfs like /tmp, not a kernel file system: a state kept there lasts
    until the next boot, which a test rig or a container may want."""
    if not Path("/dev/shm").is_dir() or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm here")
    state_dir = Path("/dev/shm") / f"taskcard-{tmp_path.name}"
    config = tmp_path / "taskcard.toml"
    config.write_text(f'state_dir = "{state_dir}"\n{AGENT}')
    try:
        result = taskcard("config", "check", str(config))
        assert result.returncode == 0, result.stderr
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def test_relative_paths_of_a_piped_config_start_at_the_current_folder(tmp_path: Path) -> None:
    """A pipe's folder is /proc/<pid>/fd: a relative `state_dir` landed there (and passed the
    check as root). With no folder of its own, the config's paths start where it is run."""
    (tmp_path / "st").write_text("a file, not a folder\n")
    config = tmp_path / "piped.toml"
    config.write_text(f'state_dir = "st"\n{AGENT}')
    result = subprocess.run(
        [
            "bash",
            "-c",
            '"$0" -m taskcard.bridge.cli config check <(cat "$1")',
            sys.executable,
            config,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout
    assert f"state_dir: {tmp_path / 'st'} exists and is not a directory" in result.stderr


def test_serve_check_names_each_unset_secret_variable_and_never_a_value(tmp_path: Path) -> None:
    """`serve --check` said "valid" for a configuration whose secret variables were not set
    where it ran, and `serve` then stopped on them. It now reads them as `serve` does: every
    required one unset or empty is named with its setting (exit 2), an optional one is a
    warning, and no value is ever printed."""
    config = console_config(
        tmp_path,
        AGENT,
        extra=(
            '[telegram]\ntoken_env = "TC_CHECK_TOKEN"\n'
            '[[telegram.routes]]\nchat_id = -100123\nagents = ["*"]\n'
            '[feishu]\napp_id_env = "TC_CHECK_APP_ID"\napp_secret_env = "TC_CHECK_SECRET"\n'
            'events = "webhook"\n'
            '[feishu.webhook]\nverification_token_env = "TC_CHECK_VERIFY"\n'
            'encrypt_key_env = "TC_CHECK_ENCRYPT"\n'
            '[[feishu.routes]]\nchat_id = "oc_check"\nagents = ["*"]\n'
        ),
    )
    secrets = {
        "TC_CHECK_TOKEN": "123456:check-token-value",
        "TC_CHECK_APP_ID": "cli_check_app_id_value",
        "TC_CHECK_SECRET": "check-app-secret-value",
        "TC_CHECK_VERIFY": "check-verify-value",
        "TC_CHECK_ENCRYPT": "check-encrypt-value",
    }
    args = ("serve", "--config", str(config), "--check")
    cleared = {name: "" for name in secrets}  # present and empty: told apart from unset
    result = taskcard(*args, env={**cleared, "TC_CHECK_APP_ID": secrets["TC_CHECK_APP_ID"]})
    assert result.returncode == 2, result.stderr
    assert "valid" not in result.stdout
    for setting, variable in (
        ("telegram.token_env", "TC_CHECK_TOKEN"),
        ("feishu.app_secret_env", "TC_CHECK_SECRET"),
        ("feishu.webhook.verification_token_env", "TC_CHECK_VERIFY"),
    ):
        [line] = [line for line in result.stderr.splitlines() if line.startswith(f"  - {setting}:")]
        assert variable in line and "is empty" in line, line
    assert "feishu.app_id_env" not in result.stderr  # it is set
    [warning] = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert "feishu.webhook.encrypt_key_env" in warning and "TC_CHECK_ENCRYPT" in warning
    assert secrets["TC_CHECK_APP_ID"] not in result.stderr + result.stdout

    # With its workdir made, so that nothing at all is said but "valid" (a workdir not made
    # yet is noted, see tests/e2e/test_workdir_not_yet.py).
    (tmp_path / "agents" / "builder").mkdir(parents=True)
    result = taskcard(*args, env=secrets)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{config}: valid; ") and result.stderr == ""
    assert not any(value in result.stdout + result.stderr for value in secrets.values())

    bad_token = {**secrets, "TC_CHECK_TOKEN": "a token with spaces"}
    result = taskcard(*args, env=bad_token)
    assert result.returncode == 2
    assert "telegram.token_env" in result.stderr and "does not hold a bot token" in result.stderr
    assert "a token with spaces" not in result.stderr


def test_serve_check_names_an_unset_variable_and_the_clusters_redis_url(tmp_path: Path) -> None:
    """A variable that is not set at all is told apart from an empty one, and a cluster's
    Redis URL variable is checked as `serve` checks it."""
    config = console_config(
        tmp_path,
        AGENT,
        extra=(
            '[console]\nenabled = true\n[telegram]\ntoken_env = "TC_CHECK_UNSET_TOKEN"\n'
            '[[telegram.routes]]\nchat_id = -100123\nagents = ["*"]\n'
            '[cluster]\nredis_url_env = "TC_CHECK_UNSET_REDIS"\n'
        ),
    )
    result = taskcard("serve", "--config", str(config), "--check")
    assert result.returncode == 2, result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 2, result.stderr
    assert "telegram.token_env" in problems[0] and "TC_CHECK_UNSET_TOKEN is not set" in problems[0]
    assert "cluster.redis_url_env" in problems[1] and "TC_CHECK_UNSET_REDIS" in problems[1]
    assert "is not set" in problems[1]
    env = {"TC_CHECK_UNSET_TOKEN": "123456:abc", "TC_CHECK_UNSET_REDIS": "redis://127.0.0.1:1/0"}
    result = taskcard("serve", "--config", str(config), "--check", env=env)
    assert result.returncode == 0, result.stderr
    assert "redis://" not in result.stdout + result.stderr


@pytest.mark.parametrize("events", ["", 'events = "websocket"\n', 'events = "none"\n'])
def test_a_feishu_webhook_that_is_not_served_is_warned_of(tmp_path: Path, events: str) -> None:
    # `events` defaults to "websocket": a [feishu.webhook] table written without it was
    # taken without a word, and Feishu's callbacks then met a closed port (its URL check
    # failed, commands never came).
    feishu = (
        "[feishu]\n" + events + "[feishu.webhook]\nport = 8088\n"
        '[[feishu.routes]]\nchat_id = "oc_1"\nagents = ["builder"]\n'
    )
    config = console_config(tmp_path, AGENT + feishu)
    check = taskcard("config", "check", str(config))
    assert check.returncode == 0, check.stderr
    assert "warning: feishu.webhook: " in check.stderr, check.stderr
    assert 'set events = "webhook"' in check.stderr
    served = console_config(
        tmp_path,
        AGENT + feishu.replace(events, "").replace("[feishu]\n", '[feishu]\nevents = "webhook"\n'),
    )
    check = taskcard("config", "check", str(served))
    assert check.returncode == 0 and "feishu.webhook" not in check.stderr, check.stderr


@pytest.mark.parametrize(
    ("section", "chat"),
    [("telegram", "-100123"), ("feishu", '"oc_1"')],
)
def test_an_empty_allowed_list_is_warned_of(tmp_path: Path, section: str, chat: str) -> None:
    # `allowed_user_ids = []` lets no one use the commands in that chat: most likely a slip.
    route = f'[[{section}.routes]]\nchat_id = {chat}\nagents = ["builder"]\n'
    env = {"TELEGRAM_BOT_TOKEN": "1:T", "FEISHU_APP_ID": "cli_x", "FEISHU_APP_SECRET": "s"}
    empty = console_config(tmp_path, AGENT + route + "allowed_user_ids = []\n")
    for args in (("config", "check", str(empty)), ("serve", "--config", str(empty), "--check")):
        result = taskcard(*args, env=env)
        assert result.returncode == 0, result.stderr
        assert f"warning: {section}.routes[0].allowed_user_ids: empty" in result.stderr
    listed = console_config(
        tmp_path,
        AGENT
        + route
        + "allowed_user_ids = []\n".replace("[]", "[1]" if section == "telegram" else '["ou_1"]'),
    )
    check = taskcard("config", "check", str(listed), env=env)
    assert check.returncode == 0 and "allowed_user_ids" not in check.stderr, check.stderr
