"""Every notebook in examples/ runs end to end in a real kernel (nbclient), against a real
launcher, and so cannot rot. The notebooks assert their own outcomes in their cells (a job's
final state, the step it resumed from, the webhook it received), so a behaviour that
regresses fails the cell, and so this test.

New notebooks are picked up from the directory listing. Three are left out here only because
another test runs them: the quickstart (tests/test_notebook.py, through scripts/run_quickstart.py,
the path users take), and the Slurm and Kubernetes examples, with the cluster each needs.
"""

from __future__ import annotations

import os

import nbformat
import pytest
from conftest import wait_for
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
RUN_ELSEWHERE = {"quickstart.ipynb": "tests/test_notebook.py",
                 # These need their cluster: the local Slurm cluster, the Kubernetes API stand-in.
                 "slurm.ipynb": "tests/test_slurm.py",
                 "kubernetes.ipynb": "tests/test_kubernetes_notebook.py"}
# Generous: each example takes one to two minutes here, more when the machine is busy.
NOTEBOOK_TIMEOUT = 600


def example_notebooks() -> list[str]:
    return sorted(name for name in os.listdir(EXAMPLES)
                  if name.endswith(".ipynb") and name not in RUN_ELSEWHERE)


def test_examples_are_found_and_committed_without_outputs():
    names = example_notebooks()
    assert {"fault_tolerance.ipynb", "alerts.ipynb", "promote.ipynb", "transformer.ipynb"} <= set(names)
    for name in names + list(RUN_ELSEWHERE):
        nb = nbformat.read(os.path.join(EXAMPLES, name), as_version=4)
        assert nb.cells[0].cell_type == "markdown", f"{name}: open with what it shows"
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not cell.outputs and cell.execution_count is None, \
                    f"{name}: commit it without outputs (Kernel > Restart and Clear Outputs)"


@pytest.mark.slow
@pytest.mark.timeout(NOTEBOOK_TIMEOUT + 60)
@pytest.mark.parametrize("name", example_notebooks())
def test_example_runs(launcher, tmp_path, name):
    nb = nbformat.read(os.path.join(EXAMPLES, name), as_version=4)
    client = NotebookClient(nb, timeout=NOTEBOOK_TIMEOUT, kernel_name="python3",
                            store_widget_state=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellExecutionError as error:
        pytest.fail(f"{name}: {error}", pytrace=False)
    # Whatever the notebook started has ended: no rank or agent outlives its example (the
    # launcher reaps an ended job's leftovers, standby agents included, on its next tick).
    wait_for(lambda: not launcher.own_processes(), 30, what="no process of the example's jobs")
