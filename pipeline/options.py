"""The data source's options and offset planning, apart from Spark.

Everything here is plain Python on plain values (no Spark, no sockets), so
that the rules a user meets — which options exist, what an offsets JSON may
say, how a range is cut into splits and how a trigger is rate-limited — are
tested on their own and behave the same on the driver and in tests.

Offsets travel as ``{topic: {partition: offset}}`` with the partition as a
string: that is what Spark's offset log stores as JSON (its keys are
strings), so a checkpointed offset reads back equal to the one written.
"""
import difflib
import fnmatch
import json
from dataclasses import dataclass

__all__ = ["EARLIEST", "LATEST", "OptionError", "ReadOptions", "TopicSelector", "WriteOptions",
           "cap_offsets", "check_named_partitions", "parse_endpoint", "resolve", "split_ranges"]

#: offsets JSON values meaning "the log start" and "the high watermark", as in
#: Spark's own Kafka source
EARLIEST = -2
LATEST = -1

DEFAULT_ENDPOINT = "127.0.0.1:9092"
#: glob characters: a topic name never contains them, so an entry of
#: ``topics`` with one of them is a pattern and anything else is a name
_GLOB = frozenset("*?[]")

_READ_KEYS = {
    "endpoint": "endpoint",
    "topics": "topics",
    "startingoffsets": "startingOffsets",
    "endingoffsets": "endingOffsets",
    "maxrecordspersplit": "maxRecordsPerSplit",
    "maxrecordspertrigger": "maxRecordsPerTrigger",
}
_WRITE_KEYS = {
    "endpoint": "endpoint",
    "topic": "topic",
    # Spark hands a streaming sink the query's own options as well.
    "checkpointlocation": "checkpointLocation",
    "queryname": "queryName",
}


class OptionError(ValueError):
    """An option (or a row, for writers) the data source cannot use; the
    message names the option and says what is accepted."""


def _check_keys(options, known):
    for key in options:
        if key.lower() not in known:
            hint = difflib.get_close_matches(key.lower(), known, n=1)
            spelled = f" (did you mean {known[hint[0]]!r}?)" if hint else ""
            raise OptionError(f"unknown option {key!r}{spelled}; the gateway data source "
                              f"takes {', '.join(sorted(known.values()))}")


def _get(options, name):
    """An option by its case-insensitive name (Spark lower-cases them)."""
    for key, value in options.items():
        if key.lower() == name.lower():
            return value
    return None


