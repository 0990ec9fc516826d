"""Generated CDI spec files for the property tests against the CDI library: spec-shaped
documents with the variations that decide a verdict (versions and the features each needs,
wrong types, nulls, unknown and capitalised fields at every level, duplicate keys,
aliases), written as block YAML, flow YAML or JSON.

A document is built from ``Pairs`` (a mapping that may hold a key twice), lists, and two
kinds of scalar: ``Plain`` text written as it is (``236``, ``yes``, ``0x1F``, ``~``) and
``Quoted`` text written double-quoted. The same document can be written in each style.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st


@dataclass(frozen=True)
class Plain:
    text: str


@dataclass(frozen=True)
class Quoted:
    text: str


class Pairs(list[tuple[str, Any]]):
    """A mapping as written: keys in order, a key possibly twice."""


Scalar = Plain | Quoted


# ---------------------------------------------------------------- writing
def _scalar(value: Scalar) -> str:
    if isinstance(value, Plain):
        return value.text
    return json.dumps(value.text)


def _key(key: str) -> str:
    return key if key and key.isascii() and key.replace("_", "").isalnum() else json.dumps(key)


def flow(value: Any) -> str:
    """Flow YAML; JSON when every plain scalar is a JSON literal."""
    if isinstance(value, Pairs):
        return "{" + ", ".join(f"{json.dumps(k)}: {flow(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(flow(item) for item in value) + "]"
    return _scalar(value)


def block(value: Any, indent: int = 0) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, Pairs):
        for key, item in value:
            if isinstance(item, Pairs | list) and item:
                lines.append(f"{pad}{_key(key)}:")
                lines.extend(block(item, indent + 2))
            else:
                lines.append(f"{pad}{_key(key)}: {flow(item)}")
        return lines
    if isinstance(value, list):
        for item in value:
            if isinstance(item, Pairs | list) and item:
                lines.append(f"{pad}-")
                lines.extend(block(item, indent + 2))
            else:
                lines.append(f"{pad}- {flow(item)}")
        return lines
    return [pad + _scalar(value)]


@dataclass(frozen=True)
class SpecFileText:
    name: str  # a.yaml or a.json
    data: bytes
    newer: bool  # declares a cdiVersion newer than the library knows


def render(doc: Any, style: str, tail: str) -> bytes:
    if style == "block" and isinstance(doc, Pairs) and doc:
        text = "\n".join(block(doc)) + "\n"
    else:
        text = flow(doc) + "\n"
    return (text + tail).encode()


# ---------------------------------------------------------------- generating
# Three kinds of file: clean (every choice a good value: usable unless the version is
# too old for a feature), clean with one mutation at a random place (so each variation is
# tried against a file that would otherwise be usable), and noisy (a bad value one time
# in ten at every choice).
GOOD_VERSIONS = ["1.1.0"] * 8 + ["0.3.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "v1.0.0"]
BAD_VERSIONS = ["0.1.0", "0.2.0", "0.9.0", "1.2.0", "2.0.0", "0.5", "1.1", "", "1"]
NEWER = {"1.2.0", "2.0.0"}
ODD_NUMBERS = ["-1", "1.5", "-0.5", "1e3", "0x1F", "0o17", "017", "1_000", "4294967295",
               "4294967296", "9223372036854775807", "9223372036854775808", ".inf", ".nan",
               "true", "yes", "~", "2001-01-01", "+5", "0b101", "08", "1.0", "-.inf"]  # fmt: skip
ODD_SCALARS = [*(Plain(t) for t in ODD_NUMBERS), *(Quoted(t) for t in ODD_NUMBERS[:8]),
               Plain("a"), Plain("x=1"), Plain("yes"), Quoted(""), Plain("~")]  # fmt: skip
NULL = st.sampled_from([Plain("~"), Plain("null"), Plain("")])


def _plain_ok(t: str) -> bool:
    return bool(t) and not any(c in t for c in ":#{}[],&*!|>'\"%@`") and t == t.strip()


def _scalars(values: list[str]) -> list[Scalar]:
    out: list[Scalar] = []
    for t in values:
        out.append(Quoted(t))
        if _plain_ok(t):
            out.append(Plain(t))
    return out


def _build(noisy: bool) -> st.SearchStrategy[Pairs]:
    """The spec strategy; ``noisy`` lets every choice be a bad one now and then."""

    def sometimes(good: list[Any], bad: list[Any]) -> st.SearchStrategy[Any]:
        # sampled_from draws evenly (integers() favours their bounds), shrinks to good[0].
        if not noisy or not bad:
            return st.sampled_from(good)
        return st.sampled_from(good * max(1, 9 * len(bad) // len(good)) + bad)

    def text(good: list[str], bad: list[str] | None = None) -> st.SearchStrategy[Scalar]:
        return sometimes(_scalars(good), _scalars(bad or []))

    def number(good: list[str]) -> st.SearchStrategy[Scalar]:
        return sometimes([Plain(t) for t in good], ODD_SCALARS[:31])

    def null_or(strategy: st.SearchStrategy[Any], weight: int = 30) -> st.SearchStrategy[Any]:
        return sometimes([False], [False] * (weight - 1) + [True]).flatmap(
            lambda null: NULL if null else strategy
        )

    def mapping(
        required: list[tuple[str, st.SearchStrategy[Any]]],
        optional: list[tuple[str, st.SearchStrategy[Any]]],
    ) -> st.SearchStrategy[Pairs]:
        @st.composite
        def build(draw: st.DrawFn) -> Pairs:
            pairs = [(name, draw(value)) for name, value in required]
            for name, value in optional:
                if draw(st.sampled_from([False, False, True])):
                    pairs.append((name, draw(value)))
            pairs = draw(st.permutations(pairs))
            twist = draw(sometimes(["none"], ["none"] * 36 + ["bogus", "capital", "twice", "null"]))
            _twist(pairs, twist, draw)
            return Pairs(pairs)

        return build()

    def listing(item: st.SearchStrategy[Any], least: int = 0, most: int = 3) -> Any:
        items = st.lists(null_or(item), min_size=least, max_size=most)
        return sometimes([False], [False] * 29 + [True]).flatmap(
            lambda odd: st.sampled_from(ODD_SCALARS) if odd else items
        )

    env = text(["A=1", "PATH=/x", "B=", "C=x=y"], ["=x", "NOEQUALS", ""])
    device_node = mapping(
        [("path", text(["/dev/rbln0", "/dev/x", "5"], [""]))],
        [("hostPath", text(["/dev/rbln0", ""])), ("type", text(["c", "b", "u", "p", ""], ["x"])),
         ("major", number(["0", "236"])), ("minor", number(["0", "1"])),
         ("fileMode", number(["0666", "438", "0o644"])),
         ("permissions", text(["rw", "rwm", "none", "", "r"], ["rwx", "x"])),
         ("uid", number(["0", "1000"])), ("gid", number(["0", "44"]))],
    )  # fmt: skip
    mount = mapping(
        [("hostPath", text(["/a"], [""])), ("containerPath", text(["/b"], [""]))],
        [("options", listing(text(["ro", "bind"]))), ("type", text(["bind", ""]))],
    )
    hook = mapping(
        [("hookName", text(["prestart", "createContainer", "poststop"], ["later", ""])),
         ("path", text(["/bin/x"], [""]))],
        [("args", listing(text(["a", "--x"]))), ("env", listing(env)),
         ("timeout", number(["5", "0"]))],
    )  # fmt: skip
    intel_rdt = mapping(
        [],
        [("closID", text(["a", "/", "clos-1"], [".", "..", "a/b"])),
         ("l3CacheSchema", text(["L3:0=f"])), ("memBwSchema", text(["MB:0=50"])),
         ("schemata", listing(text(["L3:0=f"]))),
         ("enableMonitoring", sometimes([Plain("false"), Plain("true")],
                                        _scalars(["yes", "off", "1", "on", "true"])))],
    )  # fmt: skip
    net_device = mapping(
        [("hostInterfaceName", text(["eth0", "eth1"], [""])),
         ("name", text(["net0", "net1"], [""]))],
        [],
    )  # fmt: skip
    edits = mapping(
        [],
        [("env", listing(env)), ("deviceNodes", listing(device_node)),
         ("mounts", listing(mount)), ("hooks", listing(hook)),
         ("intelRdt", null_or(intel_rdt, 10)),
         ("additionalGids", listing(number(["0", "44", "1000"]))),
         ("netDevices", listing(net_device, most=2))],
    )  # fmt: skip
    annotations = st.lists(
        st.tuples(st.sampled_from(["a", "b", "x.io/k"]), text(["v", "1", ""])), max_size=2,
        unique_by=lambda pair: pair[0] if not noisy else id(pair),
    ).map(Pairs)  # fmt: skip
    device = mapping(
        [("name", text(["runtime", "r1", "0gpu", "a:b", "gpu.0"], ["-x", "", "a/b"])),
         ("containerEdits", null_or(edits))],
        [("annotations", annotations)],
    )  # fmt: skip
    return mapping(
        [("cdiVersion", text(GOOD_VERSIONS, BAD_VERSIONS)),
         ("kind", text(["rebellions.ai/npu", "vendor.com/class.x", "a/b"],
                       ["npu", "a/b/c", "9v/c"])),
         ("devices", listing(device, least=1, most=3))],
        [("containerEdits", edits), ("annotations", annotations)],
    )  # fmt: skip


def _twist(pairs: list[tuple[str, Any]], twist: str, draw: st.DrawFn) -> None:
    if twist == "bogus":
        pairs.append(("bogus", draw(st.sampled_from(ODD_SCALARS))))
    elif twist == "capital" and pairs:
        key, value = pairs[0]
        pairs[0] = (key[:1].upper() + key[1:], value)
    elif twist == "twice" and pairs:
        pairs.append(draw(st.sampled_from(pairs)))
    elif twist == "null" and pairs:
        key, _ = pairs[-1]
        pairs[-1] = (key, draw(NULL))


CLEAN = _build(noisy=False)
NOISY = _build(noisy=True)
MUTATIONS = ["odd", "null", "bogus", "capital", "twice", "drop", "empty-list", "empty-map",
             "listed"]  # fmt: skip


def _places(value: Any, out: list[tuple[Any, int]]) -> list[tuple[Any, int]]:
    """Every (container, index) of the document, the top-level mapping's entries too."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            out.append((value, index))
            _places(item[1] if isinstance(value, Pairs) else item, out)
    return out


