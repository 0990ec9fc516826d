"""Pure policy: what the node's devices are, how healthy they are, what the kubelet sees.

``inventory`` turns ``rbln-smi`` records and sysfs facts into devices per resource name
(the PF/VF rules); ``health`` maps driver lifecycle codes to health and keeps the sticky
history; ``devicetable`` is one resource plugin's device set and what changed between
scans; ``cdispec`` says which devices CDI spec files define, by the CDI library's rules.
No I/O, no asyncio, no logging: plain data in, plain data out.
"""
