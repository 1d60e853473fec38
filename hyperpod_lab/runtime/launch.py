"""Shim: ``python -m hyperpod_lab.runtime.launch`` runs :mod:`hyperpod_lab.node.launch`.

Kept only because command lines rendered by hyperpod-lab 0.1 before the node/ layout (a batch
script requeued after an upgrade of the cluster's hyperpod-lab) name this module.
"""

if __name__ == "__main__":
    import runpy

    runpy.run_module("hyperpod_lab.node.launch", run_name="__main__", alter_sys=True)
