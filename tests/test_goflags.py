"""The command line is read as Go's flag package reads the Go plugin's (urfave/cli v2,
without short-option handling): every flag with one dash or two, ``-flag value`` and
``-flag=value``, a boolean alone or with ``=true|false`` and never with a separate word,
``--`` and the first argument ending the flags, Go's messages naming the flag."""

from __future__ import annotations

import pytest

from rbln_device_plugin import config, options
from rbln_device_plugin.inspect import command as inspect_command

# An endpoint, so that --metrics-otlp alone is usable.
ENV = {"OTEL_EXPORTER_OTLP_ENDPOINT": "c:1"}
VALUE_OPTIONS = [o for o in config.OPTIONS if o.kind != config.BOOL]
BOOL_OPTIONS = [o for o in config.OPTIONS if o.kind == config.BOOL]


def _sample(option: config.Option) -> str:
    """A usable value other than the default, by the setting's type."""
    by_field = {"mode": "device-plugin", "cdi_mode": "both", "traces_exporter": "none",
                "node_name": "n1", "otlp_endpoint": "h:1", "installation": "ns/x",
                "healthcheck_port": "-7", "metrics_port": "7"}  # fmt: skip
    by_kind = {config.DURATION: "100s", config.STRING: "/flag/x"}
    return by_field.get(option.field) or by_kind[option.kind]


def resolve(argv: list[str]) -> config.Config:
    return options.parse(argv, ENV)


def _name(option: config.Option) -> str:
    return option.flag.removeprefix("--")


@pytest.mark.parametrize("option", VALUE_OPTIONS, ids=lambda o: o.flag)
def test_every_value_flag_takes_one_dash_or_two_and_either_value_form(
    option: config.Option,
) -> None:
    value = _sample(option)
    expected = option.convert(value)
    for argv in (
        [f"-{_name(option)}", value],
        [f"--{_name(option)}", value],
        [f"-{_name(option)}={value}"],
        [f"--{_name(option)}={value}"],
    ):
        cfg = resolve(argv)
        assert getattr(cfg, option.field) == expected, argv
        assert cfg.sources[option.field] == "flag", argv
    with pytest.raises(options.UsageError, match=f"^flag needs an argument: -{_name(option)}$"):
        resolve([f"-{_name(option)}"])


@pytest.mark.parametrize("option", BOOL_OPTIONS, ids=lambda o: o.flag)
@pytest.mark.parametrize("dashes", ["-", "--"])
def test_every_boolean_flag_is_true_alone_and_takes_only_an_attached_value(
    option: config.Option, dashes: str
) -> None:
    flag = f"{dashes}{_name(option)}"
    assert getattr(resolve([flag]), option.field) is True
    for word, value in (("true", True), ("false", False), ("T", True), ("0", False)):
        assert getattr(resolve([f"{flag}={word}"]), option.field) is value
    # A flag beats its variable in every form.
    assert (
        getattr(options.parse([f"{flag}=false"], {**ENV, option.env: "true"}), option.field)
        is False
    )
    assert getattr(options.parse([flag], {**ENV, option.env: "false"}), option.field) is True
    # "-flag false": in Go the word is an argument, and the plugin refuses arguments.
    with pytest.raises(options.UsageError) as caught:
        resolve([flag, "false"])
    assert str(caught.value) == (
        f"arguments not supported: [false] (a boolean flag takes no separate value: {flag}=false)"
    )
    with pytest.raises(
        options.UsageError, match=f"^{option.flag} \\(command line\\): 'maybe' is not"
    ):
        resolve([f"{flag}=maybe"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "flag provided but not defined: --bogus"),
        (["-bogus"], "flag provided but not defined: -bogus"),
        (["-bogus=1"], "flag provided but not defined: -bogus"),
        (["--cdi", "/x"], "flag provided but not defined: --cdi"),  # no abbreviations
        (["-v"], "flag provided but not defined: -v"),  # the plugin dropped -v for --version
        (["---cdi-root=/x"], "bad flag syntax: ---cdi-root=/x"),
        (["-=x"], "bad flag syntax: -=x"),
        (["--=x"], "bad flag syntax: --=x"),
        (["-"], "arguments not supported: [-]"),
        (["extra"], "arguments not supported: [extra]"),
        # The first argument ends the flags: what follows is arguments too.
        (["extra", "--cdi-root", "/x"], "arguments not supported: [extra --cdi-root /x]"),
        (["--", "-cdi-root", "/x"], "arguments not supported: [-cdi-root /x]"),
        (["-cdi-root", "/x", "/y"], "arguments not supported: [/y]"),
        (["-version=maybe"], 'invalid boolean value "maybe" for -version: parse error'),
    ],
)
def test_refusals_are_go_s_naming_the_flag_as_written(argv: list[str], message: str) -> None:
    with pytest.raises(options.UsageError) as caught:
        resolve(argv)
    assert str(caught.value) == message


