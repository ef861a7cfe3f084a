"""A small engine from outside the package, registered by an entry point only
(tiny_engine-0.1.dist-info/entry_points.txt, found on PYTHONPATH): this machine's processes,
as the local engine runs them, with one option of its own that every rank sees. It proves
that adding an engine takes one module and one entry point, no edit to jupyter_dlc."""

from __future__ import annotations

from jupyter_dlc.clusters import engine_profile
from jupyter_dlc.engine_registry import Option
from jupyter_dlc.engines.contract import AttemptContext, Capabilities, DryRun
from jupyter_dlc.engines.local import LocalEngine


class TinyEngine(LocalEngine):
    name = "tiny"
    profile_options = {"greeting": Option(str, "words every rank gets as TINY_GREETING")}

    def capabilities(self, spec) -> Capabilities:
        return Capabilities(branches=False)

    def _with_greeting(self, ctx: AttemptContext) -> AttemptContext:
        greeting = engine_profile(ctx.spec.cluster, self.name).get("greeting") or ""
        ctx.env = dict(ctx.env, TINY_GREETING=greeting)
        return ctx

    def dry_run(self, ctx: AttemptContext) -> DryRun:
        # The local engine's submit starts what its dry run says: the greeting rides along.
        request = super().dry_run(self._with_greeting(ctx))
        request.engine = self.name
        return request
