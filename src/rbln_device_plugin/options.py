"""Flags and environment variables -> Config, the same way for every command.

The daemon and ``inspect`` share one parser builder and one parsing path, so a flag
means the same thing (and fails with the same message) in both. stdout is never used:
``--help``, ``--version`` and usage text go to stderr, where they cannot be mistaken for
log records or for ``inspect``'s report.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn

from rbln_device_plugin import __version__, config, goflags, processtweaks
from rbln_device_plugin.telemetry import logs

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
# The instance lock was lost (deleted or replaced, and now someone else holds it, or it
# cannot be locked again): two daemons could serve the node, so this one stopped.
EXIT_LOCK_LOST: Final = 3

PROG: Final = "rbln-device-plugin"

# Every variable any command reads, so a deployment can be checked against them.
ENVIRONMENT_VARIABLES: Final[frozenset[str]] = frozenset(
    {option.env for option in config.OPTIONS}
    | {logs.LEVEL_ENV, logs.FORMAT_ENV, config.IGNORED_ENV}
)


class UsageError(Exception):
    """A command line or environment the command cannot use; exit status 2."""


class _StderrParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def print_help(self, file: Any = None) -> None:
        super().print_help(sys.stderr)


class _HelpFormatter(processtweaks.ShutilFreeHelpFormatter):
    """Never breaks a path or flag name at its hyphens; the width as argparse's own."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _VersionAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        sys.stderr.write(f"{PROG} {__version__}\n")
        parser.exit(EXIT_OK)


def fill(text: str) -> str:
    """Help text wrapped the way every command prints it."""
    return textwrap.fill(text, width=79, break_on_hyphens=False)


def build_parser(
    prog: str, description: str, epilog: str, shown: Sequence[config.Option] = config.OPTIONS
) -> argparse.ArgumentParser:
    """A parser with ``--version`` and every option; ``--help`` lists only ``shown``.

    Every command takes every option (and its variable), so one command line works for
    all of them; help lists those that change what the command does.
    """
    parser = _StderrParser(
        prog=prog,
        description=description,
        epilog=fill(epilog),
        allow_abbrev=False,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="print the version")
    for option in config.OPTIONS:
        # A boolean takes no separate word (Go's flag package): help shows it alone or
        # with "=". goflags hands argparse every value after "=", so nargs shapes help only.
        boolean = option.kind == config.BOOL
        parser.add_argument(
            option.flag,
            dest=option.field,
            metavar="=true|false" if boolean else option.metavar,
            nargs="?" if boolean else None,
            # argparse drops a value that is exactly "--" and then takes const: the text.
            const="--" if boolean else None,
            default=None,
            help=f"{option.help}{'; alone: true' if boolean else ''} "
            f"[env {option.env}; default {option.help_default}]"
            if option in shown
            else argparse.SUPPRESS,
        )
    parser.add_argument(
        config.LEGACY_NAMES_FLAG,
        dest=config.LEGACY_NAMES_FIELD,
        metavar="=true|false",
        nargs="?",
        const="--",
        default=None,
        # It changes nothing a command does; the daemon's help names it for Go users.
        help=f"{config.LEGACY_NAMES_HELP} [env {config.IGNORED_ENV}]"
        if shown is config.OPTIONS
        else argparse.SUPPRESS,
    )
    return parser


def flag_table(parser: argparse.ArgumentParser) -> goflags.FlagTable:
    """Every flag of ``parser`` by its name, sorted the way Go's flag package treats it."""

    def by_name(spellings: frozenset[str]) -> dict[str, str]:
        return {spelling.lstrip("-"): spelling for spelling in spellings}

    booleans = frozenset(o.flag for o in config.OPTIONS if o.kind == config.BOOL) | {
        config.LEGACY_NAMES_FLAG
    }
    return goflags.FlagTable(
        values=by_name(processtweaks.value_flags(parser) - booleans),
        booleans=by_name(booleans),
        switches=by_name(processtweaks.switch_flags(parser)),
    )


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv`` by Go's flag package rules (see ``goflags``): every flag with one
    dash or two, ``-flag value`` or ``-flag=value``, a boolean alone or ``=true|false``;
    ``-h``, ``-help`` and ``-version`` in either dash form too."""
    try:
        words = goflags.normalise(argv, flag_table(parser))
    except goflags.FlagError as exc:
        raise UsageError(str(exc)) from None
    namespace = parser.parse_args(words)
    for name, value in vars(namespace).items():
        # argparse drops a value that is exactly "--" (``--cdi-root=--``) and leaves an
        # empty list; Go's flag package keeps the text. Every value flag here takes one word.
        if value == []:
            setattr(namespace, name, "--")
    return namespace


def config_from_namespace(
    namespace: argparse.Namespace, environ: Mapping[str, str]
) -> config.Config:
    """Parsed flags + environment -> Config; UsageError names the flag and its variable."""
    try:
        return config.config_from_settings(vars(namespace), environ)
    except config.ConfigError as exc:
        raise UsageError(str(exc)) from None


def daemon_parser() -> argparse.ArgumentParser:
    return build_parser(
        PROG,
        "Kubernetes device plugin for Rebellions NPUs.",
        "Flags are read as Go's flag package reads them: one dash or two, -flag value or "
        "-flag=value, a boolean flag alone or as -flag=false. "
        "A flag beats its environment variable, which beats the default. Logging is "
        f"set only through environment variables: {logs.LEVEL_ENV} accepts "
        f"{logs.describe_levels()} (default {logs.DEFAULT_LEVEL}); {logs.FORMAT_ENV} "
        f"accepts {', '.join(logs.FORMATS)} (default {logs.DEFAULT_FORMAT}). "
        "`rbln-device-plugin inspect [flags]` reports on the node without starting "
        "the daemon (see inspect --help).",
    )


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> config.Config:
    """The daemon's command line + environment -> Config. Raises UsageError."""
    return config_from_namespace(parse_args(daemon_parser(), argv), environ)
