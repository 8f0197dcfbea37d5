"""
Load and validate ``config.yaml``.

The file is read with ``yaml.safe_load`` and turned into frozen dataclasses, so
every other part of the gateway reads typed, already-checked values and never
re-validates.  Every problem becomes a :class:`ConfigError` whose one-line
message names the key path (``listeners[2].endpoint``) and what is wrong with it,
because an operator fixing a config file needs to know *where* first.

Checks are strict on purpose: unknown keys are errors (with the nearest known
key as a hint) so a typo never silently falls back to a default, and YAML types
are taken literally (``"yes"`` is not a boolean, ``true`` is not an integer).

Dialects validate their own listener options with the same ``check_keys`` /
``opt_*`` helpers that validate the built-in sections, so each kind of check
has one implementation and one wording.
"""

import dataclasses
import difflib
import math
import os
import re
import types
from collections.abc import Mapping

import yaml
from twisted.internet.endpoints import serverFromString

__all__ = [
    "REQUIRED",
    "ConfigError",
    "AccessConfig",
    "GatewayConfig",
    "GroupsConfig",
    "LimitsConfig",
    "ListenerConfig",
    "ListenerLimits",
    "MetricsConfig",
    "StorageConfig",
    "TopicsConfig",
    "check_keys",
    "load_config",
    "opt_bool",
    "opt_choice",
    "opt_int",
    "opt_mapping",
    "opt_number",
    "opt_str",
    "parse_config",
]


class ConfigError(Exception):
    """
    A problem in the configuration, located by its key path.

    ``path`` is relative to wherever the check ran: a dialect's ``validate``
    raises ``ConfigError("binary", ...)`` knowing nothing of its position in
    the file, and the loader re-raises it with :meth:`within` as
    ``listeners[2].binary``.  ``str()`` is a single line so a CLI can print it
    as is.
    """

    def __init__(self, path, problem):
        super().__init__(path, problem)
        self.path = path
        self.problem = problem

    def __str__(self):
        if not self.path:
            return self.problem
        return f"{self.path}: {self.problem}"

    def within(self, prefix):
        """
        Return the same error with ``prefix`` put in front of its path.

        Used by whoever validates a nested part of the file, so the inner check
        does not need to know where it sits.
        """
        return ConfigError(_join(prefix, self.path), self.problem)


def _join(prefix, path):
    """Join two key paths: ``a`` + ``b`` is ``a.b``; ``a`` + ``[0]`` is ``a[0]``."""
    if not prefix:
        return path
    if not path:
        return prefix
    if path.startswith("["):
        return prefix + path
    return f"{prefix}.{path}"


