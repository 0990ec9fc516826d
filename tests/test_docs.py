"""The documentation says what the code does, and its links lead somewhere.

- every flag and environment variable of ``rbln-device-plugin --help`` (and every other
  variable the daemon reads) is in docs/configuration.md, and the page names no flag or
  variable the daemon does not have;
- every chart value in values.yaml is in docs/configuration.md, and the page names no
  value the chart does not have;
- every record message the daemon's source can log is in docs/logging.md, and every
  message the catalogue names is one the source can log;
- every relative link and anchor in README.md and docs/ resolves;
- the README stays a short page with a table of contents, and user documentation holds
  no development history (issue numbers, before/after figures).

The metrics page is checked against what the recorder exposes in
tests/test_metrics_recorder.py; the commands the pages show are run by
tests/test_readme_commands.py.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rbln_device_plugin import options

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
SRC = REPO / "src" / "rbln_device_plugin"
CHART = REPO / "deployments" / "helm" / "k8s-device-plugin-chart"
PAGES = sorted([REPO / "README.md", *DOCS.glob("*.md")])
LEVELS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical"})
# A stand-in for the part of a message the code fills in at run time.
ANY = "\x00"


def page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def backticked(text: str) -> set[str]:
    """Every `code span` of a Markdown text (single backticks)."""
    return set(re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text))


# -- configuration -----------------------------------------------------------------------


def help_text() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "rbln_device_plugin", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr + done.stdout


def test_every_flag_and_variable_of_help_is_documented_and_nothing_else() -> None:
    text = help_text()
    flags = set(re.findall(r"^  (--[a-z][a-z-]+)", text, flags=re.M)) - {"--help", "--version"}
    variables = set(re.findall(r"\benv ([A-Z][A-Z0-9_]+)", text))
    variables |= set(re.findall(r"\b([A-Z][A-Z0-9_]+) accepts\b", text))  # logging
    variables |= set(options.ENVIRONMENT_VARIABLES)
    assert (
        len(flags) >= 15 and {"DEVICE_SCAN_INTERVAL", "RBLN_DEVICE_PLUGIN_LOG_LEVEL"} <= variables
    )
    config = page("configuration.md")
    spans = backticked(config)
    assert not sorted(flags - spans), "flags missing from docs/configuration.md"
    assert not sorted(variables - spans), "variables missing from docs/configuration.md"
    # The page's tables: the first column(s) are flags and variables; each must exist.
    rows = [line for line in config.splitlines() if line.startswith("| `")]
    named_flags = {m for row in rows for m in re.findall(r"^\| `(--[a-z-]+)`", row)}
    assert not sorted(named_flags - flags), "docs/configuration.md names flags --help lacks"
    table_vars = {
        m for row in rows for m in re.findall(r"^\| (?:`--[a-z-]+` \| )?`([A-Z][A-Z0-9_]+)`", row)
    }
    read_elsewhere = {v for v in table_vars - variables if f'"{v}"' in source_text()}
    assert not sorted(table_vars - variables - read_elsewhere), (
        "docs/configuration.md documents variables the daemon never reads"
    )


def leaf_keys(values: object, prefix: str = "") -> Iterator[str]:
    if isinstance(values, dict) and values:
        for key, value in values.items():
            yield from leaf_keys(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip(".")


def test_every_chart_value_is_documented_and_nothing_else() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    config = page("configuration.md")
    spans = backticked(config)

    def documented(key: str) -> bool:
        # A map documented as a whole (updateStrategy, resources) covers its children.
        parts = key.split(".")
        return any(".".join(parts[:n]) in spans for n in range(1, len(parts) + 1))

    missing = [key for key in leaf_keys(values) if not documented(key)]
    assert not missing, f"chart values missing from docs/configuration.md: {missing}"
    section = config.split("\n## Chart values\n", 1)[1]
    named = re.findall(r"^\| `([A-Za-z][\w.]*)` \|", section, flags=re.M)
    assert len(named) >= 30

    def exists(key: str) -> bool:
        node: object = values
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    assert not [key for key in named if not exists(key)], "values.yaml lacks documented keys"


# -- records -----------------------------------------------------------------------------


def source_text() -> str:
    return "\n".join(p.read_text() for p in sorted(SRC.rglob("*.py")))


def _constants(tree: ast.Module) -> dict[str, str]:
    """A module's module-level string constants."""
    found: dict[str, str] = {}
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Constant)
            and isinstance(value.value, str)
        ):
            found[target.id] = value.value
    return found


