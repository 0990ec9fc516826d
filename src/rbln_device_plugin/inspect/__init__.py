"""``rbln-device-plugin inspect``: one read-only pass over the node, explained.

``command`` parses the daemon's options plus its own and gathers the host facts;
``report`` runs them through the daemon's policy and explains each device (pure);
``render`` prints the table or the JSON document that ``report.schema.json`` describes.
"""
