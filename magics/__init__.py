"""`%%dlc` and `%dlc ...`: a cell becomes a torchrun job; line magics manage jobs.

Installed as `jupyter_dlc.magics`. Argument stacks are declared once (JOB_OPTIONS, shared
with the CLI) and every user error is a one-line UsageError, never a traceback.
"""

from __future__ import annotations

import os
import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from .. import formatting, sweeps
from ..client import LauncherClient, LauncherError
from ..commands import add_commands
from ..spec import JOB_OPTIONS, SpecError, spec_from_options


def _job_options(func):
    for flags, kwargs in reversed(JOB_OPTIONS):
        func = argument(*flags, **kwargs)(func)
    return func


class _LineParser:
    """argparse for the `%dlc SUBCOMMAND` line magics, raising UsageError instead of exiting."""

    def __init__(self):
        import argparse

        class Parser(argparse.ArgumentParser):
            def error(self, message):
                raise UsageError(f"%dlc: {message}")

            def exit(self, status=0, message=None):
                raise UsageError(message or "%dlc: see %dlc --help")

        self.parser = Parser(prog="%dlc", add_help=False)
        add_commands(self.parser, "magic", parser_class=Parser)

    def parse(self, line: str):
        return self.parser.parse_args(shlex.split(line))


@magics_class
class DLCMagics(Magics):
    _client: LauncherClient | None = None

    @property
    def client(self) -> LauncherClient:
        if self._client is None or not self._client.alive():
            DLCMagics._client = LauncherClient.connect()
        return self._client

    @magic_arguments()
    @_job_options
    @argument("--wait", action="store_true", help="block until the job ends; raise if it failed")
    @argument("--push", action="append", default=[], metavar="NAME",
              help="send the value of NAME to every rank (pickled)")
    @argument("--include-cell", action="append", default=[], type=int, metavar="N",
              help="replay the whole of cell N in every rank")
    @argument("--show-capture", action="store_true", help="print the captured code")
    @argument("--export", default=None, metavar="DIR",
              help="write a standalone bundle for this cell instead of submitting")
    @cell_magic
    def dlc(self, line, cell):
        """Run this cell as a torchrun job: %%dlc --nodes 2 --nproc-per-node 2"""
        try:
            # Split as a shell would (IPython's parse_argstring keeps the quotes around
            # `--alert "loss is nan -> stop"` in the value), as the CLI gets it.
            args = self.dlc.parser.parse_args(shlex.split(line))
        except (UsageError, ValueError) as error:
            raise UsageError(f"%%dlc: {error}") from None
        try:
            script, files, summary, captured, where = self._capture(cell, args)
            spec = spec_from_options(args, code=script, files=files,
                                     source={"kind": "notebook", "path": _notebook_path(self.shell), **where})
            trials = sweeps.from_options(args, spec)
        except (SpecError, ValueError) as error:
            raise UsageError(f"%%dlc: {error}") from None
        if summary:
            print(summary)
        if args.show_capture:
            print(captured or "# nothing captured")
        if args.export:
            from ..export import branch_step, export_bundle

            try:
                branch = branch_step(self.client, spec) if spec.branch_from else None
                paths = export_bundle(spec, script, args.export, files=files, branch=branch)
            except ValueError as error:
                raise UsageError(f"%%dlc --export: {error}") from None
            print(f"exported to {os.path.abspath(args.export)}: {', '.join(os.path.basename(p) for p in paths)}")
            return
        if args.dry_run:
            try:
                specs = trials or [spec]
                print(formatting.dry_run_text(self.client.submit(specs[0], dry_run=True), specs[1:]))
            except LauncherError as error:
                raise UsageError(f"%%dlc --dry-run: {error}") from None
            return
        if trials:
            return self._sweep(trials, args.wait)
        try:
            job = self.client.submit(spec)
        except LauncherError as error:
            raise UsageError(f"%%dlc: {error}") from None
        view = self._show(job["id"])
        if args.wait:
            job = self.client.wait(job["id"])
            if view is not None:
                view.refresh_now()
            if job["state"] != "SUCCEEDED":
                raise RuntimeError(f"job {job['id']} {job['state']}: {job.get('reason')}")
        return

    def _sweep(self, trials, wait: bool):
        """Submit a sweep's trials; the cell's output is the sweep's view (widgets/sweep.py)."""
        try:
            jobs = sweeps.submit(self.client, trials)
        except LauncherError as error:
            raise UsageError(f"%%dlc: {error}") from None
        sweep_id = trials[0].sweep["id"]
        print(f"sweep {sweep_id}: {len(jobs)} trials")
        from ..widgets import show_sweep

        view = show_sweep(self.client, sweep_id)
        if wait:
            ended = [self.client.wait(job["id"]) for job in jobs]
            view.refresh_now()
            failed = [job for job in ended if job["state"] == "FAILED"]
            if failed:
                raise RuntimeError(f"sweep {sweep_id}: {len(failed)} of {len(ended)} trials failed "
                                   f"({', '.join(job['id'] for job in failed)})")

    def _capture(self, cell: str, args) -> tuple[str, dict, str, str, dict]:
        from .capture import capture

        result = capture(cell, self.shell, push=args.push, include_cells=args.include_cell)
        # The cell and line every script line came from: diagnoses point there (diagnosis.py).
        where = {"cell": result.cell, "lines": result.source_map}
        return result.script, result.files, result.summary, result.code, where

    def _show(self, job_id: str):
        from ..widgets import show_job

        return show_job(self.client, job_id)

    @line_magic("dlc")
    def dlc_line(self, line):
        """%dlc list [--tree] | status JOB [--json] | wait JOB | attach JOB |
        logs JOB [--rank R] [--tail N] [--follow] [--raw] | stop JOB [--grace S] |
        resume JOB [--step N] | why JOB | checkpoints JOB | clone JOB | delete JOB |
        compare JOB JOB... [--metric M] | sweep SWEEP [--metric M] |
        export JOB DIR | clusters | pool up|down|status [--nodes N] [--nproc-per-node M]
        [--cluster NAME] [--idle-timeout S]  (the subcommands of jupyter-dlc, from jupyter_dlc/commands.py)"""
        options = _LineParser().parse(line)
        try:
            return self._run_line(options)
        except (LauncherError, SpecError, ValueError) as error:
            raise UsageError(f"%dlc {options.command}: {error}") from None

    def _run_line(self, options):
        from ..cli import run_text_command

        command = options.command
        if command == "clusters":  # profiles and their live checks; no launcher involved
            from ..clusters import clusters_table
            from ..engines.contract import check_clusters

            print(clusters_table(check_clusters()))
            return
        client = self.client
        if command == "wait":
            job = client.wait(options.job)
            print(formatting.status_line(job))
            if job["state"] != "SUCCEEDED":
                raise UsageError(f"job {job['id']} {job['state']}: {job.get('reason')}")
        elif command == "attach":
            self._show(client.job(options.job)["id"])
        elif command == "resume":
            self._show(client.resume(options.job, options.step)["id"])
        elif command == "clone":
            self._show(client.clone(options.job)["id"])
        elif command == "compare":  # curves, values and differences in one widget
            from ..widgets import show_compare

            show_compare(client, options.jobs, options.metric)
        else:
            run_text_command(client, options)


def _notebook_path(shell) -> str | None:
    """The notebook this kernel runs, when the front end says (JupyterLab sets it)."""
    for key in ("JPY_SESSION_NAME", "__session__"):
        value = os.environ.get(key) or shell.user_ns.get(key)
        if value:
            return str(value)
    return None


def load_ipython_extension(ipython):
    ipython.register_magics(DLCMagics)


def unload_ipython_extension(ipython):
    for kind in ("cell", "line"):
        ipython.magics_manager.magics[kind].pop("dlc", None)