@st.composite
def mutated(draw: st.DrawFn) -> Pairs:
    """A clean document changed in one place."""
    doc = draw(CLEAN)
    places = _places(doc, [])
    container, index = draw(st.sampled_from(places))
    kind = draw(st.sampled_from(MUTATIONS))
    if isinstance(container, Pairs):
        key, value = container[index]
        if kind in ("bogus", "capital", "twice"):
            _twist(container, kind, draw) if kind != "capital" else container.__setitem__(
                index, (key[:1].upper() + key[1:], value)
            )
        elif kind == "drop":
            del container[index]
        else:
            container[index] = (key, _replacement(kind, value, draw))
    else:
        container[index] = _replacement(kind, container[index], draw)
    return doc


def _replacement(kind: str, value: Any, draw: st.DrawFn) -> Any:
    if kind == "null":
        return draw(NULL)
    if kind == "empty-list":
        return []
    if kind == "empty-map":
        return Pairs()
    if kind == "listed":
        return [value]
    return draw(st.sampled_from(ODD_SCALARS))


@st.composite
def spec_files(draw: st.DrawFn) -> SpecFileText:
    doc = draw(st.one_of(CLEAN, mutated(), mutated(), NOISY))
    style = draw(st.sampled_from(["block", "block", "flow"]))
    json_name = style == "flow" and draw(st.booleans())
    tail = "" if json_name else draw(st.sampled_from(TAILS))
    data = render(doc, style, tail)
    newer = any(
        key == "cdiVersion" and isinstance(v, Plain | Quoted) and v.text in NEWER for key, v in doc
    )
    return SpecFileText("a.json" if json_name else "a.yaml", data, newer)


