"""The `%%dlc` line is split as a shell splits it, so quoted values (alert rules) arrive whole."""

from __future__ import annotations

import yaml
from test_notebook import run_notebook, text


def test_quoted_alert_rules_and_env_values_reach_the_spec_whole(launcher, tmp_path):
    bundle = tmp_path / "bundle"
    nb = run_notebook([
        "%load_ext jupyter_dlc",
        "HOOK = 'http://127.0.0.1:9/hook'",
        (f"%%dlc --nodes 2 --export {bundle} --alert \"loss > 2x baseline 3 times -> webhook {{HOOK}}\" "
         "--alert 'log matches /CUDA error: an illegal/' --env \"GREETING=hello world\"\nprint(1)"),
        "%%dlc --alert \"loss is nan\nprint(1)",
    ], str(tmp_path), allow_errors=True)
    assert "exported to" in text(nb.cells[2]), text(nb.cells[2])
    spec = yaml.safe_load((bundle / "job.yaml").read_text())
    assert spec["alerts"] == ["loss > 2x baseline 3 times -> webhook http://127.0.0.1:9/hook",
                              "log matches /CUDA error: an illegal/"]
    assert spec["env"]["GREETING"] == "hello world"
    refused = text(nb.cells[3])  # an unclosed quote is a one-line usage error
    assert "UsageError" in refused and "quotation" in refused and "Traceback" not in refused
