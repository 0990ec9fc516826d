"""Which devices the node's pods hold through the other kubelet API, and which a mode keeps
back across reads (``model.holds``, pure): against a brute-force oracle, and over random
histories in which the holdings only shrink and reads succeed or fail."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rbln_device_plugin.model.holds import (
    ClaimUse,
    ContainerUse,
    Holder,
    Holds,
    PodUse,
    held_through_device_plugin,
    held_through_dra,
)
from rbln_device_plugin.model.resources import RESOURCE_NAMES

DRIVER = "npu.rebellions.ai"
IDS = ("rbln0", "rbln1", "rbln2", "rbln3-0", "rbln3-1", "gpu0")
RESOURCES = (*RESOURCE_NAMES, "nvidia.com/gpu")
DRIVERS = (DRIVER, "gpu.nvidia.com")


def test_device_plugin_devices_of_this_plugins_resources_are_held() -> None:
    pods = [
        PodUse("ml", "train", (
            ContainerUse("main", (("rebellions.ai/npu", ("rbln0", "rbln1")),)),
            ContainerUse("side", (("nvidia.com/gpu", ("rbln2",)),)),  # another vendor's
        )),
        PodUse("ml", "serve", (ContainerUse("c", (("rebellions.ai/npu-vf4", ("rbln3-1",)),)),)),
    ]  # fmt: skip
    held = held_through_device_plugin(pods, RESOURCE_NAMES)
    assert held == {
        "rbln0": {Holder("ml", "train", "main")},
        "rbln1": {Holder("ml", "train", "main")},
        "rbln3-1": {Holder("ml", "serve", "c")},
    }
    assert held_through_dra(pods, DRIVER) == {}


def test_dra_devices_of_this_driver_are_held_whatever_the_pool() -> None:
    claim = ClaimUse("ml", "c0", ((DRIVER, "node-a", "rbln2"), ("gpu.nvidia.com", "n", "g0")))
    pods = [
        PodUse("ml", "p", (ContainerUse("a", claims=(claim,)), ContainerUse("b", claims=(claim,))))
    ]
    assert held_through_dra(pods, DRIVER) == {
        "rbln2": {Holder("ml", "p", "a"), Holder("ml", "p", "b")}
    }
    assert held_through_device_plugin(pods, RESOURCE_NAMES) == {}


containers = st.builds(
    ContainerUse,
    st.sampled_from(("a", "b")),
    st.lists(
        st.tuples(st.sampled_from(RESOURCES), st.lists(st.sampled_from(IDS)).map(tuple)),
        max_size=3,
    ).map(tuple),
    st.lists(
        st.builds(
            ClaimUse,
            st.just("ns"),
            st.sampled_from(("c0", "c1")),
            st.lists(
                st.tuples(st.sampled_from(DRIVERS), st.just("node-a"), st.sampled_from(IDS))
            ).map(tuple),
        ),
        max_size=2,
    ).map(tuple),
)
pod_lists = st.lists(
    st.builds(
        PodUse,
        st.sampled_from(("ns", "other")),
        st.sampled_from(("p0", "p1", "p2")),
        st.lists(containers, max_size=3).map(tuple),
    ),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(pod_lists)
def test_holdings_equal_the_brute_force_oracle(pods: list[PodUse]) -> None:
    for device in IDS:
        dp_oracle = {
            Holder(p.namespace, p.name, c.name)
            for p in pods
            for c in p.containers
            for resource, ids in c.devices
            if resource in RESOURCE_NAMES and device in ids
        }
        dra_oracle = {
            Holder(p.namespace, p.name, c.name)
            for p in pods
            for c in p.containers
            for claim in c.claims
            if (DRIVER, "node-a", device) in claim.devices
        }
        assert held_through_device_plugin(pods, RESOURCE_NAMES).get(device, set()) == dp_oracle
        assert held_through_dra(pods, DRIVER).get(device, set()) == dra_oracle


def test_nothing_read_yet_keeps_back_every_candidate() -> None:
    assert Holds(None).withheld(["rbln0", "rbln1"]) == {"rbln0", "rbln1"}
    assert Holds({"rbln1"}).withheld(["rbln0", "rbln1"]) == {"rbln1"}
    no_candidates = Holds(())
    assert no_candidates.settled and no_candidates.withheld(["rbln0"]) == set()


def test_a_failed_read_keeps_the_last_answer_and_a_read_of_nothing_settles() -> None:
    holds = Holds(None)
    holds.read({"rbln0": frozenset({Holder("ns", "p", "c")})})
    assert holds.withheld(["rbln0", "rbln1"]) == {"rbln0"}
    assert holds.holders("rbln0") == {Holder("ns", "p", "c")}
    holds.read({})
    assert holds.settled and holds.withheld(["rbln0", "rbln1"]) == set()
    holds.read({"rbln1": frozenset({Holder("ns", "q", "c")})})  # never asked once settled
    assert holds.withheld(["rbln1"]) == set()


# One step of a history: the true holdings shrink (a subset of the last), then a read
# of them succeeds (True) or fails (False).
steps = st.lists(st.tuples(st.sets(st.sampled_from(IDS)), st.booleans()), max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.sets(st.sampled_from(IDS)), steps, st.booleans())
def test_a_held_device_is_never_offered_and_a_released_one_is_offered_after_a_read(
    start: set[str], history: list[tuple[set[str], bool]], candidates_known: bool
) -> None:
    truth = set(start)
    holds = Holds(set(start) | {"rbln0"} if candidates_known else None)
    for shrink_to, read_ok in history:
        truth &= shrink_to  # nothing new is handed out the other way
        if read_ok:
            holds.read({d: frozenset({Holder("ns", "p", "c")}) for d in truth})
        kept = holds.withheld(IDS)
        assert truth <= kept  # never offered while held: the safety property
        if read_ok:
            assert kept == truth  # released devices are offered at the next read
