"""`jupyter-dlc` and `%dlc` are built from one table (jupyter_dlc/commands.py); logs are safe
to print; a rank outside the world is an error. Real launcher, real jobs, the real CLI in a
subprocess and the real magic in an IPython shell."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from jupyter_dlc.magics import DLCMagics, _LineParser

from jupyter_dlc.cli import _parser, neutralise
from jupyter_dlc.commands import COMMANDS

CLI = [sys.executable, "-m", "jupyter_dlc.cli"]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    """subcommand → its options and positionals, as a parser really accepts them."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: {opt for a in sub._actions for opt in (a.option_strings or [a.dest])}
            for name, sub in action.choices.items()}


def test_cli_and_magic_expose_the_same_subcommands_and_options():
    cli = subcommands(_parser())
    magic = subcommands(_LineParser().parser)
    only = {c.name: c.only for c in COMMANDS if c.only != ("cli", "magic")}
    assert set(cli) - set(magic) == {name for name, where in only.items() if where == ("cli",)}
    assert set(magic) - set(cli) == {name for name, where in only.items() if where == ("magic",)}
    for name in set(cli) & set(magic):
        assert cli[name] - {"-h", "--help"} == magic[name] - {"-h", "--help"}, name
    assert "--grace" in cli["stop"] and "--grace" in magic["stop"]
    assert "--raw" in cli["logs"] and "--raw" in magic["logs"]


def test_neutralise_drops_escape_sequences_and_keeps_tabs():
    text = "a\x1b[31mred\x1b[0m\ttab \x1b]0;pwned\x07title \x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ " \
           "\x9b2J\x07bell\x00nul\x1bc"
    safe = neutralise(text)
    assert safe == "ared\ttab title link \\x07bell\\x00nul"
    assert not any(ord(ch) < 32 and ch != "\t" or 0x7f <= ord(ch) <= 0x9f for ch in safe)


ESCAPING = r"""
import os, sys
print("plain line", flush=True)
print("\x1b]0;owned title\x07\x1b[2J\x1b[31mred\x1b[0m\tafter tab", flush=True)
"""


@pytest.fixture(scope="module")
def four_ranks(shared_launcher):
    script = shared_launcher.script("escapes.py", ESCAPING)
    job = shared_launcher.client.submit({"script": script, "nodes": 1, "nproc_per_node": 4,
                                         "max_restarts": 0})
    job = shared_launcher.client.wait(job["id"], timeout=180)
    assert job["state"] == "SUCCEEDED", job["reason"]
    return shared_launcher, job["id"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, env=dict(os.environ),
                          timeout=60)


def test_cli_logs_neutralise_control_sequences_unless_raw(four_ranks):
    _, job_id = four_ranks
    safe = cli("logs", job_id, "--rank", "0")
    assert safe.returncode == 0, safe.stderr
    assert "red\tafter tab" in safe.stdout and "\x1b" not in safe.stdout and "\x07" not in safe.stdout
    raw = cli("logs", job_id, "--rank", "0", "--raw")
    assert "\x1b]0;owned title\x07" in raw.stdout
    follow = cli("logs", job_id, "--follow")
    assert follow.returncode == 0 and "[rank 3] plain line" in follow.stdout
    assert "\x1b" not in follow.stdout


def test_cli_logs_of_a_rank_outside_the_world_fails(four_ranks):
    _, job_id = four_ranks
    for args in (("logs", job_id, "--rank", "9"), ("logs", job_id, "--rank", "9", "--follow")):
        result = cli(*args)
        assert result.returncode != 0
        assert result.stdout == ""
        assert result.stderr.strip().splitlines() == [
            "jupyter-dlc: rank: rank 9 does not exist in a world of 4 (ranks 0-3)"]


def test_cli_wait_and_stop_grace(four_ranks):
    _, job_id = four_ranks
    waited = cli("wait", job_id)
    assert waited.returncode == 0 and "SUCCEEDED" in waited.stdout
    stopped = cli("stop", job_id, "--grace", "2")  # an ended job: a one-line 409
    assert stopped.returncode == 2 and "already ended" in stopped.stderr


def test_magic_logs_rank_outside_the_world_is_one_line(four_ranks):
    _, job_id = four_ranks
    shell = InteractiveShell.instance()
    shell.register_magics(DLCMagics)
    with pytest.raises(UsageError) as refused:
        shell.run_line_magic("dlc", f"logs {job_id} --rank 9")
    message = str(refused.value)
    assert message == "%dlc logs: rank: rank 9 does not exist in a world of 4 (ranks 0-3)"
    with pytest.raises(UsageError) as ended:
        shell.run_line_magic("dlc", f"stop {job_id} --grace 1")  # the option exists in %dlc too
    assert "already ended" in str(ended.value)
