"""
Tests for gateway.config: defaults, a full file, path resolution, and the
exact one-line message of every kind of configuration error.

The messages are asserted verbatim because they are the user interface of
this module: an operator reads them to find the key to fix.
"""

import dataclasses
import os
import textwrap

import pytest

from gateway.config import (
    REQUIRED,
    ConfigError,
    GatewayConfig,
    GroupsConfig,
    LimitsConfig,
    ListenerConfig,
    StorageConfig,
    TopicsConfig,
    check_keys,
    load_config,
    opt_bool,
    opt_choice,
    opt_int,
    opt_mapping,
    opt_number,
    opt_str,
    parse_config,
)


class FakeDialect:
    """
    A dialect with one option, ``binary`` (a bool, default false).

    It records the options it was given, so tests can check that the common
    listener keys were taken out before ``validate`` saw them.
    """

    def __init__(self, name):
        self.name = name
        self.seen = []

    def validate(self, options):
        self.seen.append(dict(options))
        check_keys(options, ("binary",))
        return {"binary": opt_bool(options, "binary", False)}


class PassThroughDialect(FakeDialect):
    """A dialect whose ``validate`` returns None: "use the options as given"."""

    def validate(self, options):
        self.seen.append(dict(options))


@pytest.fixture
def dialects():
    return {name: FakeDialect(name) for name in ("rustlog", "kafka", "figg")}


def write(folder, text, name="config.yaml"):
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path, dialects, text):
    """The message of the ConfigError that loading ``text`` raises."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), dialects)
    return str(info.value)


MINIMAL = """
listeners:
  - {dialect: rustlog, endpoint: "tcp:9093:interface=127.0.0.1"}