TAILS = [""] * 20 + ["---\nfoo: bar\n", "---\n]]]\n", "...\n", "# comment\n", "---\n\t- x\n",
                     "--- |\n  text\n", "---\n\"open\n"]  # fmt: skip


# Edge cases of go-yaml and the library, each checked against the library (found by
# hand while porting decode.go and resolve.go): nulls, number forms, tags, aliases and
# merge keys, encodings, documents after the first.
_H = 'cdiVersion: "0.7.0"\nkind: rebellions.ai/npu\n'
_H11 = 'cdiVersion: "1.1.0"\nkind: rebellions.ai/npu\n'
_H05 = 'cdiVersion: "0.5.0"\nkind: rebellions.ai/npu\n'
_DEV = "devices:\n- name: runtime\n  containerEdits:\n    deviceNodes:\n    - path: /dev/rbln0\n"
HEAD = 'cdiVersion: "{v}"\nkind: rebellions.ai/npu\n'
EDGE_CASES: dict[str, str | bytes | tuple[str, str]] = {
    "multidoc-bad-after": _H + _DEV + "---\n\tfoo: [",
    "multidoc-bad-at": _H + _DEV + "--- @foo\n",
    "multidoc-tabs": _H + _DEV + "--- !\n\t",
    "null-device": _H + _DEV + "- null\n",
    "null-env": _H + _DEV + "    env: [null, 'A=1']\n",
    "null-devnode": _H + _DEV + "    - null\n",
    "null-key": _H + "~: [1, 2]\n" + _DEV,
    "null-key-dup": _H + "~: [1, 2]\nnull: 3\n" + _DEV,
    "name-hex": _H + _DEV.replace("runtime", "0x1F"),
    "name-true": _H + _DEV.replace("runtime", "true"),
    "name-float": _H + _DEV.replace("runtime", "1.50"),
    "name-null": _H + _DEV.replace("runtime", "null"),
    "gid-float": _H + _DEV + "    additionalGids: [1.5]\n",
    "gid-big": _H + _DEV + "    additionalGids: [4294967296]\n",
    "gid-octal": _H + _DEV + "    additionalGids: [0o17, 017, 0x1f, 1_0, +5, -0]\n",
    "gid-str": _H + _DEV + "    additionalGids: ['5']\n",
    "gid-bool": _H + _DEV + "    additionalGids: [true]\n",
    "gid-inf": _H + _DEV + "    additionalGids: [.inf]\n",
    "gid-nan": _H + _DEV + "    additionalGids: [.nan]\n",
    "gid-neg-float": _H + _DEV + "    additionalGids: [-0.5]\n",
    "gid-1e3": _H + _DEV + "    additionalGids: [1e3]\n",
    "gid-0b": _H + _DEV + "    additionalGids: [0b101]\n",
    "major-uint64": _H + _DEV + "      major: 9223372036854775808\n",
    "major-max": _H + _DEV + "      major: 9223372036854775807\n",
    "major-float-big": _H + _DEV + "      major: 9.3e18\n",
    "major-float-max": _H + _DEV + "      major: 9223372036854775807.0\n",
    "major-ts": _H + _DEV + "      major: 2001-01-01\n",
    "major-neg-float": _H + _DEV + "      major: -1.9\n",
    "major-null": _H + _DEV + "      major: ~\n",
    "major-tag-float": _H + _DEV + "      major: !!float 1\n",
    "major-tag-int-float": _H + _DEV + "      major: !!int 1.5\n",
    "major-tag-str": _H + _DEV + "      major: !!str 1\n",
    "major-custom-tag": _H + _DEV + "      major: !foo 1\n",
    "path-custom-tag": _H + _DEV.replace("path: /dev/rbln0", "path: !foo /dev/rbln0"),
    "path-int": _H + _DEV.replace("path: /dev/rbln0", "path: 5"),
    "path-binary": _H + _DEV.replace("path: /dev/rbln0", "path: !!binary L2Rldi94"),
    "path-badbinary": _H + _DEV.replace("path: /dev/rbln0", "path: !!binary L2Rldi94="),
    "path-seq": _H + _DEV.replace("path: /dev/rbln0", "path: [a]"),
    "path-null-tag": _H + _DEV.replace("path: /dev/rbln0", "path: !!null x"),
    "path-bool-tag": _H + _DEV.replace("path: /dev/rbln0", "path: !!bool yes"),
    "timeout-float": _H
    + _DEV
    + "    hooks:\n    - hookName: prestart\n      path: /x\n      timeout: 1.5\n",
    "monitor-yes": HEAD.format(v="1.1.0") + _DEV + "    intelRdt: {enableMonitoring: yes}\n",
    "monitor-qtrue": HEAD.format(v="1.1.0") + _DEV + "    intelRdt: {enableMonitoring: 'true'}\n",
    "monitor-qyes": HEAD.format(v="1.1.0") + _DEV + "    intelRdt: {enableMonitoring: 'yes'}\n",
    "monitor-1": HEAD.format(v="1.1.0") + _DEV + "    intelRdt: {enableMonitoring: 1}\n",
    "monitor-on-070": _H + _DEV + "    intelRdt: {enableMonitoring: on}\n",
    "monitor-off-070": _H + _DEV + "    intelRdt: {enableMonitoring: off}\n",
    "schemata-empty-070": _H + _DEV + "    intelRdt: {schemata: []}\n",
    "schemata-null-070": _H + _DEV + "    intelRdt: {schemata: ~}\n",
    "rdt-only": _H + "devices:\n- name: r\n  containerEdits:\n    intelRdt: {}\n",
    "rdt-null-only": _H + "devices:\n- name: r\n  containerEdits:\n    intelRdt: ~\n",
    "rdt-only-060": HEAD.format(v="0.6.0")
    + "devices:\n- name: r\n  containerEdits:\n    intelRdt: {}\n",
    "closid-dot": _H + _DEV + "    intelRdt: {closID: '..'}\n",
    "closid-slash": _H + _DEV + "    intelRdt: {closID: '/'}\n",
    "closid-a/b": _H + _DEV + "    intelRdt: {closID: 'a/b'}\n",
    "netdev-100": HEAD.format(v="1.0.0")
    + _DEV
    + "    netDevices: [{hostInterfaceName: eth0, name: eth1}]\n",
    "netdev-empty-070": _H + _DEV + "    netDevices: []\n",
    "vnum": HEAD.format(v="v1.0.0") + _DEV,
    "ver-int": "cdiVersion: 1\nkind: a/b\n" + _DEV,
    "ann-null-key": HEAD.format(v="0.5.0") + "annotations: {~: x}\n" + _DEV,
    "ann-null-val": HEAD.format(v="0.5.0") + "annotations: {x: ~}\n" + _DEV,
    "ann-empty": HEAD.format(v="0.5.0") + "annotations: {}\n" + _DEV,
    "ann-seq-val": _H + "annotations: {x: [1]}\n" + _DEV,
    "ann-int-val": _H + "annotations: {x: 1}\n" + _DEV,
    "ann-dup": _H + "annotations: {x: 1, 'x': 2}\n" + _DEV,
    "ann-dup-int": _H + "annotations: {1: 1, '1': 2}\n" + _DEV,
    "merge": _H + "base: &b {env: ['A=1']}\n" + _DEV,
    "merge2": _H + _DEV + "    <<: {env: ['A=1']}\n",
    "merge3": _H + "devices:\n- name: r\n  containerEdits:\n    <<: {env: ['A=1']}\n",
    "merge-unknown": _H
    + "devices:\n- name: r\n  containerEdits:\n    <<: {env: ['A=1'], bogus: 1}\n",
    "merge-seq": _H
    + "devices:\n- name: r\n  containerEdits:\n    <<: [{env: ['A=1']},"
    + " {mounts: [{hostPath: /a, containerPath: /b}]}]\n",
    "merge-bad": _H + "devices:\n- name: r\n  containerEdits:\n    <<: 5\n",
    "alias-env": _H
    + "devices:\n- name: r\n  containerEdits:\n    env: &e ['A=1']\n"
    + "- name: s\n  containerEdits:\n    env: *e\n",
    "alias-self": _H + "devices: &d\n- name: r\n  containerEdits:\n    env: *d\n",
    "alias-unknown": _H + "devices:\n- name: r\n  containerEdits:\n    env: *nope\n",
    "anchor-redef": _H + "x: &a 1\n" + _DEV,
    "empty": "",
    "comment-only": "# hi\n",
    "null-doc": "null\n",
    "doc-seq": "[]\n",
    "doc-str": "foo\n",
    "bom": b"\xef\xbb\xbf" + (_H + _DEV).encode(),
    "utf16": "\ufeff".encode("utf-16-le") + (_H + _DEV).encode("utf-16-le"),
    "latin1": (_H + _DEV + "    env: ['A=\xe9']\n").encode("latin-1"),
    "kind-3parts": HEAD.format(v="0.7.0").replace("rebellions.ai/npu", "a/b/c") + _DEV,
    "kind-cap": HEAD.format(v="0.7.0").replace("rebellions.ai/npu", "A/B") + _DEV,
    "perm-none": _H + _DEV + "      permissions: none\n",
    "perm-": _H + _DEV + "      permissions: 'rwrw'\n",
    "type-u": _H + _DEV + "      type: u\n",
    "devnode-emptypath": _H + _DEV.replace("/dev/rbln0", "''"),
    "explicit-key": _H + "? devices\n: - name: r\n    containerEdits: {env: ['A=1']}\n",
    "complex-key": _H + "? [a]\n: 1\n" + _DEV,
    "key-int": _H + "5: 1\n" + _DEV,
    "json-yaml": (_H + _DEV, "a.json"),
    "doc-end-then-junk": _H + _DEV + "...\n]]]\n",
    "empty-edits-spec": _H + "containerEdits: {}\n" + _DEV,
    "devices-null": _H + "devices: ~\n",
    "device-ce-null": _H + "devices:\n- name: r\n  containerEdits: ~\n",
}


