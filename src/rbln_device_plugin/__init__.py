"""Kubernetes device plugin for Rebellions NPUs."""

try:
    # Written at build time (see pyproject.toml): no importlib.metadata at run time.
    from rbln_device_plugin._version import __version__ as __version__
except ImportError:  # a source tree that was never built or installed
    __version__ = "0.0.0+unknown"
