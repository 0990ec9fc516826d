"""``python -m rbln_device_plugin_sim``: the same as ``rbln-device-plugin-sim``."""

import sys

from rbln_device_plugin_sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
