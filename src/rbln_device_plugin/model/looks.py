"""When a scan must look at host files again, and when a directory watch already says.

A scan looks at a few host files every time only to find what rarely happens: the
instance lock's file deleted, a plugin socket replaced, a CDI spec rewritten. Each of
those lives in a directory the daemon watches with inotify, and a watch that is live
reports every change the moment it happens. So a look is due when:

- a directory it depends on is not watched live (no inotify there, or the watch is
  being set up again): every scan looks, as without any watch;
- the watch reported a change since this reader last looked (events that arrive while
  it looks make the next scan look again);
- ``BACKUP_S`` passed since it last looked: a change no event shows (a file system
  mounted over the directory after the watch began, a symlink's target elsewhere)
  is still found, only later.

Plain state and arithmetic on the times given: the watches and the clock are the
caller's.
"""

from __future__ import annotations

from typing import Final

# At the default 5 s interval, every twelfth scan looks although nothing was reported.
BACKUP_S: Final = 60.0


class WatchState:
    """What one directory watch tells its readers: whether it is live, and how many
    changes it has reported (a count, so that each reader tells news for itself)."""

    __slots__ = ("changes", "live")

    def __init__(self) -> None:
        self.live = False
        self.changes = 0

    def set_live(self, live: bool) -> None:
        """The watch (re)started or fell back to polling; either way something may have
        changed unseen meanwhile."""
        self.live = live
        self.changes += 1

    def changed(self) -> None:
        self.changes += 1


class LookSchedule:
    """One reader's view of the watches it depends on (none: a look every ``backup_s``)."""

    __slots__ = ("_backup_s", "_last", "_seen", "_sources")

    def __init__(self, *sources: WatchState, backup_s: float | None = None) -> None:
        self._sources = list(sources)
        self._backup_s = BACKUP_S if backup_s is None else backup_s
        self._seen: list[int] | None = None  # the counts at the last look; None: never looked
        self._last = 0.0

    def follow(self, source: WatchState) -> None:
        """Depend on one more watch from now on (looked at the next time)."""
        self._sources.append(source)
        self._seen = None

    def due(self, now: float) -> bool:
        seen = self._seen
        if seen is None or now - self._last >= self._backup_s:
            return True
        return any(
            not source.live or source.changes != count
            for source, count in zip(self._sources, seen, strict=True)
        )

    def looking(self, now: float) -> None:
        """A look starts now: what was reported so far is being seen."""
        self._seen = [source.changes for source in self._sources]
        self._last = now

    def forget(self) -> None:
        """The last look proved nothing (it failed or stalled): look again next time."""
        self._seen = None