"""


def test_defaults(tmp_path, dialects):
    path = write(tmp_path, MINIMAL)
    config = load_config(path, dialects)
    assert config.storage == StorageConfig(path=str(tmp_path / "data"))
    assert config.storage.fsync == "interval"
    assert config.storage.fsync_interval_ms == 5
    assert config.storage.segment_bytes == 134217728
    assert config.storage.segment_ms == 604800000
    assert config.storage.index_interval_bytes == 4096
    assert config.storage.retention_hours == 168
    assert config.storage.retention_bytes is None
    assert config.storage.retention_check_ms == 60000
    assert config.topics == TopicsConfig(
        auto_create=True, default_partitions=1, max_partitions=1024
    )
    assert config.limits == LimitsConfig(max_record_bytes=1048576)
    assert config.groups == GroupsConfig(
        min_session_timeout_ms=6000, max_session_timeout_ms=300000
    )
    assert config.listeners == (
        ListenerConfig(0, "rustlog", "tcp:9093:interface=127.0.0.1", {"binary": False}),
    )
    assert config.source == str(path)


def test_full_file(tmp_path, dialects):
    path = write(
        tmp_path,
        """
        storage:
          path: /srv/gateway
          fsync: always
          fsync_interval_ms: 10
          segment_bytes: 1024
          segment_ms: 3600000
          index_interval_bytes: 512
          retention: {hours: 0.5, bytes: 1000000}
          retention_check_ms: 250
        topics:
          auto_create: false
          default_partitions: 8
          max_partitions: 8
        limits:
          max_record_bytes: 2097152
        groups:
          min_session_timeout_ms: 1000
          max_session_timeout_ms: 1000
        listeners:
          - {dialect: rustlog, endpoint: "tcp:9093:interface=127.0.0.1"}
          - dialect: kafka
            endpoint: "tcp:9092:interface=127.0.0.1"
            binary: true
          - {dialect: figg, endpoint: "unix:/tmp/figg.sock"}
        """,
    )
    config = load_config(path, dialects)
    assert config == GatewayConfig(
        storage=StorageConfig(
            path="/srv/gateway",
            fsync="always",
            fsync_interval_ms=10,
            segment_bytes=1024,
            segment_ms=3600000,
            index_interval_bytes=512,
            retention_hours=0.5,
            retention_bytes=1000000,
            retention_check_ms=250,
        ),
        topics=TopicsConfig(auto_create=False, default_partitions=8, max_partitions=8),
        limits=LimitsConfig(max_record_bytes=2097152),
        groups=GroupsConfig(min_session_timeout_ms=1000, max_session_timeout_ms=1000),
        listeners=(
            ListenerConfig(0, "rustlog", "tcp:9093:interface=127.0.0.1", {"binary": False}),
            ListenerConfig(1, "kafka", "tcp:9092:interface=127.0.0.1", {"binary": True}),
            ListenerConfig(2, "figg", "unix:/tmp/figg.sock", {"binary": False}),
        ),
        source=str(path),
    )
    assert [listener.path for listener in config.listeners] == [
        "listeners[0]",
        "listeners[1]",
        "listeners[2]",
    ]


def test_retention_null_means_no_limit(tmp_path, dialects):
    path = write(
        tmp_path,
        """
        storage: {retention: {hours: null, bytes: null}}
        listeners: [{dialect: figg, endpoint: "tcp:0"}]
        """,
    )
    storage = load_config(path, dialects).storage
    assert (storage.retention_hours, storage.retention_bytes) == (None, None)


def test_dialect_sees_only_its_own_keys(tmp_path, dialects):
    write(tmp_path, 'listeners: [{dialect: kafka, endpoint: "tcp:0", binary: true}]')
    load_config(tmp_path / "config.yaml", dialects)
    assert dialects["kafka"].seen == [{"binary": True}]


def test_validate_returning_none_keeps_options_as_given(tmp_path):
    dialect = PassThroughDialect("tank")
    write(tmp_path, 'listeners: [{dialect: tank, endpoint: "tcp:0", anything: [1, 2]}]')
    config = load_config(tmp_path / "config.yaml", {"tank": dialect})
    assert dict(config.listeners[0].options) == {"anything": [1, 2]}


def test_listener_options_are_read_only():
    listener = ListenerConfig(0, "figg", "tcp:0", {"binary": True})
    with pytest.raises(TypeError):
        listener.options["binary"] = False


def test_relative_storage_path_is_relative_to_the_config_folder(
    tmp_path, dialects, monkeypatch
):
    folder = tmp_path / "etc"
    folder.mkdir()
    write(folder, "storage: {path: ../var/log-data}\n" + MINIMAL)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(os.path.join("..", "etc", "config.yaml"), dialects)
    assert config.storage.path == str(tmp_path / "var" / "log-data")
    assert config.source == str(folder / "config.yaml")


def test_absolute_storage_path_is_kept(tmp_path, dialects):
    path = write(tmp_path, "storage: {path: /var/lib/gateway}\n" + MINIMAL)
    assert load_config(path, dialects).storage.path == "/var/lib/gateway"


def test_configs_can_be_built_in_code(tmp_path, monkeypatch):
    assert StorageConfig(path="/tmp/x").fsync == "interval"
    monkeypatch.chdir(tmp_path)
    assert StorageConfig().path == str(tmp_path / "data")
    listener = ListenerConfig(0, "figg", "tcp:0")
    config = GatewayConfig(listeners=[listener])
    assert config.listeners == (listener,)
    assert config.topics == TopicsConfig()
    assert config.source is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.source = "x"


@pytest.mark.parametrize(
    "text, message",
    [
        # The file's overall shape.
        ("", "no listeners: the configuration is empty"),
        ("# nothing but a comment\n", "no listeners: the configuration is empty"),
        ("- a\n- b\n", "the top level must be a mapping, got a list"),
        ("just words\n", "the top level must be a mapping, got 'just words'"),
        ("storage: {}\n", "listeners: required (at least one listener)"),
        ("listeners: []\n", "listeners: must list at least one listener"),
        ("listeners: tcp:0\n", "listeners: must be a list of listeners, got 'tcp:0'"),
        # Unknown keys, with and without a close match.
        ("listner: []\n", "listner: unknown key (did you mean 'listeners'?)"),
        (
            "storage: {fsnyc: always}\n" + MINIMAL,
            "storage.fsnyc: unknown key (did you mean 'fsync'?)",
        ),
        (
            "storage: {retention: {hour: 1}}\n" + MINIMAL,
            "storage.retention.hour: unknown key (did you mean 'hours'?)",
        ),
        (
            "limits: {zzz: 1}\n" + MINIMAL,
            "limits.zzz: unknown key (known: max_record_bytes)",
        ),
        # Sections of the wrong type.
        ("storage: null\n" + MINIMAL, "storage: must be a mapping, got null"),
        ("topics: [1]\n" + MINIMAL, "topics: must be a mapping, got a list"),
        (
            "storage: {retention: 168}\n" + MINIMAL,
            "storage.retention: must be a mapping, got 168",
        ),
        # Values of the wrong type or out of range.
        (
            "storage: {fsync: sometimes}\n" + MINIMAL,
            "storage.fsync: must be one of always, interval, never, got 'sometimes'",
        ),
        (
            "storage: {fsync: intervall}\n" + MINIMAL,
            "storage.fsync: must be one of always, interval, never, got 'intervall'"
            " (did you mean 'interval'?)",
        ),
        (
            "storage: {fsync: true}\n" + MINIMAL,
            "storage.fsync: must be one of always, interval, never, got true",
        ),
        ("storage: {path: ''}\n" + MINIMAL, "storage.path: must not be empty"),
        ("storage: {path: 7}\n" + MINIMAL, "storage.path: must be a string, got 7"),
        (
            "storage: {segment_bytes: 1023}\n" + MINIMAL,
            "storage.segment_bytes: must be an integer >= 1024, got 1023",
        ),
        (
            "storage: {segment_ms: '1000'}\n" + MINIMAL,
            "storage.segment_ms: must be an integer >= 1, got '1000'",
        ),
        (
            "storage: {fsync_interval_ms: 2.5}\n" + MINIMAL,
            "storage.fsync_interval_ms: must be an integer >= 1, got 2.5",
        ),
        (
            "storage: {retention: {hours: 0}}\n" + MINIMAL,
            "storage.retention.hours: must be a number > 0 or null, got 0",
        ),
        (
            "storage: {retention: {hours: .inf}}\n" + MINIMAL,
            "storage.retention.hours: must be a number > 0 or null, got inf",
        ),
        (
            "storage: {retention: {bytes: 0}}\n" + MINIMAL,
            "storage.retention.bytes: must be an integer >= 1 or null, got 0",
        ),
        (
            "limits: {max_record_bytes: -1}\n" + MINIMAL,
            "limits.max_record_bytes: must be an integer >= 1, got -1",
        ),
        # bool is an int in Python, but not in this file, and vice versa.
        (
            "topics: {max_partitions: true}\n" + MINIMAL,
            "topics.max_partitions: must be an integer >= 1, got true",
        ),
        (
            "storage: {retention: {hours: false}}\n" + MINIMAL,
            "storage.retention.hours: must be a number > 0 or null, got false",
        ),
        (
            "topics: {auto_create: 1}\n" + MINIMAL,
            "topics.auto_create: must be true or false, got 1",
        ),
        (
            "topics: {auto_create: 'yes'}\n" + MINIMAL,
            "topics.auto_create: must be true or false, got 'yes'",
        ),
        # Relations between keys.
        (
            "topics: {default_partitions: 9, max_partitions: 8}\n" + MINIMAL,
            "topics.default_partitions: must not exceed max_partitions (8), got 9",
        ),
        (
            "topics: {default_partitions: 0}\n" + MINIMAL,
            "topics.default_partitions: must be an integer >= 1, got 0",
        ),
        (
            "groups: {min_session_timeout_ms: 7000, max_session_timeout_ms: 6000}\n"
            + MINIMAL,
            "groups.max_session_timeout_ms: must be >= min_session_timeout_ms (7000),"
            " got 6000",
        ),
        (
            "groups: {min_session_timeout_ms: 400000}\n" + MINIMAL,
            "groups.max_session_timeout_ms: must be >= min_session_timeout_ms (400000),"
            " got the default 300000",
        ),
        # Listeners.
        (
            "listeners: [tcp:0]\n",
            "listeners[0]: must be a mapping with dialect and endpoint, got 'tcp:0'",
        ),
        (
            'listeners: [{endpoint: "tcp:0"}]\n',
            "listeners[0].dialect: required (known: figg, kafka, rustlog)",
        ),
        (
            'listeners: [{dialect: kafak, endpoint: "tcp:0"}]\n',
            "listeners[0].dialect: unknown dialect 'kafak'"
            " (known: figg, kafka, rustlog; did you mean 'kafka'?)",
        ),
        (
            'listeners: [{dialect: tank, endpoint: "tcp:0"}]\n',
            "listeners[0].dialect: unknown dialect 'tank' (known: figg, kafka, rustlog)",
        ),
        (
            'listeners: [{dialect: 3, endpoint: "tcp:0"}]\n',
            "listeners[0].dialect: must be a string, got 3",
        ),
        ("listeners: [{dialect: figg}]\n", "listeners[0].endpoint: required"),
        (
            "listeners: [{dialect: figg, endpoint: 9093}]\n",
            "listeners[0].endpoint: must be a string, got 9093",
        ),
        (
            'listeners: [{dialect: figg, endpoint: "tcp:0"},'
            ' {dialect: figg, endpoint: "tcp:abc"}]\n',
            "listeners[1].endpoint: not a valid Twisted endpoint string:"
            " invalid literal for int() with base 10: 'abc'",
        ),
        (
            'listeners: [{dialect: figg, endpoint: "nosuchtype:1"}]\n',
            "listeners[0].endpoint: not a valid Twisted endpoint string:"
            " Unknown endpoint type: 'nosuchtype'",
        ),
        (
            'listeners: [{dialect: figg, endpoint: "tcp:1:interfase=127.0.0.1"}]\n',
            "listeners[0].endpoint: not a valid Twisted endpoint string:"
            " _parseTCP() got an unexpected keyword argument 'interfase'",
        ),
        (
            'listeners: [{dialect: figg, endpoint: "tcp:70000"}]\n',
            "listeners[0].endpoint: port 70000 is out of range 0-65535",
        ),
        (
            "listeners:\n"
            '  - {dialect: figg, endpoint: "tcp:8119"}\n'
            '  - {dialect: kafka, endpoint: "tcp:9092"}\n'
            '  - {dialect: rustlog, endpoint: "tcp:8119"}\n',
            "listeners[2].endpoint: 'tcp:8119' is already used by listeners[0]",
        ),
        # A dialect's own error, raised relative to the listener.
        (
            "listeners:\n"
            '  - {dialect: figg, endpoint: "tcp:0"}\n'
            '  - {dialect: figg, endpoint: "tcp:1"}\n'
            '  - {dialect: kafka, endpoint: "tcp:2", binary: "yes"}\n',
            "listeners[2].binary: must be true or false, got 'yes'",
        ),
        (
            'listeners: [{dialect: kafka, endpoint: "tcp:0", binray: true}]\n',
            "listeners[0].binray: unknown key (did you mean 'binary'?)",
        ),
    ],
)
def test_error_messages(tmp_path, dialects, text, message):
    assert error_of(tmp_path, dialects, text) == message


def test_port_zero_may_repeat(tmp_path, dialects):
    path = write(
        tmp_path,
        """
        listeners:
          - {dialect: figg, endpoint: "tcp:0:interface=127.0.0.1"}
          - {dialect: kafka, endpoint: "tcp:0:interface=127.0.0.1"}
        """,
    )
    assert len(load_config(path, dialects).listeners) == 2


def test_yaml_syntax_error_names_file_line_and_column(tmp_path, dialects):
    path = write(tmp_path, "storage:\n  path: ./data\n  fsync: [always\nlisteners: []\n")
    assert str(pytest.raises(ConfigError, load_config, path, dialects).value) == (
        f"{path}:4:10: invalid YAML: expected ',' or ']', but got ':'"
    )


def test_yaml_syntax_error_on_a_mapping_value(tmp_path, dialects):
    path = write(tmp_path, "listeners:\n  - dialect: figg\n    endpoint: a: b\n")
    assert str(pytest.raises(ConfigError, load_config, path, dialects).value) == (
        f"{path}:3:16: invalid YAML: mapping values are not allowed here"
    )


def test_missing_file(tmp_path, dialects):
    path = tmp_path / "absent.yaml"
    assert str(pytest.raises(ConfigError, load_config, path, dialects).value) == (
        f"cannot read {path}: No such file or directory"
    )


def test_parse_config_takes_data_already_loaded(dialects):
    config = parse_config(
        {"storage": {"path": "d"}, "listeners": [{"dialect": "figg", "endpoint": "tcp:0"}]},
        "/etc/gateway",
        dialects,
    )
    assert config.storage.path == "/etc/gateway/d"
    assert config.source is None


def test_config_error_formatting_and_within():
    err = ConfigError("binary", "must be true or false")
    assert str(err) == "binary: must be true or false"
    assert str(err.within("listeners[2]")) == "listeners[2].binary: must be true or false"
    assert str(ConfigError("", "no listeners")) == "no listeners"
    assert str(ConfigError("", "required").within("listeners[0]")) == "listeners[0]: required"
    assert str(ConfigError("[3]", "bad").within("listeners")) == "listeners[3]: bad"
    assert err.path == "binary" and err.problem == "must be true or false"


class TestHelpers:
    """The helpers dialects use in ``validate``; absent keys give the default."""

    def test_absent_keys_give_defaults(self):
        assert opt_bool({}, "k", True) is True
        assert opt_int({}, "k", 5, minimum=10) == 5
        assert opt_number({}, "k", 1.5) == 1.5
        assert opt_str({}, "k", "x") == "x"
        assert opt_choice({}, "k", "a", ("a", "b")) == "a"
        assert opt_mapping({}, "k") == {}

    @pytest.mark.parametrize("helper", [opt_bool, opt_int, opt_number, opt_str])
    def test_required(self, helper):
        with pytest.raises(ConfigError) as info:
            helper({}, "k", REQUIRED)
        assert str(info.value) == "k: required"

    def test_opt_int_bounds(self):
        assert opt_int({"k": 3}, "k", 0, minimum=1, maximum=3) == 3
        with pytest.raises(ConfigError) as info:
            opt_int({"k": 4}, "k", 0, minimum=1, maximum=3)
        assert str(info.value) == "k: must be an integer from 1 to 3, got 4"
        with pytest.raises(ConfigError) as info:
            opt_int({"k": 4}, "k", 0, maximum=3)
        assert str(info.value) == "k: must be an integer <= 3, got 4"
        with pytest.raises(ConfigError) as info:
            opt_int({"k": None}, "k", 0)
        assert str(info.value) == "k: must be an integer, got null"
        assert opt_int({"k": None}, "k", 0, nullable=True) is None

    def test_opt_str_allow_empty(self):
        assert opt_str({"k": ""}, "k", "x", allow_empty=True) == ""

    def test_check_keys(self):
        check_keys({"a": 1}, ("a", "b"))
        with pytest.raises(ConfigError) as info:
            check_keys({"x": 1}, ())
        assert str(info.value) == "x: unknown key (no keys are allowed here)"
        with pytest.raises(ConfigError) as info:
            check_keys({1: "x"}, ("a",))
        assert str(info.value) == "1: unknown key (known: a)"
