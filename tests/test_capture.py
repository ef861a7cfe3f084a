"""Dependency capture against a real IPython shell; every captured script is run for real.

Each test executes cells in an InteractiveShell (history stored as in a notebook), captures
a cell, runs the captured script with `python` in a subprocess and compares its output with
what the kernel prints for the same cell.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from traitlets.config import Config

from jupyter_dlc.magics.capture import CaptureError, capture


@pytest.fixture
def shell():
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    sh = InteractiveShell.instance(config=config)
    sh.reset(new_session=True)  # fresh history (In) and namespace for every test
    yield sh
    sh.reset(new_session=True)


@pytest.fixture
def dlc_probe(shell):
    """A stand-in %%dlc magic that captures its cell the way the real one does: while the
    %%dlc cell itself is already in the history."""
    captures = []
    magics = shell.magics_manager.magics["cell"]
    previous = magics.get("dlc")

    def dlc(line, cell):
        captures.append(capture(cell, shell, push=line.split()))

    shell.register_magic_function(dlc, "cell", "dlc")
    yield captures
    if previous is None:
        magics.pop("dlc", None)
    else:
        magics["dlc"] = previous


def run(shell, code: str) -> str:
    """Run a cell like a notebook does; return what it printed. Fails on an error."""
    with capture_output() as out:
        result = shell.run_cell(textwrap.dedent(code), store_history=True)
    assert result.success, (code, result.error_in_exec or result.error_before_exec, out.stdout)
    return out.stdout


def kernel_output(shell, code: str) -> str:
    # Not stored, so the comparison run does not become history itself.
    with capture_output() as out:
        result = shell.run_cell(textwrap.dedent(code), store_history=False)
    assert result.success, result.error_in_exec
    return out.stdout


def run_script(cap, tmp_path, job_dir: bool = True) -> str:
    """Run the captured script as a rank would: python, no kernel, pushed files staged."""
    where = tmp_path / "job"
    where.mkdir()
    (where / "script.py").write_text(cap.script)
    (where / "files").mkdir()
    for name, path in cap.files.items():
        shutil.copy(path, where / "files" / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLC_")}
    if job_dir:
        env["DLC_JOB_DIR"] = str(where)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = subprocess.run([sys.executable, str(where / "script.py")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + "\n--- script ---\n" + cap.script
    return proc.stdout


CELL = """\
x = th.ones(2, 4)
print(round(Net()(x).sum().item() * LR, 6), CFG)
"""


def _notebook(shell, marker):
    run(shell, "import torch as th\nimport math, json")  # [1]
    run(shell, """\
        def helper(t):
            return t * SCALE + math.pi
        """)  # [2]
    run(shell, """\
        class Net(th.nn.Module):
            def __init__(self):
                super().__init__()
                th.manual_seed(0)
                self.lin = th.nn.Linear(4, 1)

            def forward(self, x):
                return helper(self.lin(x))
        """)  # [3]: two cells after the helper it uses
    run(shell, "SCALE = 2.0\nLR = 0.1\nCFG = dict(lr=LR, steps=[2**i for i in range(3)])")  # [4]
    run(shell, f"""\
        LR = 0.25
        %time warm = 1
        with open({str(marker)!r}, "a") as log:
            log.write("trained\\n")
        history = [th.rand(1).item() for _ in range(3)]
        print("side effect ran")
        """)  # [5]: redefines LR, then side effects


def test_alias_transitive_definitions_last_wins_and_the_script_runs(shell, dlc_probe, tmp_path):
    marker = tmp_path / "marker.log"
    _notebook(shell, marker)
    run(shell, "%%dlc\n" + CELL)  # [6], through the magic: the cell is in the history
    cap = dlc_probe[-1]

    assert cap.summary == ("captured torch (as th) from [1], Net from [3], helper from [2], "
                           "SCALE from [4], math from [1], LR from [4, 5], CFG from [4]")
    assert cap.by_cell == {1: ["th", "math"], 2: ["helper"], 3: ["Net"], 4: ["SCALE", "LR", "CFG"],
                           5: ["LR"]}
    # Only the needed alias of a multi-name import; the cells' side effects are not there.
    assert "import math\n" in cap.script and "json" not in cap.script
    assert "side effect" not in cap.script and "marker" not in cap.script
    assert "get_ipython" not in cap.script and "history" not in cap.script
    assert cap.script.index("# from cell [4]") < cap.script.index("# from cell [5]\nLR = 0.25")
    assert cap.script.splitlines()[cap.cell_line - 1] == CELL.splitlines()[0]
    assert cap.script.endswith(CELL)

    expected = kernel_output(shell, CELL)
    assert run_script(cap, tmp_path) == expected
    assert marker.read_text() == "trained\n"  # the side-effect cell ran once, in the kernel

    # A later %%dlc cell does not capture the earlier one.
    run(shell, "%%dlc\nprint(LR)")
    assert dlc_probe[-1].summary == "captured LR from [5]"  # only the last LR is needed now
    assert "run_cell_magic" not in dlc_probe[-1].script and dlc_probe[-1].script.count("print(LR)") == 1


def test_redefinition_order_is_replayed_in_execution_order(shell, tmp_path):
    run(shell, "N = 10")  # [1]
    run(shell, "DOUBLE = N * 2")  # [2]: computed from the first N
    run(shell, "N = 3")  # [3]: the kernel's N now
    run(shell, "def show():\n    return (N, DOUBLE)")  # [4]
    cap = capture("print(show())\n", shell)
    assert run_script(cap, tmp_path) == kernel_output(shell, "print(show())") == "(3, 20)\n"
    assert cap.summary == "captured show from [4], N from [1, 3], DOUBLE from [2]"


def test_scoping_only_free_names_are_captured(shell, tmp_path):
    run(shell, "x = 1; y = 2; z = 3; w = 4; k = 5; n = 6; os = None; args = 7")
    cell = textwrap.dedent("""\
        import os
        def f(x, *args, y=z, **kw):
            global w
            w = 10
            return [x for x in args] + [k, y]
        class C:
            y = 30
            t = y + 1
        def outer():
            n = 1
            def inner():
                nonlocal n
                n += 1
                return n
            return inner
        gone = 1
        del gone
        total = sum(i * i for i in range(4))
        print(os.sep, f(1, 2), C.t, outer()(), w, total)
        """)
    cap = capture(cell, shell)
    assert cap.by_cell == {1: ["z", "k"]}
    assert cap.script.startswith("# captured") and "z = 3" in cap.script and "k = 5" in cap.script
    assert run_script(cap, tmp_path) == kernel_output(shell, cell)


@pytest.mark.parametrize("source, binds, eager, late", [
    ("x = x + 1", ["x"], ["x"], []),
    # A class body runs now and sees its own names; its comprehensions and methods do not.
    ("class C:\n    a = A\n    b = a + B\n    c = [a for _ in R]\n    def m(self):\n        return a + G",
     ["C"], ["A", "B", "R", "a"], ["a", "G"]),
    ("def f():\n    y = 1\n    def g():\n        return y + Z\n    return g", ["f"], [], ["Z"]),
    ("def f(p, q=D) -> T:\n    global Q\n    Q = p\n    return W", ["f"], ["D", "T"], ["W"]),
    ("for i in I:\n    pass\nprint(i)", ["i"], ["I", "print"], []),
    ("f = lambda v, w=W: v + U", ["f"], ["W"], ["U"]),
    ("import a.b as d, e.f\nfrom g import h as i, j", ["d", "e", "i", "j"], [], []),
])
def test_scope_analysis(source, binds, eager, late):
    import ast

    from jupyter_dlc.magics.scope import analyze

    names = analyze(ast.parse(source))
    assert (names.binds, names.eager, names.late) == (binds, eager, late)


def test_side_effect_cell_is_refused_until_included(shell, tmp_path):
    run(shell, "import random")  # [1]
    run(shell, """\
        random.seed(4)
        counter = 0
        for i in range(5):
            counter += random.randint(0, 9)
        print("trained", counter)
        """)  # [2]
    with pytest.raises(CaptureError) as err:
        capture("print(counter)\n", shell)
    assert str(err.value) == ("name 'counter' is bound in cell [2] to a computed value (int), which "
                              "is not captured as code; use --push counter, or define it inside the cell")
    assert (err.value.name, err.value.cell) == ("counter", 2)

    cap = capture("print(counter)\n", shell, include_cells=[2])
    assert cap.summary == "captured random from [1]; included cell [2]"
    assert cap.by_cell == {1: ["random"], 2: []}
    assert "# from cell [2] (--include-cell)" in cap.script and "import random" in cap.script
    expected = kernel_output(shell, "print(counter)")
    out = run_script(cap, tmp_path)
    assert out == f"trained {expected.strip()}\n" + expected  # the cell was re-run, then the cell

    with pytest.raises(CaptureError, match=r"--include-cell 9: no executed cell \[9\]"):
        capture("print(counter)\n", shell, include_cells=[9])


def test_pushed_tensor_module_and_notebook_object(shell, tmp_path):
    run(shell, "import torch")  # [1]
    run(shell, """\
        class Point:
            def __init__(self, v):
                self.v = v
        """)  # [2]
    run(shell, """\
        gen = torch.Generator().manual_seed(1)
        data = torch.randn(5, 3, generator=gen)
        model = torch.nn.Linear(3, 1)
        meta = {"p": Point(7), "tag": "run-1"}
        """)  # [3]: computed values
    cell = "print(model(data).sum().item(), data.sum().item(), meta['p'].v, meta['tag'])\n"
    with pytest.raises(CaptureError, match=r"^name 'model' is bound in cell \[3\] to a computed value "
                                          r"\(torch\.nn\.modules\.linear\.Linear\).*use --push model"):
        capture(cell, shell)

    cap = capture(cell, shell, push=["model", "data", "meta"], staging_dir=str(tmp_path / "stage"))
    assert sorted(cap.files) == ["data.pt", "meta.pkl", "model.pt"]
    assert all(os.path.dirname(p) == str(tmp_path / "stage") for p in cap.files.values())
    # Point is pickled by name, so its definition comes along even though the cell never names it.
    assert cap.summary == "captured Point from [2]; pushed model, data, meta"
    expected = kernel_output(shell, cell)
    assert run_script(cap, tmp_path) == expected
    # An exported bundle run by hand has no DLC_JOB_DIR: files/ beside the script is used.
    (tmp_path / "job").rename(tmp_path / "first")
    (tmp_path / "elsewhere").rmdir()
    assert run_script(cap, tmp_path, job_dir=False) == expected


def test_push_size_limit_is_checked_before_serializing(shell, tmp_path):
    run(shell, "import torch\nbig = torch.zeros(1024, 1024)")  # 4 MiB of float32
    stage = tmp_path / "stage"
    with pytest.raises(CaptureError) as err:
        capture("print(big.shape)\n", shell, push=["big"], size_limit=2**20, staging_dir=str(stage))
    assert str(err.value).startswith("--push big (bound in cell [1]): it is at least 4.0 MiB of data "
                                     "(limit 1.0 MiB)")
    assert "shared storage" in str(err.value)
    assert not stage.exists()  # refused from the tensor's size, before writing anything
    # Plain objects are measured once serialized, and the oversized file is removed.
    run(shell, "blob = list(range(400_000))")
    with pytest.raises(CaptureError, match=r"^--push blob \(bound in cell \[2\]\): it is \d\.\d MiB "
                                           r"serialized \(limit 1\.0 MiB\)"):
        capture("print(len(blob))\n", shell, push=["blob"], size_limit=2**20, staging_dir=str(stage))
    assert list(stage.iterdir()) == []


def test_unsendable_values_are_refused_with_name_and_cell(shell, tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("a\nb\n")
    run(shell, "import threading")  # [1]
    run(shell, f"f = open({str(path)!r})")  # [2]
    run(shell, "g = (line for line in ['a', 'b'])")  # [3]
    run(shell, "lock = threading.Lock()\ndef worker():\n    with lock:\n        return 1")  # [4]

    cases = {
        "print(f.read())": "name 'f' is bound in cell [2] to an open file (io.TextIOWrapper), which "
                           "cannot be sent to the ranks; open it inside the %%dlc cell",
        "print(next(g))": "name 'g' is bound in cell [3] to a generator (generator), which cannot be "
                          "sent to the ranks; create it inside the %%dlc cell",
        "print(worker())": "name 'lock' (used by worker from cell [4]) is bound in cell [4] to a lock "
                           "(_thread.lock), which cannot be sent to the ranks; create it inside the "
                           "%%dlc cell",
    }
    for cell, message in cases.items():
        with pytest.raises(CaptureError) as err:
            capture(cell, shell)
        assert str(err.value) == message
    with pytest.raises(CaptureError, match=r"^--push f \(bound in cell \[2\]\): it is an open file"):
        capture("print(f.read())", shell, push=["f"])
    run(shell, "f.close()")


def test_ipython_only_names_and_invalid_cells(shell):
    run(shell, "%time z = 1")  # [1]: bound inside a magic, not by a plain statement
    with pytest.raises(CaptureError, match=r"^name 'z' is in the kernel but no plain statement"):
        capture("print(z)", shell)
    with pytest.raises(CaptureError, match=r"^name 'display' exists only inside IPython"):
        capture("display(1)", shell)
    with pytest.raises(CaptureError, match=r"^name 'get_ipython' belongs to IPython"):
        capture("get_ipython()", shell)
    with pytest.raises(CaptureError, match=r"^the cell is not valid Python \(line 2"):
        capture("x = 1\n!ls", shell)
    with pytest.raises(CaptureError, match=r"^--push nope: the kernel has no name 'nope'"):
        capture("print(1)", shell, push=["nope"])
    cap = capture("print(undefined_anywhere, len([]))", shell)  # fails in the job as in the kernel
    assert cap.script == "print(undefined_anywhere, len([]))"
    assert cap.summary == "nothing captured: the cell uses nothing from the kernel"


def test_definition_reading_a_computed_value_when_defined(shell):
    run(shell, "import math\nscale = math.sqrt(6.25)")  # [1]: a call → computed
    run(shell, "def f(x, s=scale):\n    return x * s")  # [2]: its default needs scale now
    with pytest.raises(CaptureError) as err:
        capture("print(f(2))", shell)
    assert str(err.value) == ("name 'scale' (used by f from cell [2]) is bound in cell [1] by a "
                              "statement that is not a definition, which is not replayed; use "
                              "--include-cell 1, or define it with a plain statement")
    cap = capture("print(f(2))", shell, include_cells=[1])
    assert cap.summary == "captured f from [2]; included cell [1]"


def test_future_import_in_the_cell_stays_first(shell, tmp_path):
    run(shell, "LIMIT = 3")
    cell = "from __future__ import annotations\ndef g(n: Undefined) -> int:\n    return n\nprint(g(LIMIT))\n"
    cap = capture(cell, shell)
    assert cap.script.startswith("from __future__ import annotations\n")
    assert run_script(cap, tmp_path) == "3\n"


def test_capture_in_a_real_kernel(tmp_path):
    """The same capture inside ipykernel (ZMQ shell, its own compiler and history)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cells = [
        "import torch as th",
        "def helper(t):\n    return t + OFFSET",
        "OFFSET = 5\nlosses = [th.rand(1).item()]",
        "from jupyter_dlc.magics.capture import capture\n"
        "cap = capture('print(helper(th.tensor(1)).item())', get_ipython())\n"
        "print(cap.summary)\nopen('script.py', 'w').write(cap.script)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = nb.cells[-1].outputs
    assert outputs[0]["text"] == "captured helper from [2], OFFSET from [3], torch (as th) from [1]\n"
    proc = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "6\n"
