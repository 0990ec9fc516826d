"""``inspect --preferred``: what the resource plugin would answer a
``GetPreferredAllocation`` now, with the runner-up and the score level that decided."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rbln_device_plugin.inspect.report import Report
from rbln_device_plugin.topology import (
    Candidate,
    Fallback,
    Score,
    candidate_from_device,
    preferred_allocation,
)


@dataclass(frozen=True, slots=True)
class Choice:
    device_ids: tuple[str, ...]  # in the plugin's answer order: must-include first
    score: Score


@dataclass(frozen=True, slots=True)
class PreferredReport:
    resource: str
    size: int
    available: tuple[str, ...]
    must_include: tuple[str, ...]
    winner: Choice | None = None  # None: the plugin would fall back to the kubelet
    runner_up: Choice | None = None  # the best other selection; None when there is none
    # How the plugin answered without the general search: "must-include", "all-available",
    # "one-device", "one-card"; None when it searched.
    shortcut: str | None = None
    fallback: str = ""  # why the plugin would answer an empty list
    runner_up_note: str = ""  # e.g. a sub-search over budget: the runner-up may be inexact

    @property
    def decided_by(self) -> str | None:
        """The first score level at which the winner beats the runner-up."""
        if self.winner is None or self.runner_up is None:
            return None
        for name, mine, theirs in zip(
            Score._fields, self.winner.score, self.runner_up.score, strict=True
        ):
            if mine != theirs:
                return name
        return None


def score_levels(value: Score) -> dict[str, Any]:
    """Every level by name, the ID tie-break included (as a list)."""
    return {
        name: list(level) if isinstance(level, tuple) else level
        for name, level in value._asdict().items()
    }


def explain_preferred(
    report: Report,
    resource: str,
    size: int,
    available: Sequence[str] | None,
    must_include: Sequence[str],
) -> PreferredReport:
    """What the resource plugin would answer now, with the runner-up.

    ``available`` defaults to the resource's Healthy devices: what the kubelet offers
    on a node where nothing is allocated yet.
    """
    table = report.tables.get(resource)
    if table is None:
        offered = ", ".join(sorted(report.tables)) or "none"
        return PreferredReport(
            resource,
            size,
            tuple(available or ()),
            tuple(must_include),
            fallback=f"{resource} is not advertised on this node (advertised: {offered})",
        )
    if available is None:
        available = sorted(name for name, entry in table.items() if entry.healthy)
    request = PreferredReport(resource, size, tuple(available), tuple(must_include))
    candidates = {name: candidate_from_device(entry.device) for name, entry in table.items()}
    try:
        result = preferred_allocation(candidates, available, must_include, size)
    except Fallback as exc:
        return replace(request, fallback=exc.reason)
    except Exception as exc:  # the plugin answers an empty list for these too
        return replace(request, fallback=f"internal error in topology search: {exc!r}")
    winner = Choice(tuple(result.device_ids), result.score)
    runner_up, note = _runner_up(candidates, available, must_include, size, winner)
    if result.capped is not None:
        note = (
            f"the search reached its safety cap ({result.capped} steps): the answer is "
            "complete but may not be the best" + (f"; {note}" if note else "")
        )
    return replace(
        request,
        winner=winner,
        runner_up=runner_up,
        shortcut=result.shortcut,
        runner_up_note=note,
    )


def _runner_up(
    candidates: Mapping[str, Candidate],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    winner: Choice,
) -> tuple[Choice | None, str]:
    """The best selection other than the winner.

    Any other selection leaves out at least one of the winner's non-mandatory devices,
    so the best of "the winner's request without device d", over every such d, is the
    runner-up.
    """
    mandatory = set(must_include)
    best: Choice | None = None
    note = ""
    for left_out in winner.device_ids:
        if left_out in mandatory:
            continue
        rest = [device for device in available if device != left_out]
        if size > len(set(rest)):
            continue  # no selection of this size without that device
        try:
            other = preferred_allocation(candidates, rest, must_include, size)
        except Fallback as exc:
            note = f"a runner-up search was cut short ({exc.reason}); it may not be the best"
            continue
        if best is None or other.score < best.score:
            best = Choice(tuple(other.device_ids), other.score)
    return best, note
