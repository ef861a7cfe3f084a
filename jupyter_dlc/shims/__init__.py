"""Every private API jupyter-dlc relies on, one module per library it belongs to.

Each module names what it uses and why; tests/test_shims.py fails loudly, naming the shim,
when an installed version moves one of them. Nothing else in the package touches a private
name of torch, Python, Jupyter or bokeh.
"""
