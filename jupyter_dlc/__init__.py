"""jupyter-dlc: run a notebook cell as a multi-node torchrun job and watch it live.

Kept import-light on purpose: every rank imports this package through the bootstrap, so
nothing here may pull in IPython, tornado or torch at import time.
"""

__version__ = "0.1.0"


def load_ipython_extension(ipython):
    from .magics import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython):
    from .magics import unload_ipython_extension as _unload

    _unload(ipython)
