"""The Spark data source's parts that need no Spark: options, offset
planning, the Arrow decoding of fetched message sets and the validation of
rows to write; and the Fetch v2 answers (magic 1, with timestamps) the
source reads, from a real gateway subprocess."""
import re
import shutil
import socket
import struct
import tempfile
import zlib
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from pipeline.arrow import DataLossError, encode_rows, fetched_batch
from pipeline.options import (
    OptionError,
    ReadOptions,
    TopicSelector,
    WriteOptions,
    cap_offsets,
    resolve,
    split_ranges,
)
from plugins.kafka import codec as kc
from plugins.kafka.client import KafkaClient
from plugins.rustlog import codec as rc
from tests.support import GatewayProcess


def rustlog_produce(port, topic, values, partition=0):
    """Produce ``values`` through a RustLog JSON frame on a plain socket (the
    RustLog client needs a reactor); returns the offsets the gateway gave."""
    payload = rc.encode_request(rc.JSON, rc.ProduceRequest(topic, partition, tuple(values)))
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        s.sendall(struct.pack(">I", len(payload)) + payload)
        size = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
        _, answer = rc.decode_response(s.recv(size, socket.MSG_WAITALL))
    assert isinstance(answer, rc.ProduceResponse), answer
    return answer.offsets


def rustlog_create(port, topic, partitions):
    """Create a topic of ``partitions`` partitions (RustLog's binary CreateTopic)."""
    payload = rc.encode_request(rc.BINARY, rc.CreateTopicRequest(topic, partitions))
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        s.sendall(struct.pack(">I", len(payload)) + payload)
        size = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
        _, answer = rc.decode_response(s.recv(size, socket.MSG_WAITALL))
    assert isinstance(answer, rc.CreateTopicResponse), answer


def rustlog_fetch(port, topic, offset, partition=0):
    """``[(offset, value)]`` from ``offset`` through a RustLog JSON fetch."""
    payload = rc.encode_request(rc.JSON, rc.FetchRequest(topic, partition, offset, 1 << 20))
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        s.sendall(struct.pack(">I", len(payload)) + payload)
        size = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
        _, answer = rc.decode_response(s.recv(size, socket.MSG_WAITALL))
    assert isinstance(answer, rc.FetchResponse), answer
    return list(answer.records)


# -- options ----------------------------------------------------------------------------

def test_read_options_defaults():
    batch = ReadOptions.parse({"topics": "events"}, streaming=False)
    assert batch.endpoint == ("127.0.0.1", 9092)
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert batch.max_records_per_split is None
    stream = ReadOptions.parse({"topics": "events", "endpoint": "gw:19092"}, streaming=True)
    assert stream.starting == "latest"
    assert stream.endpoint == ("gw", 19092)


def test_options_are_case_insensitive_and_spark_lower_cases_them():
    options = ReadOptions.parse({"topics": "t", "maxrecordspersplit": "10",
                                 "STARTINGOFFSETS": '{"t": {"0": 5}}'}, streaming=False)
    assert options.max_records_per_split == 10
    assert options.starting == {"t": {0: 5}}


@pytest.mark.parametrize("options, streaming, message", [
    ({}, False, "topics: required"),
    ({"topics": " , "}, False, "topics: required"),
    ({"topics": "t", "startingOffset": "earliest"}, False,
     "unknown option 'startingOffset' (did you mean 'startingOffsets'?)"),
    ({"topics": "t", "endpoint": "localhost"}, False, "is not host:port"),
    ({"topics": "t", "endpoint": "h:70000"}, False, "is not host:port"),
    ({"topics": "t", "maxRecordsPerSplit": "0"}, False, "not a positive integer"),
    ({"topics": "t", "maxRecordsPerSplit": "ten"}, False, "not a positive integer"),
    ({"topics": "t", "startingOffsets": "first"}, False, "is not earliest, latest or JSON"),
    ({"topics": "t", "startingOffsets": '{"t": [1]}'}, False, "needs an object"),
    ({"topics": "t", "startingOffsets": '{"t": {"x": 1}}'}, False, "not a partition number"),
    ({"topics": "t", "startingOffsets": '{"t": {"0": -3}}'}, False, "is not an offset"),
    ({"topics": "t", "startingOffsets": '{"t": {"0": "5"}}'}, False, "is not an offset"),
    ({"topics": "t", "endingOffsets": '{"u": {"0": 5}}'}, False,
     "topic 'u' is not among the topics read"),
    ({"topics": "t", "endingOffsets": "latest"}, True, "applies to batch reads only"),
    ({"topics": "t", "maxRecordsPerTrigger": "5"}, False, "applies to streaming reads only"),
])
def test_bad_read_options_are_named(options, streaming, message):
    with pytest.raises(OptionError, match=re.escape(message)):
        ReadOptions.parse(options, streaming)


