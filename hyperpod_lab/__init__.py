"""hyperpod-lab: a JupyterLab extension and notebook-to-cluster bridge for resilient PyTorch training.

Entry points: ``%load_ext hyperpod_lab`` (IPython magics), the ``hyperpod-lab`` CLI, the
jupyter-server extension and lab extension, and the in-job runtime ``hyperpod_lab.runtime``.
Importing this package imports neither torch nor Jupyter.
"""

from hyperpod_lab._version import __version__  # noqa: F401  (the version lives in _version.py)


def load_ipython_extension(ipython):
    """``%load_ext hyperpod_lab``: register ``%hyperpod`` / ``%%hyperpod``."""
    from hyperpod_lab.notebook.magics import register

    register(ipython)


def _jupyter_labextension_paths():
    """The prebuilt lab extension, for ``jupyter labextension develop``.

    ``src`` is relative to this package; the build writes the top-level ``labextension/``
    folder of the source tree. Wheels install it as shared data instead.
    """
    return [{"src": "../labextension", "dest": "hyperpod-lab"}]


def _jupyter_server_extension_points():
    return [{"module": "hyperpod_lab"}]


def _load_jupyter_server_extension(server_app):
    """Register the REST/WebSocket API under ``<base_url>hyperpod/`` (``hyperpod_lab.server``)."""
    from hyperpod_lab.server import setup

    setup(server_app)
