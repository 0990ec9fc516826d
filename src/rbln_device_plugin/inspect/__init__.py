"""``rbln-device-plugin inspect``: one read-only pass over the node, explained.

``command`` parses the daemon's options plus its own and gathers the host facts
(``facts``); ``report`` runs them through the daemon's own scan pipeline and explains
each device (pure); ``preferredreport`` explains a GetPreferredAllocation answer; ``render``
prints the table or the JSON document that ``report.schema.json`` describes.
"""