def test_write_options():
    assert WriteOptions.parse({"topic": " out "}) == WriteOptions(("127.0.0.1", 9092), "out")
    assert WriteOptions.parse({"checkpointLocation": "/tmp/x"}).topic is None
    with pytest.raises(OptionError, match="unknown option 'topics'"):
        WriteOptions.parse({"topics": "a"})


def test_topics_are_names_or_glob_patterns():
    selector = TopicSelector.parse("orders, logs-*,audit.v2")
    assert selector.names == ("orders", "audit.v2")
    assert selector.patterns == ("logs-*",)
    chosen, missing = selector.select({"logs-a", "logs-b", "logsx", "audit.v2", "auditxv2"})
    assert chosen == ["audit.v2", "logs-a", "logs-b"]
    assert missing == ["orders"]
    # "." is a character of names, never a pattern: audit.v2 does not match auditxv2.
    assert not selector.covers("auditxv2")


def test_resolve_offsets():
    spec = {"t": {0: 5, 1: -2, 2: -1}}
    assert resolve(spec, "t", 0, 0, 10, "startingOffsets") == 5
    assert resolve(spec, "t", 1, 3, 10, "startingOffsets") == 3
    assert resolve(spec, "t", 2, 3, 10, "startingOffsets") == 10
    # Partitions the JSON does not name: the start for starting, the end for ending.
    assert resolve(spec, "t", 3, 4, 9, "startingOffsets") == 4
    assert resolve(spec, "t", 3, 4, 9, "endingOffsets") == 9
    assert resolve("earliest", "t", 0, 4, 9, "x") == 4
    assert resolve("latest", "t", 0, 4, 9, "x") == 9
    with pytest.raises(OptionError, match="offset 5 of t/0 is outside the log, which holds "
                                          "offsets 6 to 9"):
        resolve(spec, "t", 0, 6, 10, "startingOffsets")
    with pytest.raises(OptionError, match="which is empty at offset 0"):
        resolve(spec, "t", 0, 0, 0, "endingOffsets")


def test_split_ranges_cover_every_offset_once():
    ranges = [("a", 0, 0, 10), ("a", 1, 5, 5), ("b", 0, 3, 7)]
    assert split_ranges(ranges, None) == [("a", 0, 0, 10), ("b", 0, 3, 7)]
    assert split_ranges(ranges, 4) == [("a", 0, 0, 4), ("a", 0, 4, 8), ("a", 0, 8, 10),
                                       ("b", 0, 3, 7)]
    assert split_ranges(ranges, 1)[-4:] == [("b", 0, o, o + 1) for o in range(3, 7)]


def test_cap_offsets_shares_the_cap_by_backlog():
    start = {"a": {"0": 0, "1": 100}, "b": {"0": 7}}
    latest = {"a": {"0": 300, "1": 200}, "b": {"0": 7}}
    assert cap_offsets(start, latest, None) == latest
    assert cap_offsets(start, latest, 400) == latest
    capped = cap_offsets(start, latest, 100)
    assert capped == {"a": {"0": 75, "1": 125}, "b": {"0": 7}}
    # Remainders go one at a time, in order; the total is the cap exactly.
    odd = cap_offsets({"t": {"0": 0, "1": 0, "2": 0}}, {"t": {"0": 1, "1": 1, "2": 1}}, 2)
    assert odd == {"t": {"0": 1, "1": 1, "2": 0}}
    many = cap_offsets({"t": {str(p): 0 for p in range(7)}},
                       {"t": {str(p): 10 * p + 3 for p in range(7)}}, 50)
    assert sum(many["t"].values()) == 50