def _module_constants() -> dict[str, dict[str, str]]:
    """Dotted module name -> its string constants."""
    out = {}
    for path in sorted(SRC.rglob("*.py")):
        dotted = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        out[dotted.removesuffix(".__init__")] = _constants(ast.parse(path.read_text()))
    return out


def _scope(tree: ast.Module, dotted: str, modules: dict[str, dict[str, str]]) -> dict[str, str]:
    """Names a module can use for string constants: its own, imported ones, and
    ``module.NAME`` through an imported module."""
    scope = dict(modules.get(dotted, {}))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                source = modules.get(node.module, {})
                if alias.name in source:
                    scope[alias.asname or alias.name] = source[alias.name]
                for name, value in modules.get(f"{node.module}.{alias.name}", {}).items():
                    scope[f"{alias.asname or alias.name}.{name}"] = value
    return scope


def _text(node: ast.expr, scope: dict[str, str]) -> str | None:
    """A message argument as text; ANY for run-time parts; None when not a message."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name | ast.Attribute):
        return scope.get(ast.unparse(node))  # a parameter (a forwarded message) is not one
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                inner = _text(value.value, scope)
                parts.append(inner if inner is not None else ANY)
            else:
                parts.append(_text(value, scope) or "")
        return "".join(parts)
    return None


def _is_log_method(node: ast.expr) -> bool:
    """``log.info`` and the other levels, or a choice between them (``a if c else b``)."""
    if isinstance(node, ast.IfExp):
        return _is_log_method(node.body) and _is_log_method(node.orelse)
    return isinstance(node, ast.Attribute) and node.attr in LEVELS


def record_messages() -> dict[str, str]:
    """Every message the daemon's code logs itself -> where (file:line).

    Log calls (``log.info("...")`` and the other levels, also through a name bound to
    one of them), the last record before a forced exit (``last_words``), records built
    by hand (``msg=...``) and the discovery problems (``Problem(key, message)``), which
    the scan logs as error records. Records of other libraries that the daemon passes
    through (gRPC's, OpenTelemetry's) are not its own.
    """
    modules = _module_constants()
    found: dict[str, str] = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        dotted = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        scope = _scope(tree, dotted.removesuffix(".__init__"), modules)
        emitters = {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and _is_log_method(node.value)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            arguments = [k.value for k in node.keywords if k.arg == "msg"]
            if _is_log_method(func) or name in emitters or name == "last_words":
                arguments += node.args[:1]
            elif name == "Problem" and len(node.args) >= 2:
                arguments.append(node.args[1])
            for argument in arguments:
                text = _text(argument, scope)
                if text is not None:
                    found.setdefault(text, f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def _documented(message: str, text: str) -> bool:
    text = " ".join(text.split())  # a message may wrap in the page's source
    if ANY not in message:
        return f"`{message}`" in text
    pattern = ".+?".join(re.escape(part) for part in message.split(ANY))
    return re.search(f"`{pattern}`", text) is not None


def test_the_message_finder_sees_every_kind_of_call() -> None:
    found = record_messages()
    assert "Starting rbln-device-plugin" in found  # a literal
    assert "Kubelet device-plugin directory does not exist; waiting for the kubelet" in found
    assert "Skipping unsupported device" in found  # a discovery problem
    assert "Second shutdown signal received; exiting at once" in found  # last_words
    assert "Invalid USE_GENERIC_RESOURCE_NAME, ignoring it" in found  # an f-string
    assert f"Invalid {ANY}, using default" in found
    assert len(found) >= 80


def test_every_record_message_is_in_the_logging_page() -> None:
    text = page("logging.md")
    missing = {m: where for m, where in record_messages().items() if not _documented(m, text)}
    assert not missing, f"record messages missing from docs/logging.md: {missing}"


def test_the_catalogue_names_only_messages_the_daemon_logs() -> None:
    text = page("logging.md")
    catalogue = text.split("\n## The record catalogue\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in catalogue.splitlines() if line.startswith("| ")][2:]
    named = {
        m for row in rows for m in re.findall(r"`([A-Za-z][^`]* [^`]*)`", row.split(" | ", 1)[1])
    }
    messages = record_messages()
    known = [m for m in messages if ANY not in m]
    patterns = [
        re.compile(".+?".join(re.escape(p) for p in m.split(ANY)) + "$")
        for m in messages
        if ANY in m
    ]
    unknown = {
        m
        for m in named
        if m not in known
        and not any(p.match(m) for p in patterns)
        and not m.isupper()  # a variable or a status name, not a message
    }
    assert not unknown, f"docs/logging.md names messages the daemon never logs: {unknown}"


# -- links -------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation gone, spaces to hyphens."""
    text = re.sub(r"`|\*", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        heading = re.match(r"#{1,6} (.+)$", line)
        if heading and not in_fence:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> Iterator[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    yield from re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    broken = []
    for target in links(path):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto: ...
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        missing_anchor = anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved))
        if not resolved.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{path.name}: broken links {broken}"


