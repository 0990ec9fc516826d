"""When a scan looks at host files again (``model.looks``): the rule on its own, then a
brute-force model of it over random histories."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rbln_device_plugin.model.looks import BACKUP_S, LookSchedule, WatchState


def live_watch() -> WatchState:
    state = WatchState()
    state.set_live(True)
    return state


def test_the_first_scan_looks_and_a_quiet_live_watch_spares_the_next() -> None:
    watch = live_watch()
    looks = LookSchedule(watch)
    assert looks.due(0.0)
    looks.looking(0.0)
    assert not looks.due(5.0)
    assert not looks.due(BACKUP_S - 0.1)


def test_a_reported_change_makes_the_next_scan_look_once() -> None:
    watch = live_watch()
    looks = LookSchedule(watch)
    looks.looking(0.0)
    watch.changed()
    assert looks.due(1.0)
    looks.looking(1.0)
    assert not looks.due(2.0)


def test_a_change_reported_while_looking_makes_the_scan_after_look_again() -> None:
    watch = live_watch()
    looks = LookSchedule(watch)
    looks.looking(0.0)  # the look starts; the event arrives before it ends
    watch.changed()
    assert looks.due(0.5)


def test_without_a_live_watch_every_scan_looks() -> None:
    watch = WatchState()  # inotify unavailable: polling, or not started yet
    looks = LookSchedule(watch)
    for now in (0.0, 5.0, 10.0):
        assert looks.due(now)
        looks.looking(now)
    live = live_watch()
    looks = LookSchedule(live)
    looks.looking(0.0)
    live.set_live(False)  # fell back to polling
    assert looks.due(1.0)


def test_the_backup_look_comes_whatever_the_watches_say() -> None:
    looks = LookSchedule(live_watch())
    looks.looking(0.0)
    assert looks.due(BACKUP_S)
    no_sources = LookSchedule()  # only the backup decides (the rbln-smi lookup)
    no_sources.looking(0.0)
    assert not no_sources.due(BACKUP_S - 1)
    assert no_sources.due(BACKUP_S)


def test_one_watch_more_is_looked_at_at_once_and_a_failed_look_is_repeated() -> None:
    first, second = live_watch(), live_watch()
    looks = LookSchedule(first)
    looks.looking(0.0)
    looks.follow(second)
    assert looks.due(1.0)
    looks.looking(1.0)
    assert not looks.due(2.0)
    second.changed()
    assert looks.due(2.0)
    looks.looking(2.0)
    looks.forget()
    assert looks.due(3.0)


def test_readers_of_one_watch_keep_their_own_news() -> None:
    watch = live_watch()
    a, b = LookSchedule(watch), LookSchedule(watch)
    a.looking(0.0)
    b.looking(0.0)
    watch.changed()
    a.looking(1.0)
    assert not a.due(2.0)
    assert b.due(2.0)


# Each step: ("change", i) | ("live", i, bool) | ("scan", dt) | ("forget",).
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("change"), st.integers(0, 2)),
        st.tuples(st.just("live"), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("scan"), st.floats(0.0, 40.0)),
        st.tuples(st.just("forget")),
    ),
    max_size=60,
)


@given(_steps)
def test_a_look_is_due_exactly_when_something_may_have_changed_unseen(steps: list[tuple]) -> None:
    """The oracle keeps, per watch, whether anything happened since the last look (a
    change, or going live or not live), and the time of the last look."""
    watches = [WatchState() for _ in range(3)]
    looks = LookSchedule(*watches)
    unseen = [True, True, True]  # nothing looked at yet
    last: float | None = None
    now = 0.0
    for step in steps:
        if step[0] == "change":
            watches[step[1]].changed()
            unseen[step[1]] = True
        elif step[0] == "live":
            watches[step[1]].set_live(step[2])
            unseen[step[1]] = True
        elif step[0] == "forget":
            looks.forget()
            last = None
        else:
            now += step[1]
            expected = (
                last is None
                or now - last >= BACKUP_S
                or any(unseen)
                or not all(w.live for w in watches)
            )
            assert looks.due(now) == expected
            if expected:
                looks.looking(now)
                last = now
                unseen = [False, False, False]