# -- reading message sets into Arrow ---------------------------------------------------

def _entries(first, records, magic=1):
    return b"".join(kc.encode_entry(first + i, key, value, magic, 0, ts)
                    for i, (key, value, ts) in enumerate(records))


def test_fetched_batch_columns():
    data = _entries(40, [(b"k", b"v0", 1700000000123), (None, b"", 1700000000124),
                         (b"", b"v2", 1700000000125)])
    batch, following = fetched_batch(data, "t", 3, 40, 100)
    assert following == 43
    rows = batch.to_pylist()
    assert [r["offset"] for r in rows] == [40, 41, 42]
    assert {r["topic"] for r in rows} == {"t"} and {r["partition"] for r in rows} == {3}
    assert [r["key"] for r in rows] == [b"k", None, b""]
    assert [r["value"] for r in rows] == [b"v0", b"", b"v2"]
    assert rows[0]["timestamp"] == datetime(2023, 11, 14, 22, 13, 20, 123000, UTC)
    assert batch.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")


def test_fetched_batch_stops_at_the_end_and_at_a_partial_entry():
    data = _entries(0, [(None, b"x%d" % i, 1) for i in range(5)])
    batch, following = fetched_batch(data, "t", 0, 1, 3)
    assert batch.column("offset").to_pylist() == [1, 2] and following == 3
    batch, following = fetched_batch(data[:-3], "t", 0, 0, 10)
    assert batch.num_rows == 4 and following == 4
    empty, following = fetched_batch(b"", "t", 0, 7, 10)
    assert empty.num_rows == 0 and following == 7


def test_fetched_batch_magic0_has_no_timestamp():
    batch, _ = fetched_batch(_entries(0, [(None, b"a", -1)], magic=0), "t", 0, 0, 1)
    assert batch.column("timestamp").to_pylist() == [None]


def test_fetched_batch_refuses_gaps_and_garbage():
    with pytest.raises(DataLossError, match="records 5 to 6 are no longer in the log"):
        fetched_batch(_entries(7, [(None, b"a", 1)]), "t", 0, 5, 10)
    gzip = kc.encode_message_set([(None, b"a", 1)], 1, kc.CODEC_GZIP)
    with pytest.raises(ValueError, match="compressed"):
        fetched_batch(gzip, "t", 0, 0, 10)
    entry = bytearray(_entries(0, [(None, b"abc", 1)]))
    entry[-7] = 9     # the value length: 9 bytes in a message that holds 3
    with pytest.raises(ValueError, match="malformed message"):
        fetched_batch(bytes(entry), "t", 0, 0, 10)


# -- validating rows to write ------------------------------------------------------------

def _groups(batch, topic="out", partitions=3, task=1):
    return encode_rows(batch, 10, topic, lambda t: partitions, task)


def test_encode_rows_routes_rows():
    batch = pa.RecordBatch.from_pydict({
        "key": ["a", None, "a"], "value": ["x", "y", "z"], "partition": [None, None, 2],
        "timestamp": pa.array([datetime(2024, 1, 1, tzinfo=UTC), None, None],
                              pa.timestamp("us", tz="UTC"))})
    groups = _groups(batch)
    keyed = zlib.crc32(b"a") % 3
    assert groups[("out", keyed)][0] == (b"a", b"x", 1704067200000)
    # A keyless row goes to the task's partition; a null timestamp is the receive time.
    assert groups[("out", 1)] == [(None, b"y", -1)]
    assert groups[("out", 2)][-1] == (b"a", b"z", -1)


def test_encode_rows_without_timestamps_writes_magic0_records():
    batch = pa.RecordBatch.from_pydict({"value": [b"v"], "topic": ["other"]})
    assert _groups(batch) == {("other", 1): [(None, b"v")]}


@pytest.mark.parametrize("columns, message", [
    ({"value": [b"a", None]}, "row 11: value is null; every row needs a value"),
    ({"value": [b"a"], "partition": [3]},
     "row 10: partition 3 does not exist in topic 'out' (3 partitions)"),
    ({"value": [b"a"], "partition": [-1]}, "partition -1 does not exist"),
])
def test_encode_rows_refuses_invalid_rows(columns, message):
    with pytest.raises(OptionError, match=re.escape(message)):
        _groups(pa.RecordBatch.from_pydict(columns))


