"""Kept only so that ``kubelet.servicer`` still finds ``memory.release_free_heap``: the
function lives in ``rbln_device_plugin.processtweaks``; delete this module once the
servicer calls ``processtweaks.release_free_heap`` itself."""

from __future__ import annotations

from rbln_device_plugin.processtweaks import release_free_heap

__all__ = ["release_free_heap"]
