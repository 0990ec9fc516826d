"""Bounding text that ends up somewhere small (an error message, a pod event)."""

from __future__ import annotations


def middle_truncate(data: bytes, limit: int) -> str:
    """Strip ``data``, keep its first and last ``limit // 2`` bytes, decode it leniently."""
    data = data.strip()
    if len(data) > limit:
        half = limit // 2
        omitted = len(data) - 2 * half
        data = data[:half] + f" ...[{omitted} bytes omitted]... ".encode() + data[-half:]
    return data.decode("utf-8", errors="replace")
