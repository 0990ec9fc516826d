"""Everything that reads or changes the node, behind bounded, off-loop calls.

``sysfs`` (status, PCI path, SR-IOV files), ``proc`` (a bounded subprocess run),
``smi`` (find and run ``rbln-smi``, the one parser of its JSON), ``rsd`` (RSD groups
under the node-wide lock), ``devnodes`` (waiting for /dev nodes), ``scan`` (one
inventory pass: rbln-smi, sysfs facts, ``model.inventory``), ``hostio`` (the thread
runner that bounds every blocking call), ``cdidirs`` (the CDI spec directories, looked
at again only where they changed) and ``cdientry`` (one entry of them, its type known
before anything opens it), ``inotify`` and ``paths`` (file modes and identities).
"""
