"""The operations keys of config.yaml: ``metrics:``, and the ``access:`` and
``limits:`` every listener has, validated once for every dialect (errors
name the key path) while each dialect's own ``validate`` sees only its own
keys; ``ssl:`` endpoint files relative to the config file's folder."""
import os

import pytest

from gateway.config import (
    AccessConfig, ConfigError, ListenerLimits, MetricsConfig, load_config, parse_config)
from gateway.dialects import find_dialects

DIALECTS = find_dialects()
LOCAL = "tcp:0:interface=127.0.0.1"


def parse(doc):
    return parse_config(doc, "/tmp", DIALECTS)


def listener(**keys):
    return {"listeners": [{"dialect": "tank", "endpoint": LOCAL, **keys}]}


def error(doc):
    with pytest.raises(ConfigError) as caught:
        parse(doc)
    return str(caught.value)


def test_defaults_restrict_nothing():
    config = parse(listener())
    [tank] = config.listeners
    assert tank.access == AccessConfig() and tank.access.unrestricted
    assert tank.limits == ListenerLimits()
    assert config.metrics == MetricsConfig(None)


def test_access_and_limits_are_parsed():
    config = parse(listener(access={"mode": "read-only", "topics": ["logs.*", "a?[bc]"],
                                    "auto_create": False},
                            limits={"max_connections": 10, "max_frame_bytes": 65536,
                                    "max_in_flight": 8, "max_buffered_bytes": 1 << 20}))
    [tank] = config.listeners
    assert tank.access == AccessConfig("read-only", ("logs.*", "a?[bc]"), False)
    assert tank.access.read_only and not tank.access.unrestricted
    assert tank.limits == ListenerLimits(10, 65536, 8, 1 << 20)


def test_the_dialect_still_validates_its_own_keys():
    [tank] = parse(listener(max_frame_bytes=2048, access={"mode": "read-only"})).listeners
    assert tank.options == {"max_frame_bytes": 2048}
    assert error(listener(max_frame_bytes=1)) == \
        "listeners[0].max_frame_bytes: must be an integer from 1024 to 268435456, got 1"
    assert "listeners[0].acess: unknown key" in error(listener(acess={}))


@pytest.mark.parametrize("keys, message", [
    ({"access": {"mode": "write-only"}},
     "listeners[0].access.mode: must be one of read-only, read-write, got 'write-only' "
     "(did you mean 'read-only'?)"),
    ({"access": {"topics": "logs.*"}},
     "listeners[0].access.topics: must be a non-empty list of topic name patterns, "
     "got 'logs.*'"),
    ({"access": {"topics": []}},
     "listeners[0].access.topics: must be a non-empty list of topic name patterns, got a list"),
    ({"access": {"topics": ["ok", "no/slash"]}},
     "listeners[0].access.topics[1]: must be a topic name pattern (letters, digits, '._-' "
     "and '*?[]!'), got 'no/slash'"),
    ({"access": {"auto_create": "no"}},
     "listeners[0].access.auto_create: must be true or false, got 'no'"),
    ({"access": {"mood": "read-only"}},
     "listeners[0].access.mood: unknown key (did you mean 'mode'?)"),
    ({"access": None}, "listeners[0].access: must be a mapping, got null"),
    ({"limits": {"max_connections": 0}},
     "listeners[0].limits.max_connections: must be an integer >= 1 or null, got 0"),
    ({"limits": {"max_frame_bytes": 100}},
     "listeners[0].limits.max_frame_bytes: must be an integer from 4096 to 4294967295 or "
     "null, got 100"),
    ({"limits": {"max_buffered_bytes": 1024}},
     "listeners[0].limits.max_buffered_bytes: must be an integer >= 131072 or null, got 1024"),
    ({"limits": {"max_inflight": 3}},
     "listeners[0].limits.max_inflight: unknown key (did you mean 'max_in_flight'?)"),
])
def test_errors_name_the_key(keys, message):
    assert error(listener(**keys)) == message


def test_null_limits_mean_the_dialects_own():
    [tank] = parse(listener(limits={"max_connections": None})).listeners
    assert tank.limits.max_connections is None


def test_a_dialect_may_enforce_only_some_limits():
    class GrpcLike:
        name = "grpc-like"
        formats = {}
        listener_limits = ("max_connections",)

        def validate(self, options):
            return {}

    dialects = dict(DIALECTS, **{"grpc-like": GrpcLike()})
    doc = {"listeners": [{"dialect": "grpc-like", "endpoint": LOCAL,
                          "limits": {"max_frame_bytes": 8192}}]}
    with pytest.raises(ConfigError) as caught:
        parse_config(doc, "/tmp", dialects)
    assert str(caught.value) == ("listeners[0].limits.max_frame_bytes: not enforced by this "
                                 "dialect (supported: max_connections)")


def test_metrics_endpoint():
    doc = {**listener(), "metrics": {"endpoint": "tcp:9100:interface=127.0.0.1"}}
    assert parse(doc).metrics == MetricsConfig("tcp:9100:interface=127.0.0.1")
    assert error({**listener(), "metrics": {"endpoint": "nonsense:1"}}).startswith(
        "metrics.endpoint: not a valid Twisted endpoint string")
    assert error({**listener(), "metrics": {"endpiont": LOCAL}}) == \
        "metrics.endpiont: unknown key (did you mean 'endpoint'?)"
    clash = {"listeners": [{"dialect": "tank", "endpoint": "tcp:9100"}],
             "metrics": {"endpoint": "tcp:9100"}}
    assert error(clash) == "metrics.endpoint: 'tcp:9100' is already used by listeners[0]"
    assert error({**listener(), "metrics": {"endpoint": "tcp:70000"}}) == \
        "metrics.endpoint: port 70000 is out of range 0-65535"


def test_listener_identity_ignores_position_rules_and_limits():
    a = parse({"listeners": [{"dialect": "tank", "endpoint": LOCAL},
                             {"dialect": "rustlog", "endpoint": "tcp:9093"}]}).listeners[1]
    b = parse({"listeners": [{"dialect": "rustlog", "endpoint": "tcp:9093",
                              "access": {"mode": "read-only"},
                              "limits": {"max_connections": 3}}]}).listeners[0]
    c = parse({"listeners": [{"dialect": "rustlog", "endpoint": "tcp:9093",
                              "binary": False}]}).listeners[0]
    assert a.identity == b.identity
    assert a.identity != c.identity


def test_ssl_endpoint_files_are_relative_to_the_config_folder(tmp_path):
    from tests.ops_support import make_certificate
    tls = tmp_path / "tls"
    tls.mkdir()
    make_certificate(str(tls))
    path = tmp_path / "config.yaml"
    path.write_text("listeners:\n  - dialect: rustlog\n"
                    "    endpoint: ssl:0:interface=127.0.0.1:privateKey=tls/key.pem:"
                    "certKey=tls/cert.pem\n"
                    "metrics: {endpoint: 'ssl:0:privateKey=tls/key.pem:certKey=tls/cert.pem'}\n")
    config = load_config(str(path), DIALECTS)
    assert config.listeners[0].endpoint == (
        f"ssl:0:interface=127.0.0.1:privateKey={tls}/key.pem:certKey={tls}/cert.pem")
    assert config.metrics.endpoint == f"ssl:0:privateKey={tls}/key.pem:certKey={tls}/cert.pem"
    os.rename(tls / "key.pem", tls / "gone.pem")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path), DIALECTS)
    assert str(caught.value).startswith(
        "listeners[0].endpoint: not a valid Twisted endpoint string")
