"""Execute examples/quickstart.ipynb headless in a real kernel and print what it printed.

The `%%dlc` cell submits a 2x2 torchrun job to the launcher (started on first use) and
`%dlc wait last` blocks until it ends, so the notebook's last outputs are the job's final
state, last loss and committed checkpoints.
"""

import os
import sys

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOK = os.path.join(HERE, "..", "examples", "quickstart.ipynb")


def text_of(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return f"{output.get('ename')}: {output.get('evalue')}\n"
    data = output.get("data", {})
    return data.get("text/plain", "") + ("\n" if "text/plain" in data else "")


def main() -> int:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
    try:
        client.execute()
        ok = True
    except CellExecutionError as error:
        print(error, file=sys.stderr)
        ok = False
    for cell in nb.cells[2:]:
        for output in cell.get("outputs", []):
            sys.stdout.write(text_of(output))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
