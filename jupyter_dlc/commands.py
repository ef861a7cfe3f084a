"""The job subcommands of `jupyter-dlc` and `%dlc`, declared once.

Both parsers are built from COMMANDS, so a subcommand or an option cannot exist in one and
not the other unless its row says so (`only`), with the reason next to it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from .spec import JOB_OPTIONS

Arg = tuple[tuple[str, ...], dict[str, Any]]
JOB: Arg = (("job",), {"help": "a job id, a unique prefix of one, or `last`"})
BOTH = ("cli", "magic")


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    args: tuple[Arg, ...] = ()
    only: tuple[str, ...] = BOTH  # where it exists: "cli", "magic" or both
    usage: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


COMMANDS: tuple[Command, ...] = (
    # `%%dlc` (the cell magic) is the notebook's `run`: it submits the cell, not a file.
    Command("run", "run a script as a torchrun job", (
        (("script",), {}), *JOB_OPTIONS,
        (("--wait",), {"action": "store_true", "help": "follow the job; exit 0 only if it succeeded"}),
    ), only=("cli",), usage="jupyter-dlc run SCRIPT [SCRIPT_ARGS...] [options] [-- SCRIPT_ARGS...]"),
    Command("list", "every job the launcher knows", ((("--tree",), {
        "action": "store_true", "help": "each branch (--from) under the job it started from"}),)),
    Command("status", "one job in detail", (JOB, (("--json",), {"action": "store_true",
                                                                  "help": "the launcher's JSON"}))),
    Command("wait", "wait for a job to end; fail unless it succeeded", (JOB,)),
    # A widget needs a notebook; in a shell, `logs --follow` is the live view.
    Command("attach", "show a job's live view in this notebook", (JOB,), only=("magic",)),
    Command("logs", "a job's logs (control sequences neutralised)", (
        JOB, (("--rank",), {"type": int, "default": None, "help": "one rank"}),
        (("--tail",), {"type": int, "default": None, "help": "the last N lines"}),
        (("--follow", "-f"), {"action": "store_true", "help": "keep printing until the job ends"}),
        (("--raw",), {"action": "store_true",
                      "help": "pass escape and control sequences through to the terminal"}))),
    Command("stop", "stop a job (SIGTERM, grace, SIGKILL)", (
        JOB, (("--grace",), {"type": float, "default": None, "help": "seconds before SIGKILL"}))),
    Command("resume", "resume an ended job from a committed checkpoint", (
        JOB, (("--step",), {"type": int, "default": None,
                            "help": "default: the newest committed step"}))),
    Command("why", "why a job failed (the first error and what to do), or for a job that did "
            "not fail where its step time goes (input, communication, checkpoint, straggler)", (JOB,)),
    Command("evidence", "the evidence kept before a hung or failing attempt was killed", (JOB,)),
    Command("checkpoints", "committed checkpoints of a job", (JOB,)),
    Command("compare", "jobs side by side: a metric's last and best, and what differs (spec, env, "
            "parameters, arguments, code)", (
        (("jobs",), {"nargs": "+", "metavar": "JOB", "help": "2 to 10 jobs; the first is the reference"}),
        (("--metric",), {"default": "loss", "help": "the metric to compare"}))),
    Command("sweep", "a sweep's trials: state, parameters, last and best loss", (
        (("sweep",), {"help": "the sweep's id (printed when it was submitted)"}),
        (("--metric",), {"default": "loss", "help": "the metric to rank trials by"}))),
    Command("clone", "a new job from the same spec", (JOB,)),
    Command("delete", "delete an ended job", (JOB,)),
    Command("export", "write a bundle that runs with plain torchrun", (
        JOB, (("dir",), {"help": "where to write the bundle"}))),
    Command("pool", "warm pools: agents with torch imported that start a shape's jobs at once", (
        (("action",), {"choices": ["up", "down", "status"]}),
        (("--nodes",), {"type": int, "default": None, "help": "up/down: nodes of the shape"}),
        (("--nproc-per-node",), {"type": int, "default": None,
                                 "help": "up/down: processes per node of the shape"}),
        (("--cluster",), {"default": None, "help": "a cluster profile (default: this machine)"}),
        (("--idle-timeout",), {"type": float, "default": None,
                               "help": "up: seconds idle before it is released (default 600)"}))),
    Command("clusters", "cluster profiles, each with a live check (reachable, idle nodes, GPUs)"),
    Command("launcher", "the launcher service, or its Kubernetes manifests (`manifest`)", (
        (("action",), {"choices": ["start", "stop", "status", "manifest"]}),
        (("--namespace",), {"default": "default", "help": "manifest: the namespace"}),
        (("--image",), {"default": None, "help": "manifest: an image with jupyter-dlc"})),
        only=("cli",)),
)


def add_commands(parser: argparse.ArgumentParser, where: str,
                 parser_class: type | None = None) -> argparse._SubParsersAction:
    """The subcommands of `where` ("cli" or "magic") on `parser`, from COMMANDS."""
    kwargs: dict[str, Any] = {"dest": "command", "required": True}
    if parser_class is not None:
        kwargs["parser_class"] = parser_class
    sub = parser.add_subparsers(**kwargs)
    for command in COMMANDS:
        if where not in command.only:
            continue
        cmd = sub.add_parser(command.name, help=command.help, usage=command.usage,
                             description=command.help)
        for flags, options in command.args:
            cmd.add_argument(*flags, **options)
    return sub
