"""A simulated Rebellions node for tests, the demo and rehearsals; never in the image.

The daemon runs against it unchanged: only its host-path flags point into the simulated
root. Modules: ``layout`` (node shapes as data, and presets), ``tree`` (where everything
lives on disk, one device written or removed), ``node`` (``SimNode``: build, reopen and
change a node), ``state`` and ``smi_tool`` (the fake ``rbln-smi``), ``kubelet`` (a
kubelet stand-in), ``demo`` and ``cli``.

This module imports nothing heavy: the fake ``rbln-smi`` starts a fresh interpreter on
every call and must stay quick.
"""