def _show(value):
    """
    Describe a YAML value for an error message, the way it was written.

    Strings keep their quotes and booleans/null use YAML spelling so that
    ``'5'`` (a string) and ``5`` (an integer) look different in the message;
    containers are named rather than dumped, to keep the message one line.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "...'"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def _hint(word, candidates):
    """The closest candidate to a misspelt ``word``, or None if none is close."""
    matches = difflib.get_close_matches(str(word), sorted(candidates), n=1)
    return matches[0] if matches else None


class _Required:
    """Type of :data:`REQUIRED`; its repr keeps signatures readable."""

    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()
"""Pass as ``default`` to an ``opt_*`` helper to make the key mandatory."""


def _lookup(options, key, default):
    """
    Fetch ``key`` for an ``opt_*`` helper.

    Returns ``(present, value)``: a missing optional key gives its default
    (which is trusted, not re-checked), a missing required key is an error.
    """
    if key in options:
        return True, options[key]
    if default is REQUIRED:
        raise ConfigError(key, "required")
    return False, default


def check_keys(options, known):
    """
    Reject keys of ``options`` that are not in ``known``.

    A misspelt key would otherwise be ignored and its default used in silence,
    which is the hardest kind of configuration bug to notice.  The error names
    the nearest known key when there is one, else lists them all.
    """
    known = set(known)
    for key in options:
        if key in known:
            continue
        path = key if isinstance(key, str) else _show(key)
        guess = _hint(key, known)
        if guess is not None:
            raise ConfigError(path, f"unknown key (did you mean {guess!r}?)")
        if known:
            raise ConfigError(path, f"unknown key (known: {', '.join(sorted(known))})")
        raise ConfigError(path, "unknown key (no keys are allowed here)")


def opt_mapping(options, key):
    """
    Return the nested mapping at ``key`` (an empty dict when absent).

    ``null`` is refused rather than read as "all defaults": for a section such
    as ``retention`` it could as well mean "no retention", and guessing wrong
    would delete data or keep it forever.
    """
    present, value = _lookup(options, key, {})
    if present and not isinstance(value, Mapping):
        raise ConfigError(key, f"must be a mapping, got {_show(value)}")
    return value


def opt_bool(options, key, default):
    """
    Return the boolean at ``key``.

    Only YAML booleans are accepted: ``"yes"`` or ``1`` are errors, because a
    quoted ``"false"`` that reads as true is worse than a refused start.
    """
    present, value = _lookup(options, key, default)
    if present and not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {_show(value)}")
    return value


def _range_text(minimum, maximum):
    """Word the allowed range of :func:`opt_int` for its error message."""
    if minimum is not None and maximum is not None:
        return f"an integer from {minimum} to {maximum}"
    if minimum is not None:
        return f"an integer >= {minimum}"
    if maximum is not None:
        return f"an integer <= {maximum}"
    return "an integer"


def opt_int(options, key, default, minimum=None, maximum=None, nullable=False):
    """
    Return the integer at ``key``, within ``minimum`` .. ``maximum`` inclusive.

    ``bool`` is a subclass of ``int`` in Python, so ``true`` would otherwise
    pass as 1; it is refused, as are floats (no silent truncation).  With
    ``nullable`` the key may be ``null`` (returned as None), for settings where
    null means "no limit".
    """
    present, value = _lookup(options, key, default)
    if not present or (nullable and value is None):
        return value
    expected = _range_text(minimum, maximum) + (" or null" if nullable else "")
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
    ):
        raise ConfigError(key, f"must be {expected}, got {_show(value)}")
    return value


def opt_number(options, key, default, above=None, nullable=False):
    """
    Return the finite number (int or float) at ``key``, greater than ``above``.

    For settings where fractions make sense (``retention.hours: 0.5``).  The
    bound is exclusive because such settings are durations, where 0 would be
    meaningless rather than a useful edge.  ``nullable`` as in :func:`opt_int`.
    """
    present, value = _lookup(options, key, default)
    if not present or (nullable and value is None):
        return value
    expected = "a number" if above is None else f"a number > {above}"
    expected += " or null" if nullable else ""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or (above is not None and value <= above)
    ):
        raise ConfigError(key, f"must be {expected}, got {_show(value)}")
    return value


def opt_str(options, key, default, allow_empty=False):
    """
    Return the string at ``key``.

    Empty strings are refused unless ``allow_empty``: for names, paths and
    endpoints an empty value is always a mistake (often an unset variable in
    a templated file).
    """
    present, value = _lookup(options, key, default)
    if not present:
        return value
    if not isinstance(value, str):
        raise ConfigError(key, f"must be a string, got {_show(value)}")
    if not value and not allow_empty:
        raise ConfigError(key, "must not be empty")
    return value


def opt_choice(options, key, default, choices):
    """Return the string at ``key``, which must be one of ``choices``."""
    present, value = _lookup(options, key, default)
    if not present or (isinstance(value, str) and value in choices):
        return value
    problem = f"must be one of {', '.join(sorted(choices))}, got {_show(value)}"
    guess = _hint(value, choices) if isinstance(value, str) else None
    if guess is not None:
        problem += f" (did you mean {guess!r}?)"
    raise ConfigError(key, problem)


@dataclasses.dataclass(frozen=True)
class StorageConfig:
    """
    Where and how the log store keeps its data (``storage:``).

    ``path`` is made absolute on construction: the store must not depend on
    the working directory of whoever starts the process.  The loader has
    already resolved a relative path against the config file's folder; in code,
    a relative path means relative to the current directory.
    """

    path: str = "./data"
    fsync: str = "interval"
    fsync_interval_ms: int = 5
    segment_bytes: int = 134217728
    segment_ms: int = 604800000
    index_interval_bytes: int = 4096
    retention_hours: float | None = 168
    retention_bytes: int | None = None
    retention_check_ms: int = 60000

    def __post_init__(self):
        absolute = os.path.abspath(os.path.expanduser(self.path))
        object.__setattr__(self, "path", absolute)


@dataclasses.dataclass(frozen=True)
class TopicsConfig:
    """Topic auto-creation and partition counts (``topics:``)."""

    auto_create: bool = True
    default_partitions: int = 1
    max_partitions: int = 1024


@dataclasses.dataclass(frozen=True)
class LimitsConfig:
    """The gateway-wide limits every dialect enforces (``limits:``)."""

    max_record_bytes: int = 1048576


@dataclasses.dataclass(frozen=True)
class GroupsConfig:
    """Bounds for the one group coordinator every dialect shares (``groups:``)."""

    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 300000


@dataclasses.dataclass(frozen=True)
class AccessConfig:
    """
    What one listener's clients may do (a listener's ``access:``).

    ``topics`` are shell-style patterns (``*``, ``?``, ``[...]``); a topic no
    pattern matches does not exist for the listener.  ``auto_create`` lets
    this listener's requests create topics implicitly, where
    ``topics.auto_create`` allows it too.  A ``read-only`` listener reads and
    commits consumer offsets but writes, creates and seals nothing.
    """

    mode: str = "read-write"
    topics: tuple = ("*",)
    auto_create: bool = True

    def __post_init__(self):
        object.__setattr__(self, "topics", tuple(self.topics))

    @property
    def read_only(self):
        return self.mode == "read-only"

    @property
    def unrestricted(self):
        """True when the rules refuse nothing (the default)."""
        return not self.read_only and self.auto_create and "*" in self.topics


@dataclasses.dataclass(frozen=True)
class ListenerLimits:
    """
    Bounds on one listener's connections (a listener's ``limits:``).

    None means "the dialect's own bound".  Limits only tighten: where a
    dialect has an option or a built-in bound for the same thing (TANK's
    ``max_frame_bytes``, Figg's ``max_buffered_bytes``, Kafka's 100 answers
    in flight, ...), the smaller of the two applies.
    """

    max_connections: int | None = None
    max_frame_bytes: int | None = None
    max_in_flight: int | None = None
    max_buffered_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """Where the metrics and the status page are served (``metrics:``); None: nowhere."""

    endpoint: str | None = None


@dataclasses.dataclass(frozen=True)
class ListenerConfig:
    """
    One entry of ``listeners:``.

    ``dialect`` is the dialect's name, not the dialect object, so a config
    stays plain data.  ``options`` holds the dialect's own keys as its
    ``validate`` returned them; it is a read-only mapping so that a frozen
    config is frozen all the way down.  ``access`` and ``limits`` are the
    keys every listener has, whatever its dialect, validated here and
    applied by the listener's view of the bus and the shared protocol
    classes, never by the dialect.
    """

    index: int
    dialect: str
    endpoint: str
    options: Mapping = dataclasses.field(default_factory=dict)
    access: AccessConfig = dataclasses.field(default_factory=AccessConfig)
    limits: ListenerLimits = dataclasses.field(default_factory=ListenerLimits)

    def __post_init__(self):
        object.__setattr__(self, "options", types.MappingProxyType(dict(self.options)))

    @property
    def path(self):
        """This listener's key path, for error messages raised after loading."""
        return f"listeners[{self.index}]"

    @property
    def identity(self):
        """What makes two configs the same listener (a reload keeps it
        running): its dialect, endpoint and the dialect's own options.
        Position, access rules and limits may change under it."""
        return (self.dialect, self.endpoint, tuple(sorted(
            (key, repr(value)) for key, value in self.options.items())))


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    """
    The whole, validated configuration.

    Every section defaults, so tests and benchmarks can build one in code
    (``GatewayConfig(listeners=(...))``).  ``source`` is the file it was read
    from, or None when built in code.
    """

    storage: StorageConfig = dataclasses.field(default_factory=StorageConfig)
    topics: TopicsConfig = dataclasses.field(default_factory=TopicsConfig)
    limits: LimitsConfig = dataclasses.field(default_factory=LimitsConfig)
    groups: GroupsConfig = dataclasses.field(default_factory=GroupsConfig)
    listeners: tuple = ()
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    source: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "listeners", tuple(self.listeners))


