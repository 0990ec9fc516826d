"""A simulated Rebellions node for tests, the demo and rehearsals.

The daemon runs against it unchanged: only its host-path flags point into the simulated
root. Submodules: ``layout`` (node layouts as data and presets), ``materialize`` (the
tree on disk, ``SimNode``), ``state`` and ``smi_tool`` (the fake ``rbln-smi``),
``kubelet`` (a kubelet stand-in), ``demo`` and ``cli``.

This module imports nothing heavy: the fake ``rbln-smi`` starts a fresh interpreter on
every call and must stay quick.
"""
