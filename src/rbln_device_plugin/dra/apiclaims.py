"""ResourceClaims read from the API server (lightkube: docs/dra.md says why this client).

``ApiClaims.get`` answers the claim's JSON as the API server returned it, for the pure
``claims.allocated_devices``; a claim that is gone or unreadable is a ``ClaimProblem``
naming it and the server's reason. Each read is bounded by ``READ_TIMEOUT_S``, well
inside the kubelet's 45 s per call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Protocol

from rbln_device_plugin.dra.claims import ClaimProblem, ClaimRef

READ_TIMEOUT_S: Final = 10.0


class ClaimSource(Protocol):
    """Where the preparer reads claims from (the API server; a test's table)."""

    async def get(self, ref: ClaimRef) -> Mapping[str, Any]: ...


class ApiClaims:
    def __init__(self, client: Any) -> None:
        self.client = client  # a lightkube AsyncClient, shared with the slice publisher

    @classmethod
    def from_kubeconfig(cls, path: Path | None) -> ApiClaims:
        """A client from this kubeconfig, or from the pod's service account when None."""
        from lightkube import AsyncClient, KubeConfig

        config = KubeConfig.from_file(path) if path else KubeConfig.from_service_account()
        return cls(AsyncClient(config))

    async def get(self, ref: ClaimRef) -> Mapping[str, Any]:
        import httpx2
        from lightkube import ApiError
        from lightkube.resources.resource_v1 import ResourceClaim

        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                claim = await self.client.get(ResourceClaim, ref.name, namespace=ref.namespace)
        except ApiError as exc:
            raise ClaimProblem(
                f"reading ResourceClaim {ref} from the API server: {exc.status.code} "
                f"{exc.status.reason}: {exc.status.message}"
            ) from None
        except TimeoutError:
            raise ClaimProblem(
                f"reading ResourceClaim {ref} from the API server: no answer within "
                f"{READ_TIMEOUT_S:g} s"
            ) from None
        except (httpx2.HTTPError, OSError) as exc:  # unreachable, refused, TLS, cut short
            raise ClaimProblem(
                f"reading ResourceClaim {ref} from the API server: {type(exc).__name__}: {exc}"
            ) from None
        answer: Mapping[str, Any] = claim.to_dict()
        return answer

    async def close(self) -> None:
        await self.client.close()
