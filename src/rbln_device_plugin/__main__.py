"""``python -m rbln_device_plugin``."""

from rbln_device_plugin.entry import main

raise SystemExit(main())