def test_the_word_after_a_value_flag_is_its_value_whatever_it_is() -> None:
    assert resolve(["-node-name", "-x"]).node_name == "-x"
    assert resolve(["-node-name", "--cdi-root"]).node_name == "--cdi-root"
    assert resolve(["-node-name", "--"]).node_name == "--"
    assert resolve(["-node-name", "-"]).node_name == "-"
    assert resolve(["-node-name="]).node_name == ""
    assert resolve(["-node-name=a=b"]).node_name == "a=b"
    assert resolve(["-healthcheck-port", "-1"]).healthcheck_port == -1


def test_double_dash_ends_the_flags_and_the_last_of_a_flag_wins() -> None:
    assert resolve(["--"]) == resolve([])
    assert resolve(["-cdi-root", "/a", "--"]).cdi_root == resolve(["--cdi-root=/a"]).cdi_root
    assert str(resolve(["-cdi-root=/a", "--cdi-root", "/b"]).cdi_root) == "/b"


@pytest.mark.parametrize("flag", ["-h", "--h", "-help", "--help", "-help=true"])
def test_help_in_each_go_spelling(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        resolve([flag])
    assert done.value.code == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "--device-scan-interval" in captured.err


@pytest.mark.parametrize("flag", ["-version", "--version", "--version=1"])
def test_version_in_each_go_spelling(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        resolve([flag])
    assert done.value.code == 0
    assert capsys.readouterr().err.startswith(f"{options.PROG} ")


def test_a_switch_set_false_does_nothing() -> None:
    assert resolve(["-help=false", "--version=0"]) == resolve([])


def test_inspect_reads_its_own_flags_by_the_same_rules() -> None:
    parser = inspect_command.build_parser()
    request = inspect_command.parse(
        parser, ["-output", "json", "-preferred=2", "-sysfs-root=/s"], {}
    )
    assert (request.output, request.preferred, str(request.config.sysfs_root)) == ("json", 2, "/s")
    with pytest.raises(options.UsageError, match=r"^flag provided but not defined: -bogus$"):
        inspect_command.parse(parser, ["-bogus"], {})


LEGACY = "use-generic-resource-name"


@pytest.mark.parametrize("dashes", ["-", "--"])
@pytest.mark.parametrize(
    ("suffix", "given", "warned"),
    [
        ("", "true", False),  # alone: true
        ("=true", "true", False),
        ("=T", "T", False),
        ("=1", "1", False),
        ("=false", "false", True),
        ("=0", "0", True),
        ("=F", "F", True),
    ],
)
def test_the_older_go_release_s_generic_name_flag_is_accepted_in_every_go_form(
    dashes: str, suffix: str, given: str, warned: bool
) -> None:
    # The older public Go release's --use-generic-resource-name: accepted and ignored, as
    # its variable is; a false value is worth the variable's warning, naming the flag.
    cfg = resolve([f"{dashes}{LEGACY}{suffix}"])
    assert cfg == resolve([])  # it changes nothing else
    assert cfg.legacy_names_flag == given
    expected = (config.LEGACY_NAMES_FLAG, given) if warned else None
    assert config.legacy_names_requested({}, cfg.legacy_names_flag) == expected
    # The flag beats the variable, as in Go: a false or malformed variable is not read.
    for variable in ("false", "maybe"):
        environ = {config.IGNORED_ENV: variable}
        assert config.legacy_names_requested(environ, cfg.legacy_names_flag) == expected
        assert config.ignored_env_problem(environ, cfg.legacy_names_flag) is None


@pytest.mark.parametrize("dashes", ["-", "--"])
def test_the_generic_name_flag_is_refused_as_go_refuses_a_bad_boolean(dashes: str) -> None:
    flag = f"{dashes}{LEGACY}"
    with pytest.raises(options.UsageError) as caught:
        resolve([f"{flag}=maybe"])
    assert str(caught.value) == (
        "--use-generic-resource-name (command line): 'maybe' is not a boolean (true or false)"
    )
    with pytest.raises(options.UsageError) as caught:
        resolve([flag, "false"])
    assert str(caught.value) == (
        f"arguments not supported: [false] (a boolean flag takes no separate value: {flag}=false)"
    )


def test_help_lists_the_generic_name_flag_as_accepted_for_compatibility() -> None:
    text = " ".join(options.daemon_parser().format_help().split())
    assert (
        "--use-generic-resource-name [=true|false] accepted for compatibility with the Go "
        "plugin's older release, and ignored: resource names are fixed"
    ) in text
    assert "[env USE_GENERIC_RESOURCE_NAME]" in text
    # inspect takes it (one command line for every command) but its help leaves it out.
    assert LEGACY not in inspect_command.build_parser().format_help()
    assert inspect_command.parse(inspect_command.build_parser(), [f"-{LEGACY}=0"], {})