# JSON text read with json only when go-yaml reads it alike; escapes libyaml and go-yaml
# treat differently; what go-yaml's scanner reads past the first document; nesting depth.
_J = (
    '{"cdiVersion": "0.5.0", "kind": "rebellions.ai/npu", "devices": [{"name": "runtime", '
    '"containerEdits": {"env": ["A=%s"]}}]}'
)
J = _J
_J5 = '{"cdiVersion": "0.5.0", "kind": "rebellions.ai/npu", "devices": '
_J6 = _J5.replace("0.5.0", "0.6.0")
EDGE_CASES.update(
    {
        "json-del": (J % "x\x7fy", "a.json"),
        "json-ls": (J % "x\u2028y", "a.json"),
        "json-nel": (J % "x\x85y", "a.json"),
        "json-surrogates": (J % "\\ud83d\\ude00", "a.json"),
        "json-lone-surrogate": (J % "\\ud83d", "a.json"),
        "json-tab-lead": ("\t" + J % "x", "a.json"),
        "json-tab-trail": (J % "x" + "\n\t\n", "a.json"),
        "json-tab-inside": (J.replace(", ", ",\t") % "x", "a.json"),
        "json-long-key": (
            _J6
            + '[{"name": "runtime", "annotations": {"'
            + "k" * 1100
            + '": "v"}, "containerEdits": {"env": ["A=1"]}}]}',
            "a.json",
        ),
        "json-key-1020": (
            _J6
            + '[{"name": "runtime", "annotations": {"'
            + "k" * 1020
            + '": "v"}, "containerEdits": {"env": ["A=1"]}}]}',
            "a.json",
        ),
        "json-escapes": (J % '\\b\\f\\n\\r\\t\\"\\\\\\u00e9', "a.json"),
        "json-nan": (
            _J5 + '[{"name": NaN, "containerEdits": {"env": ["A=1"]}}]}',
            "a.json",
        ),
        "json-bignum": (
            _J5
            + '[{"name": "r", "containerEdits": {"deviceNodes": '
            + '[{"path": "/x", "major": 1e400}]}}]}',
            "a.json",
        ),
        "json-float-major": (
            _J5 + '[{"name": "r", "containerEdits": {"deviceNodes": '
            '[{"path": "/x", "major": 2.5, "fileMode": 438}]}}]}',
            "a.json",
        ),
        "json-bom": (b"\xef\xbb\xbf" + (J % "x").encode(), "a.json"),
        "json-crlf": ((J % "x").replace(", ", ",\r\n"), "a.json"),
        "json-dup-slash": (
            _J5.replace("ai/npu", "ai\\/npu") + '[{"name": "runtime", "containerEdits": '
            '{"env": ["A=1"]}}]}',
            "a.json",
        ),
        "yaml-squote-escape": _H + 'devices:\n- name: r\n  containerEdits:\n    env: ["A=\\\'x"]\n',
        "yaml-slash-escape": _H + 'devices:\n- name: r\n  containerEdits:\n    env: ["A=\\/x"]\n',
        "yaml-slash-in-plain": _H + "devices:\n- name: r\n  containerEdits:\n    env: [A=\\/x]\n",
        "yaml-slash-in-single": _H
        + "devices:\n- name: r\n  containerEdits:\n    env: ['A=\\/x']\n",
        "after-doc-open-quote": _H + _DEV + '---\n"open\n',
        "after-doc-3rd-token-bad": _H + _DEV + '---\na: b\n"open\n',
        "after-doc-2nd-token-bad": _H + _DEV + '---\na\n"open\n',
        "after-end-bad": _H + _DEV + '...\n"open\n',
        "deep-flow": _H + "x: " + "[" * 10001 + "]" * 10001 + "\n" + _DEV,
        "deep-flow-null-key": _H + "~: " + "[" * 10001 + "]" * 10001 + "\n" + _DEV,
        "deep-flow-ok": _H + "~: " + "[" * 9999 + "]" * 9999 + "\n" + _DEV,
    }
)
# Where the daemon says "cannot tell" on purpose: libyaml stops at 1000 nested
# collections, go-yaml at 10000.
CANNOT_TELL = {"deep-flow-ok", "deep-flow-null-key"}