def test_the_anchor_rule_matches_githubs() -> None:
    assert (
        slug("Option 1: through the RBLN NPU Operator") == "option-1-through-the-rbln-npu-operator"
    )
    assert slug("`make test`: what it runs") == "make-test-what-it-runs"
    assert slug("SR-IOV partitioned nodes (REBEL)") == "sr-iov-partitioned-nodes-rebel"
    assert slug("`OTEL_TRACES_EXPORTER=none` is read") == "otel_traces_exporternone-is-read"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    unlinked = [p.name for p in DOCS.glob("*.md") if f"(docs/{p.name}" not in readme]
    assert not unlinked, f"pages the README does not link: {unlinked}"


# -- shape -------------------------------------------------------------------------------


def test_the_readme_is_short_and_has_a_table_of_contents() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 420
    assert len(text.split()) <= 3500  # about 15 minutes at 230 words a minute
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    contents = text.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"\]\(#([^)]+)\)", contents)
    assert set(listed) >= {slug(h) for h in headings if h != "Contents"}


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_no_development_history_in_user_documentation(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert not re.findall(r"\bissues? #?\d+|\(issue\b|\bbefore -> |\b\d[\d.,]* -> \d", text)


def test_every_test_module_the_testing_page_names_exists() -> None:
    named = set(re.findall(r"`(test_[\w*]+\.py)`", page("testing.md")))
    assert len(named) >= 20
    missing = [n for n in sorted(named) if not list((REPO / "tests").glob(n))]
    assert not missing, f"docs/testing.md names test modules that do not exist: {missing}"


# -- the inspect report ------------------------------------------------------------------


def _json_report_table() -> str:
    text = page("troubleshooting.md")
    section = text.split("## The JSON report", 1)[1]
    return section.split("\n## ", 1)[0]


def test_the_json_report_table_names_every_key_and_kind_of_the_schema() -> None:
    schema = json.loads((SRC / "inspect" / "report.schema.json").read_text(encoding="utf-8"))
    table = _json_report_table()
    first_cells = {
        key.strip("`[] ")
        for row in table.splitlines()
        if row.startswith("| `")
        for key in row.split("|")[1].split(",")
    }
    assert first_cells == set(schema["properties"])
    named = backticked(table)
    kinds = schema["$defs"]["problem"]["properties"]["kind"]["enum"]
    why_not = schema["$defs"]["whyNotKind"]["enum"]
    assert set(kinds) - named == set()
    assert set(why_not) - named == set()
