"""Command line: logger first, then flags and environment -> Config, then the daemon.

stdout carries only the structured log stream; --help, --version and usage text go to
stderr so that every stdout line stays machine-parseable.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from rbln_device_plugin import __version__, config, grpc_core_log, inventory, logs

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    pass


class _StderrParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def print_help(self, file: Any = None) -> None:
        super().print_help(sys.stderr)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Never breaks a path or flag name at its hyphens."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _VersionAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        sys.stderr.write(f"rbln-device-plugin {__version__}\n")
        parser.exit(EXIT_OK)


def build_parser() -> argparse.ArgumentParser:
    parser = _StderrParser(
        prog="rbln-device-plugin",
        description="Kubernetes device plugin for Rebellions NPUs.",
        epilog=textwrap.fill(
            "A flag beats its environment variable, which beats the default. Logging is "
            f"set only through environment variables: {logs.LEVEL_ENV} accepts "
            f"{logs.describe_levels()} (default {logs.DEFAULT_LEVEL}); {logs.FORMAT_ENV} "
            f"accepts {', '.join(logs.FORMATS)} (default {logs.DEFAULT_FORMAT}). "
            "`rbln-device-plugin inspect [flags]` reports on the node without starting "
            "the daemon (see inspect --help).",
            width=79,
            break_on_hyphens=False,
        ),
        allow_abbrev=False,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="print the version")
    for option in config.OPTIONS:
        parser.add_argument(
            option.flag,
            dest=option.field,
            metavar=option.metavar,
            default=None,
            help=f"{option.help} [env {option.env}; default {option.help_default}]",
        )
    return parser


def _attach_dash_values(argv: Sequence[str]) -> list[str]:
    """``--flag -1s`` -> ``--flag=-1s`` for every option that takes a value.

    argparse takes a separate argument that starts with "-" (other than a plain negative
    number) for another flag and fails with "expected one argument". Like Go's flag
    package, the word after a value flag is its value, so a negative duration gets the
    same message, naming the flag and its variable, in both spellings. A word starting
    with "--" is still left to argparse: that is a forgotten value, not a value.
    Nothing after a bare "--" is touched.
    """
    flags = {option.flag for option in config.OPTIONS}
    out: list[str] = []
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":  # everything after it is positional: leave it to argparse
            out.extend(argv[index:])
            break
        following = argv[index + 1] if index + 1 < len(argv) else None
        if (
            word in flags
            and following is not None
            and following.startswith("-")
            and not following.startswith("--")
        ):
            out.append(f"{word}={following}")
            index += 2
            continue
        out.append(word)
        index += 1
    return out


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> config.Config:
    """Flags + environment -> Config. Raises UsageError for anything unusable."""
    namespace = build_parser().parse_args(_attach_dash_values(argv))
    try:
        return config.resolve(vars(namespace), environ)
    except config.ConfigError as exc:
        raise UsageError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["inspect"]:
        # Before the daemon's logger: inspect's stdout is its report, not log records.
        from rbln_device_plugin import inspect_cli

        return inspect_cli.main(args[1:])
    try:
        return _main(args)
    finally:
        # Records are written by a background thread: let the last ones out (bounded,
        # so a blocked stdout cannot hold the exit).
        logs.flush()


def _main(args: Sequence[str]) -> int:
    # The gRPC C core logs straight to fd 2 and reads this once, at import.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    logs.install(os.environ)
    log = logs.get_logger()
    try:
        cfg = parse(args, os.environ)
    except UsageError as exc:
        build_parser().print_usage(sys.stderr)
        sys.stderr.write(f"rbln-device-plugin: error: {exc}\n")
        log.error("Invalid command line", err=str(exc))
        return EXIT_USAGE
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)

    log.info("Starting rbln-device-plugin", version=__version__, config=cfg.describe())
    legacy_names = config.legacy_names_requested(os.environ)
    if legacy_names is not None:
        log.warning(
            f"{config.IGNORED_ENV}=false has no effect: resource names are fixed",
            variable=config.IGNORED_ENV,
            value=legacy_names,
            resourceNames=[inventory.RESOURCE_NPU, *inventory.VF_RESOURCES.values()],
            hint="per-product names such as rebellions.ai/ATOM are not advertised; "
            "workloads must request the names above",
        )
    # From here on gRPC's C-core lines on fd 2 become component=grpc records.
    relay = grpc_core_log.install()
    try:
        from rbln_device_plugin import daemon  # imports grpc: after GRPC_VERBOSITY is set

        return daemon.run(cfg)
    except Exception as exc:
        log.error("Unexpected internal error; exiting", err=exc, exc_info=True)
        return EXIT_FAILURE
    finally:
        if relay is not None:
            relay.stop()


if __name__ == "__main__":
    raise SystemExit(main())
