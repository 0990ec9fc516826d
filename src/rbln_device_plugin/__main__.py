"""``python -m rbln_device_plugin``."""

from rbln_device_plugin.cli import main

raise SystemExit(main())