def test_encode_rows_needs_a_topic():
    batch = pa.RecordBatch.from_pydict({"value": [b"a"], "topic": pa.array([None], pa.string())})
    with pytest.raises(OptionError, match="row 10: no topic"):
        _groups(batch, topic=None)


# -- Fetch v2 answers: magic 1 with timestamps ----------------------------------------------

class _Stored:
    """What ``message_set_for`` reads of a stored batch."""

    def __init__(self, format, base_offset, payload, count, first_ts):
        self.format = format
        self.base_offset = base_offset
        self.payload = payload
        self.count = count
        self.first_ts = first_ts


def test_stored_kafka_sets_are_served_as_magic1_with_the_batch_time():
    from gateway.records import KAFKA_MESSAGE_SET
    payload = kc.encode_message_set([(b"k%d" % i, b"value-%d" % i) for i in range(5)])
    batch = _Stored(KAFKA_MESSAGE_SET, 100, payload, 5, 1700000000042)
    data = kc.message_set_for([batch], 102, 1 << 20, None, magic=1)
    # decode_message_set checks every CRC.
    assert kc.decode_message_set(data) == [
        kc.Message(o, 1700000000042, b"k%d" % (o - 100), b"value-%d" % (o - 100))
        for o in range(102, 105)]
    one = kc.message_set_for([batch], 101, 10, None, magic=1)
    assert [m.offset for m in kc.decode_message_set(one)] == [101]
    two = kc.message_set_for([batch], 100, 2 * len(one), None, magic=1)
    assert [m.offset for m in kc.decode_message_set(two)] == [100, 101]
    # Fetch v0 and v1 still pass the stored entries through (offsets rewritten).
    v0 = kc.message_set_for([batch], 100, 1 << 20, None)
    assert len(v0) == len(payload)
    assert [(m.offset, m.timestamp) for m in kc.decode_message_set(v0)] == \
        [(o, None) for o in range(100, 105)]


# -- Fetch v2 from a real gateway ---------------------------------------------------------

@pytest.fixture(scope="module")
def gateway():
    directory = tempfile.mkdtemp(prefix="gw-spark-units-")
    process = GatewayProcess(directory, """storage: {path: ./data, fsync: never}
listeners:
  - {dialect: kafka, endpoint: "tcp:0:interface=127.0.0.1"}
  - {dialect: rustlog, endpoint: "tcp:0:interface=127.0.0.1"}
""")
    ports = process.start()
    yield ports
    process.stop()
    shutil.rmtree(directory, ignore_errors=True)


def test_fetch_v2_answers_magic1_with_every_records_timestamp(gateway):
    with KafkaClient("127.0.0.1", gateway["kafka"]) as client:
        client.produce("v2", 0, [(b"k", b"magic0")])                  # stored as sent
        client.produce("v2", 0, [(b"k1", b"stamped", 1600000000000)], magic=1)
        before = client.fetch("v2", 0, 0, version=2).messages[0].timestamp
        rustlog_produce(gateway["rustlog"], "v2", [b"from rustlog"])
        v0 = client.fetch("v2", 0, 0)
        v2 = client.fetch("v2", 0, 0, version=2)
        # A v2 read of the range is what the data source decodes into Arrow.
        hw, data = client.fetch_sets([("v2", 0, 0, 1 << 20)], version=2)[("v2", 0)]
        # Fetch v2 is served, not advertised: negotiating clients keep Fetch v1.
        assert client.api_versions()[kc.FETCH] == (0, 1)
    assert [m.timestamp for m in v0.messages] == [None, None, None]
    assert [m.value for m in v2.messages] == [b"magic0", b"stamped", b"from rustlog"]
    assert [m.key for m in v2.messages] == [b"k", b"k1", None]
    assert v2.messages[1].timestamp == 1600000000000
    assert before > 1600000000000 and v2.messages[2].timestamp >= before
    assert data[16] == 1 and hw == 3
    batch, following = fetched_batch(data, "v2", 0, 0, hw)
    assert batch.column("value").to_pylist() == [m.value for m in v2.messages]
    assert following == 3
