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


def _jupyter_server_extension_points():
    # the handlers live in jupyter_dlc.server, imported only by the Jupyter server
    return [{"module": "jupyter_dlc.server"}]


def _jupyter_labextension_paths():
    # the prebuilt panel (labextension/ built into jupyter_dlc/labextension)
    return [{"src": "labextension", "dest": "jupyter-dlc"}]