def parse_endpoint(text):
    """``host:port`` of the gateway's Kafka listener -> ``(host, port)``."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionError(f"endpoint: {text!r} is not host:port (the gateway's Kafka "
                          f"listener, e.g. {DEFAULT_ENDPOINT})")
    return host.strip("[]"), int(port)


def _positive_int(options, name):
    value = _get(options, name)
    if value is None:
        return None
    try:
        number = int(str(value))
    except ValueError:
        number = 0
    if number <= 0:
        raise OptionError(f"{name}: {value!r} is not a positive integer")
    return number


def _parse_offsets(options, name, default):
    """``earliest``, ``latest`` or JSON ``{"topic": {"0": 12, "1": -2}}``
    (-2 earliest, -1 latest). Returns the keyword or ``{topic: {partition
    (int): offset}}``."""
    text = _get(options, name)
    if text is None:
        return default
    word = str(text).strip().lower()
    if word in ("earliest", "latest"):
        return word
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not doc:
        raise OptionError(f'{name}: {text!r} is not earliest, latest or JSON like '
                          f'{{"topic": {{"0": 42}}}}')
    spec = {}
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise OptionError(f"{name}: topic {topic!r} needs an object of partition: offset")
        spec[topic] = {}
        for partition, offset in parts.items():
            if not str(partition).isdigit():
                raise OptionError(f"{name}: {topic!r} partition {partition!r} is not a "
                                  f"partition number")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise OptionError(f"{name}: {topic}/{partition} offset {offset!r} is not an "
                                  f"offset, -2 (earliest) or -1 (latest)")
            spec[topic][int(partition)] = offset
    return spec


@dataclass(frozen=True)
class TopicSelector:
    """The ``topics`` option: comma-separated names and glob patterns
    (``logs-*``). Topics are matched against the gateway's topic list at
    planning time, so a pattern picks up topics created later."""
    names: tuple
    patterns: tuple

    @classmethod
    def parse(cls, text):
        entries = [e.strip() for e in str(text or "").split(",") if e.strip()]
        if not entries:
            raise OptionError("topics: required (names or glob patterns, comma-separated)")
        return cls(tuple(e for e in entries if not _GLOB & set(e)),
                   tuple(e for e in entries if _GLOB & set(e)))

    def select(self, existing):
        """The selected topics among ``existing`` (sorted), and the named
        ones that do not exist."""
        chosen = {t for t in existing if t in self.names
                  or any(fnmatch.fnmatchcase(t, p) for p in self.patterns)}
        return sorted(chosen), [n for n in self.names if n not in existing]

    def covers(self, topic):
        return topic in self.names or any(fnmatch.fnmatchcase(topic, p) for p in self.patterns)


@dataclass(frozen=True)
class ReadOptions:
    endpoint: tuple
    topics: TopicSelector
    starting: object
    ending: object
    max_records_per_split: object
    max_records_per_trigger: object

    @classmethod
    def parse(cls, options, streaming):
        """Validate a reader's options. Batch reads default to
        ``earliest``..``latest``; streams start at ``latest`` (the records
        that arrive from now on) and have no end."""
        _check_keys(options, _READ_KEYS)
        if streaming and _get(options, "endingOffsets") is not None:
            raise OptionError("endingOffsets: applies to batch reads only (a stream has no end)")
        if not streaming and _get(options, "maxRecordsPerTrigger") is not None:
            raise OptionError("maxRecordsPerTrigger: applies to streaming reads only")
        selector = TopicSelector.parse(_get(options, "topics"))
        read = cls(parse_endpoint(_get(options, "endpoint") or DEFAULT_ENDPOINT), selector,
                   _parse_offsets(options, "startingOffsets",
                                  "latest" if streaming else "earliest"),
                   _parse_offsets(options, "endingOffsets", "latest"),
                   _positive_int(options, "maxRecordsPerSplit"),
                   _positive_int(options, "maxRecordsPerTrigger"))
        for name, spec in (("startingOffsets", read.starting), ("endingOffsets", read.ending)):
            if isinstance(spec, dict):
                for topic in spec:
                    if not selector.covers(topic):
                        raise OptionError(f"{name}: topic {topic!r} is not among the "
                                          f"topics read ({_get(options, 'topics')})")
        return read


@dataclass(frozen=True)
class WriteOptions:
    endpoint: tuple
    topic: object

    @classmethod
    def parse(cls, options):
        _check_keys(options, _WRITE_KEYS)
        topic = _get(options, "topic")
        return cls(parse_endpoint(_get(options, "endpoint") or DEFAULT_ENDPOINT),
                   topic.strip() if topic and topic.strip() else None)


def resolve(spec, topic, partition, earliest, latest, name):
    """The offset ``spec`` (a keyword or parsed JSON) gives one partition
    whose log runs from ``earliest`` to ``latest`` (the high watermark). A
    partition the JSON does not name falls back to the option's default
    end of the log: the start for ``startingOffsets``, the end for
    ``endingOffsets``. Offsets outside the log are errors, since reading
    them would silently skip records or wait for records that do not
    exist."""
    if spec == "earliest":
        return earliest
    if spec == "latest":
        return latest
    offset = spec.get(topic, {}).get(partition,
                                     EARLIEST if name == "startingOffsets" else LATEST)
    if offset == EARLIEST:
        return earliest
    if offset == LATEST:
        return latest
    if not earliest <= offset <= latest:
        raise OptionError(f"{name}: offset {offset} of {topic}/{partition} is outside the "
                          f"log, which holds offsets {earliest} to {latest - 1}"
                          if latest > earliest else
                          f"{name}: offset {offset} of {topic}/{partition} is outside the "
                          f"log, which is empty at offset {latest}")
    return offset


def check_named_partitions(spec, partitions, name):
    """Every partition a JSON spec names must exist (a typo would otherwise
    read a default range without a word)."""
    if not isinstance(spec, dict):
        return
    for topic, parts in spec.items():
        for partition in parts:
            if partition not in partitions.get(topic, ()):
                raise OptionError(f"{name}: {topic}/{partition} does not exist")


def split_ranges(ranges, max_records):
    """``[(topic, partition, start, end)]`` -> the same ranges cut into
    pieces of at most ``max_records`` offsets (None: one piece per range),
    covering every offset exactly once. Empty ranges give no piece."""
    splits = []
    for topic, partition, start, end in ranges:
        step = max_records or max(end - start, 1)
        for at in range(start, end, step):
            splits.append((topic, partition, at, min(at + step, end)))
    return splits


def cap_offsets(start, latest, max_records):
    """The end offsets of one trigger: ``latest`` when the backlog is at
    most ``max_records`` (or there is no cap), else a share of the cap per
    partition in proportion to its backlog, as Spark's Kafka source does, so
    that one busy partition does not starve the others. Deterministic:
    floors first, then the remainder one record at a time in topic and
    partition order. Both offset maps are ``{topic: {partition: offset}}``
    over the same partitions."""
    backlog = {(t, p): latest[t][p] - start[t][p] for t in latest for p in latest[t]}
    total = sum(backlog.values())
    if max_records is None or total <= max_records:
        return latest
    shares = {tp: n * max_records // total for tp, n in backlog.items()}
    left = max_records - sum(shares.values())
    for tp in sorted(backlog, key=lambda tp: (tp[0], int(tp[1]))):
        if left == 0:
            break
        if shares[tp] < backlog[tp]:
            shares[tp] += 1
            left -= 1
    return {t: {p: start[t][p] + shares[(t, p)] for p in latest[t]} for t in latest}