_SECTIONS = ("storage", "topics", "limits", "groups", "listeners", "metrics")
_LISTENER_KEYS = ("dialect", "endpoint")
#: keys every listener has, checked here rather than by its dialect
_COMMON_LISTENER_KEYS = ("access", "limits")
_LIMIT_KEYS = ("max_connections", "max_frame_bytes", "max_in_flight", "max_buffered_bytes")
_ACCESS_MODES = ("read-only", "read-write")
#: characters of a topic name, plus those of a shell-style pattern
_PATTERN_CHARS = re.compile(r"[A-Za-z0-9._*?\[\]!-]+")
#: Twisted ``ssl:`` endpoint arguments that name files
_ENDPOINT_FILE_ARGS = ("privateKey", "certKey", "extraCertChain", "dhParameters")
_FSYNC_MODES = ("always", "interval", "never")


def load_config(path, dialects, reactor=None):
    """
    Read and validate the config file at ``path``.

    ``dialects`` maps each known dialect name to its dialect object (see
    :func:`parse_config`).  Unreadable files and YAML syntax errors are
    ConfigErrors too, so the caller has one exception to report.
    """
    source = os.path.abspath(path)
    try:
        with open(source, "rb") as stream:
            data = yaml.safe_load(stream)
    except OSError as exc:
        raise ConfigError("", f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("", _yaml_problem(path, exc)) from None
    config = parse_config(data, os.path.dirname(source), dialects, reactor)
    return dataclasses.replace(config, source=source)


def _yaml_problem(path, exc):
    """Word a YAML error as ``file:line:column: ...`` (1-based, as editors count)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or problem is None:
        return f"{path}: invalid YAML: {exc}"
    return f"{path}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {problem}"


def parse_config(data, base_dir, dialects, reactor=None):
    """
    Validate the result of ``yaml.safe_load`` and build a :class:`GatewayConfig`.

    ``base_dir`` is what relative paths are relative to (the config file's
    folder).  ``dialects`` maps each known name to an object whose
    ``validate(options)`` checks a listener's own keys.  ``reactor`` is only
    handed to Twisted's endpoint parser, which stores it and does not listen.
    """
    if data is None:
        raise ConfigError("", "no listeners: the configuration is empty")
    if not isinstance(data, Mapping):
        raise ConfigError("", f"the top level must be a mapping, got {_show(data)}")
    check_keys(data, _SECTIONS)
    if reactor is None:
        # Imported here, not at module level, so that importing this module
        # never installs the default reactor behind the application's back.
        from twisted.internet import reactor
    listeners = _parse_listeners(data, dialects, reactor, base_dir)
    return GatewayConfig(
        storage=_section(data, "storage", _parse_storage, base_dir),
        topics=_section(data, "topics", _parse_topics),
        limits=_section(data, "limits", _parse_limits),
        groups=_section(data, "groups", _parse_groups),
        listeners=listeners,
        metrics=_section(data, "metrics", _parse_metrics, listeners, reactor, base_dir),
    )


def _section(options, key, parse, *args):
    """Parse the nested mapping at ``key``, prefixing its errors with ``key``."""
    section = opt_mapping(options, key)
    try:
        return parse(section, *args)
    except ConfigError as err:
        raise err.within(key) from None


def _parse_storage(section, base_dir):
    """``storage:``; a relative ``path`` is resolved against ``base_dir`` here."""
    check_keys(
        section,
        (
            "path",
            "fsync",
            "fsync_interval_ms",
            "segment_bytes",
            "segment_ms",
            "index_interval_bytes",
            "retention",
            "retention_check_ms",
        ),
    )
    path = opt_str(section, "path", StorageConfig.path)
    retention_hours, retention_bytes = _section(section, "retention", _parse_retention)
    return StorageConfig(
        path=os.path.join(base_dir, os.path.expanduser(path)),
        fsync=opt_choice(section, "fsync", StorageConfig.fsync, _FSYNC_MODES),
        fsync_interval_ms=opt_int(
            section, "fsync_interval_ms", StorageConfig.fsync_interval_ms, minimum=1
        ),
        segment_bytes=opt_int(
            section, "segment_bytes", StorageConfig.segment_bytes, minimum=1024
        ),
        segment_ms=opt_int(section, "segment_ms", StorageConfig.segment_ms, minimum=1),
        index_interval_bytes=opt_int(
            section, "index_interval_bytes", StorageConfig.index_interval_bytes, minimum=1
        ),
        retention_hours=retention_hours,
        retention_bytes=retention_bytes,
        retention_check_ms=opt_int(
            section, "retention_check_ms", StorageConfig.retention_check_ms, minimum=1
        ),
    )


def _parse_retention(section):
    """``retention: {hours, bytes}``; null in either means "no limit of that kind"."""
    check_keys(section, ("hours", "bytes"))
    hours = opt_number(
        section, "hours", StorageConfig.retention_hours, above=0, nullable=True
    )
    size = opt_int(
        section, "bytes", StorageConfig.retention_bytes, minimum=1, nullable=True
    )
    return hours, size


def _parse_topics(section):
    """``topics:``; auto-created topics must themselves respect the maximum."""
    check_keys(section, ("auto_create", "default_partitions", "max_partitions"))
    auto_create = opt_bool(section, "auto_create", TopicsConfig.auto_create)
    maximum = opt_int(section, "max_partitions", TopicsConfig.max_partitions, minimum=1)
    default = opt_int(
        section, "default_partitions", TopicsConfig.default_partitions, minimum=1
    )
    if default > maximum:
        raise ConfigError(
            "default_partitions",
            f"must not exceed max_partitions ({maximum}), got {default}",
        )
    return TopicsConfig(auto_create, default, maximum)


def _parse_limits(section):
    """``limits:``, the gateway-wide record size every dialect enforces."""
    check_keys(section, ("max_record_bytes",))
    return LimitsConfig(
        opt_int(section, "max_record_bytes", LimitsConfig.max_record_bytes, minimum=1)
    )


def _parse_groups(section):
    """``groups:``; an empty session-timeout range would refuse every member."""
    check_keys(section, ("min_session_timeout_ms", "max_session_timeout_ms"))
    low = opt_int(
        section, "min_session_timeout_ms", GroupsConfig.min_session_timeout_ms, minimum=1
    )
    high = opt_int(
        section, "max_session_timeout_ms", GroupsConfig.max_session_timeout_ms, minimum=1
    )
    if high < low:
        # Either key may be the one left at its default; say so, or the
        # operator is told about a number that is nowhere in the file.
        got = str(high) if "max_session_timeout_ms" in section else f"the default {high}"
        raise ConfigError(
            "max_session_timeout_ms",
            f"must be >= min_session_timeout_ms ({low}), got {got}",
        )
    return GroupsConfig(low, high)


def _parse_metrics(section, listeners, reactor, base_dir):
    """``metrics: {endpoint}``; the endpoint may not be one a listener uses."""
    check_keys(section, ("endpoint",))
    endpoint = opt_str(section, "endpoint", None)
    if endpoint is None:
        return MetricsConfig()
    endpoint = _resolve_endpoint_files(endpoint, base_dir)
    port = _endpoint_port(endpoint, reactor)
    for listener in listeners:
        if port != 0 and listener.endpoint == endpoint:
            raise ConfigError("endpoint", f"{endpoint!r} is already used by {listener.path}")
    return MetricsConfig(endpoint)


def _parse_access(section):
    """A listener's ``access: {mode, topics, auto_create}``."""
    check_keys(section, ("mode", "topics", "auto_create"))
    mode = opt_choice(section, "mode", AccessConfig.mode, _ACCESS_MODES)
    topics = AccessConfig.topics
    if "topics" in section:
        patterns = section["topics"]
        if not isinstance(patterns, list) or not patterns:
            raise ConfigError("topics", f"must be a non-empty list of topic name patterns, "
                                        f"got {_show(patterns)}")
        for i, pattern in enumerate(patterns):
            if not isinstance(pattern, str) or not _PATTERN_CHARS.fullmatch(pattern):
                raise ConfigError(f"topics[{i}]", f"must be a topic name pattern (letters, "
                                                  f"digits, '._-' and '*?[]!'), "
                                                  f"got {_show(pattern)}")
        topics = tuple(patterns)
    auto_create = opt_bool(section, "auto_create", AccessConfig.auto_create)
    return AccessConfig(mode, topics, auto_create)


def _parse_listener_limits(section, supported):
    """A listener's ``limits:``; ``supported`` are the keys its dialect honours."""
    check_keys(section, _LIMIT_KEYS)
    for key in section:
        if key not in supported:
            raise ConfigError(key, "not enforced by this dialect (supported: "
                                   f"{', '.join(supported) or 'none'})")
    return ListenerLimits(
        max_connections=opt_int(section, "max_connections", None, minimum=1, nullable=True),
        # A smaller frame could not carry a Pravega SetupAppend with a long name.
        max_frame_bytes=opt_int(section, "max_frame_bytes", None, minimum=4096,
                                maximum=(1 << 32) - 1, nullable=True),
        max_in_flight=opt_int(section, "max_in_flight", None, minimum=1, nullable=True),
        # Twice Twisted's own send buffer, which Figg's streaming writes count on.
        max_buffered_bytes=opt_int(section, "max_buffered_bytes", None, minimum=131072,
                                   nullable=True),
    )


def _split_endpoint(endpoint):
    """Split an endpoint string at its unescaped colons, keeping escapes."""
    return re.split(r"(?<!\\):", endpoint)


def _resolve_endpoint_files(endpoint, base_dir):
    """
    Make the files an ``ssl:`` endpoint names relative to ``base_dir``.

    Relative paths in the config are relative to its folder, the endpoint
    strings included; Twisted would read them relative to the working
    directory.  Other endpoint kinds name no files and are left alone.
    """
    parts = _split_endpoint(endpoint)
    if parts[0] != "ssl" or base_dir is None:
        return endpoint
    for i, part in enumerate(parts):
        key, sep, value = part.partition("=")
        if sep and key in _ENDPOINT_FILE_ARGS and value:
            path = value.replace("\\:", ":").replace("\\=", "=")
            if not os.path.isabs(os.path.expanduser(path)):
                path = os.path.join(base_dir, path)
                parts[i] = key + "=" + path.replace(":", "\\:").replace("=", "\\=")
    return ":".join(parts)


def _parse_listeners(data, dialects, reactor, base_dir=None):
    """
    Parse ``listeners:``, each entry checked by its own dialect.

    Two listeners on the same endpoint string would fail at listen time with
    an "address in use" that names neither; it is caught here instead.  Port 0
    (any free port, used by tests) may repeat, since each gets its own port.
    """
    if "listeners" not in data:
        raise ConfigError("listeners", "required (at least one listener)")
    entries = data["listeners"]
    if not isinstance(entries, list):
        raise ConfigError("listeners", f"must be a list of listeners, got {_show(entries)}")
    if not entries:
        raise ConfigError("listeners", "must list at least one listener")
    listeners = []
    first_use = {}
    for index, entry in enumerate(entries):
        path = f"listeners[{index}]"
        try:
            listener, port = _parse_listener(index, entry, dialects, reactor, base_dir)
        except ConfigError as err:
            raise err.within(path) from None
        if port != 0 and listener.endpoint in first_use:
            raise ConfigError(
                f"{path}.endpoint",
                f"{listener.endpoint!r} is already used by {first_use[listener.endpoint]}",
            )
        first_use.setdefault(listener.endpoint, path)
        listeners.append(listener)
    listeners = tuple(listeners)
    for listener in listeners:
        # A dialect whose listener depends on another one (the Pravega
        # controller serves the scope of a Pravega listener) checks that here,
        # with every listener known; its errors are relative to its listener.
        check = getattr(dialects[listener.dialect], "check_listeners", None)
        if check is not None:
            try:
                check(listener, listeners)
            except ConfigError as err:
                raise err.within(listener.path) from None
    return listeners


def _parse_listener(index, entry, dialects, reactor, base_dir=None):
    """
    Parse one listener; return it with its port (None if it has no port).

    Errors are relative to the listener, like those of the dialect's own
    ``validate``, which sees only its own keys: ``access`` and ``limits``
    are checked here, once for every dialect.  A dialect that enforces only
    some of the limits (one that serves through a server library of its own
    rather than the shared protocol classes) says which in
    ``listener_limits``; the others are errors on its listeners.
    """
    if not isinstance(entry, Mapping):
        raise ConfigError(
            "", f"must be a mapping with dialect and endpoint, got {_show(entry)}"
        )
    known = ", ".join(sorted(dialects)) or "none"
    if "dialect" not in entry:
        raise ConfigError("dialect", f"required (known: {known})")
    name = opt_str(entry, "dialect", REQUIRED)
    if name not in dialects:
        guess = _hint(name, dialects)
        hint = f"; did you mean {guess!r}?" if guess is not None else ""
        raise ConfigError("dialect", f"unknown dialect {name!r} (known: {known}{hint})")
    endpoint = _resolve_endpoint_files(opt_str(entry, "endpoint", REQUIRED), base_dir)
    port = _endpoint_port(endpoint, reactor)
    dialect = dialects[name]
    access = _section(entry, "access", _parse_access)
    limits = _section(entry, "limits", _parse_listener_limits,
                      tuple(getattr(dialect, "listener_limits", _LIMIT_KEYS)))
    options = {key: value for key, value in entry.items()
               if key not in _LISTENER_KEYS and key not in _COMMON_LISTENER_KEYS}
    validated = dialect.validate(dict(options))
    return ListenerConfig(index, name, endpoint, options if validated is None else validated,
                          access, limits), port


def _endpoint_port(endpoint, reactor):
    """
    Check that Twisted can parse ``endpoint`` as a server endpoint; return its port.

    ``serverFromString`` only builds the endpoint object, it does not listen.
    Any exception it raises means the string is unusable: ValueError and
    TypeError for bad syntax or arguments, but also ImportError (``ssl:``
    without pyOpenSSL) or OSError (a missing certificate file), so all are
    caught.  Twisted keeps no public record of the port, hence ``_port``
    (set by its TCP and SSL endpoints); it is checked for range here because
    Twisted accepts any integer and would fail only at listen time.
    """
    try:
        parsed = serverFromString(reactor, endpoint)
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        raise ConfigError("endpoint", f"not a valid Twisted endpoint string: {reason}") from None
    port = getattr(parsed, "_port", None)
    if isinstance(port, int) and not 0 <= port <= 65535:
        raise ConfigError("endpoint", f"port {port} is out of range 0-65535")
    return port
