"""The RustLog dialect end to end: the real service tree (store, bus,
listener) on a real socket on port 0, driven by ``plugins/rustlog/client.py``
and, where a test needs bytes the client will not send, by raw frames.

Organised by the conformance checklist of protocols/rustlog.md §8 (items
1-12 and 14-18; item 13 is cross-dialect, so here only the RustLog side of it,
the offsets), then the rest of the dialect's behaviour: error shapes, limits,
pipelining, concurrency, durability across a restart and a crash (``gateway
run`` as a subprocess with a blocking client) and the CLI's exit codes.

Every expected value is exact: offsets, payloads, error messages, bytes.
"""
import errno
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile

import orjson
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.trial.unittest import TestCase

import storage.segment
from gateway import commands as cmd
from gateway.records import RecordBatch
from plugins.rustlog import codec as rc
from plugins.rustlog.client import FetchResult, RustLogError, connect
from tests.support import GatewayProcess, RawFrames, gateway_config, start_gateway

MiB = 1024 * 1024
MAX = rc.MAX_FRAME_BYTES
U32_MAX = 2 ** 32 - 1
U64_MAX = 2 ** 64 - 1


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


def js(obj):
    """A JSON request payload, written compactly like a serde client would."""
    return orjson.dumps(obj)


def json_error(message):
    return js({"Error": {"message": message}})


def binary_error(code, message):
    data = message.encode()
    return b"\xfe" + struct.pack(">HH", code, len(data)) + data


def fetch_req(topic, partition, offset, max_bytes=MiB, **extra):
    return js({"Fetch": {"topic": topic, "partition": partition, "offset": offset,
                         "max_bytes": max_bytes, **extra}})


def produce_req(topic, partition, records):
    return js({"Produce": {"topic": topic, "partition": partition, "records": records}})


def fetch_reply(records, next_offset):
    return js({"Fetch": {"records": [{"offset": o, "payload": list(p)} for o, p in records],
                         "next_offset": next_offset}})


def b_str(text):
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def b_produce(topic, partition, values):
    body = b"\x01" + b_str(topic) + struct.pack(">II", partition, len(values))
    return body + b"".join(struct.pack(">I", len(v)) + v for v in values)


def b_fetch(topic, partition, offset, max_bytes=MiB, group=""):
    return (b"\x02" + b_str(group) + b_str(topic)
            + struct.pack(">IQI", partition, offset, max_bytes))


def b_fetch_reply(values, next_offset):
    return rc.encode_binary_fetch(values, next_offset)


class RawConnection(RawFrames):
    """Frame payloads (u32 BE prefix cut off) back, without judging them."""

    def send(self, *payloads):
        self.transport.write(b"".join(frame(p) for p in payloads))

    def write(self, data):
        self.transport.write(data)

    def take(self, n=1):
        """Fires with the next ``n`` frame payloads."""
        return self.take_frames(n)

    @defer.inlineCallbacks
    def call(self, *payloads):
        """Send frames; fires with one answer each (a list if more than one)."""
        self.send(*payloads)
        got = yield self.take(len(payloads))
        return got if len(payloads) > 1 else got[0]


class GatewayTest(TestCase):
    timeout = 30

    def tempdir(self):
        # not self.mktemp(): under pytest that would write into the working tree
        path = tempfile.mkdtemp(prefix="gateway-rustlog-")
        self.addCleanup(shutil.rmtree, path, True)
        return path

    @defer.inlineCallbacks
    def start(self, listeners=None, directory=None, **sections):
        self.directory = directory or self.tempdir()
        self.config = gateway_config(self.directory, listeners, **sections)
        self.service, ports = yield start_gateway(self, self.config)
        self.port = ports["rustlog"]
        return self.service

    @defer.inlineCallbacks
    def restart(self):
        """Stop the gateway and start it again on the same data directory."""
        yield self.service.stopService()
        self.service, ports = yield start_gateway(self, self.config)
        self.port = ports["rustlog"]

    @defer.inlineCallbacks
    def client(self, binary=False):
        client = yield connect(reactor, "127.0.0.1", self.port, binary=binary)
        self.addCleanup(client.close)
        return client

    @defer.inlineCallbacks
    def raw(self):
        proto = RawConnection()
        yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", self.port), proto)

        def close():
            proto.transport.loseConnection()
            return proto.lost
        self.addCleanup(close)
        return proto

    @defer.inlineCallbacks
    def assertError(self, d, message, code=None):
        e = yield self.assertFailure(d, RustLogError)
        self.assertEqual((e.message, e.code), (message, code))

    def state(self, topic, partition=0):
        return self.service.store.offsets(topic, partition)


# ---------------------------------------------------------------------------
# §8 conformance checklist
# ---------------------------------------------------------------------------

class ConformanceTests(GatewayTest):

    @defer.inlineCallbacks
    def test_01_worked_examples_byte_exact(self):
        """§8.1 and every JSON example of §6, frame for frame, pipelined."""
        yield self.start()
        client = yield self.client()
        self.assertEqual((yield client.produce("t", 0, [b"x"] * 41)), list(range(41)))
        requests = [
            b'{"Produce":{"topic":"t","partition":0,"records":[[104,105],[0,255]]}}',
            b'{"Fetch":{"topic":"t","partition":0,"offset":41,"max_bytes":1048576,"group_id":null}}',
            b'{"Fetch":{"topic":"t","partition":0,"offset":43,"max_bytes":1048576,"group_id":null}}',
            b'{"OffsetCommit":{"topic":"t","partition":0,"group_id":"g","offset":43}}',
            b'{"OffsetFetch":{"topic":"t","partition":0,"group_id":"g"}}',
            b'{"OffsetFetch":{"topic":"t","partition":0,"group_id":"h"}}',
            b'{"Fetch":{"topic":"t","partition":0,"offset":0,"max_bytes":1048576,"group_id":"g"}}',
            b'{"Fetch":{"topic":"t","partition":0,"offset":50,"max_bytes":1048576,"group_id":"g"}}',
            b'{"Fetch":{"topic":"nope","partition":0,"offset":0,"max_bytes":1048576,"group_id":null}}',
        ]
        # The request frames are §6's, so the test speaks the documented bytes.
        self.assertEqual(frame(requests[0]), bytes.fromhex(
            "00000045 7b2250726f64756365223a7b22746f706963223a2274222c22706172746974696f6e"
            "223a302c227265636f726473223a5b5b3130342c3130355d2c5b302c3235355d5d7d7d"))
        self.assertEqual([len(r) for r in requests[1:5]], [0x55, 0x55, 0x47, 0x3a])
        raw = yield self.raw()
        raw.write(b"".join(frame(r) for r in requests))
        replies = yield raw.take(len(requests))
        self.assertEqual([frame(r) for r in replies], [
            bytes.fromhex("0000001f 7b2250726f64756365223a7b226f666673657473223a5b34312c34325d7d7d"),
            bytes.fromhex("0000006a") + b'{"Fetch":{"records":[{"offset":41,"payload":[104,105]},'
                                        b'{"offset":42,"payload":[0,255]}],"next_offset":43}}',
            bytes.fromhex("00000029") + b'{"Fetch":{"records":[],"next_offset":43}}',
            bytes.fromhex("00000021 7b224f6666736574436f6d6d6974223a7b2273756363657373223a747275657d7d"),
            bytes.fromhex("0000001d") + b'{"OffsetFetch":{"offset":43}}',
            bytes.fromhex("0000001f") + b'{"OffsetFetch":{"offset":null}}',
            bytes.fromhex("00000029") + b'{"Fetch":{"records":[],"next_offset":43}}',
            bytes.fromhex("00000029") + b'{"Fetch":{"records":[],"next_offset":43}}',
            bytes.fromhex("00000044") + b'{"Error":{"message":"partition not found: topic=nope, partition=0"}}',
        ])

    @defer.inlineCallbacks
    def test_02_every_byte_value_round_trips(self):
        yield self.start()
        client = yield self.client()
        values = [bytes(range(256)), bytes(range(255, -1, -1)), b"", b"\x00", b"\xff" * 3]
        self.assertEqual((yield client.produce("t", 0, values)), [0, 1, 2, 3, 4])
        self.assertEqual((yield client.fetch("t", 0, 0)),
                         FetchResult(list(enumerate(values)), 5))
        binary = yield self.client(binary=True)
        self.assertEqual((yield binary.fetch("t", 0, 0)),
                         FetchResult(list(enumerate(values)), 5))

    @defer.inlineCallbacks
    def test_02_bad_byte_values_are_parse_errors(self):
        """256, negative, float, boolean, string, null and nested values in a
        record: each a parse Error, nothing stored, the connection usable."""
        yield self.start()
        raw = yield self.raw()
        p = "failed to parse request: Produce.records"
        cases = [
            (b'[[1,256]]', f"{p}[0]: expected an array of integers 0..255"),
            (b'[[1],[-1]]', f"{p}[1]: expected an array of integers 0..255"),
            (b'[[1.5]]', f"{p}[0]: expected an array of integers 0..255"),
            (b'[[1.0]]', f"{p}[0]: expected an array of integers 0..255"),
            (b'[[1e2]]', f"{p}[0]: expected an array of integers 0..255"),
            (b'[[true]]', f"{p}[0]: expected an array of integers 0..255, got a boolean in it"),
            (b'[[0],[1,false]]', (f"{p}[1]: expected an array of integers 0..255, "
                                  "got a boolean in it")),
            (b'[["a"]]', f"{p}[0]: expected an array of integers 0..255"),
            (b'[[null]]', f"{p}[0]: expected an array of integers 0..255"),
            (b'[[[1]]]', f"{p}[0]: expected an array of integers 0..255"),
            (b'[[18446744073709551616]]', f"{p}[0]: expected an array of integers 0..255"),
            (b'[5]', f"{p}[0]: expected an array of integers 0..255, got number 5"),
            (b'[[1],"ab"]', f"{p}[1]: expected an array of integers 0..255, got a string"),
            (b'[{}]', f"{p}[0]: expected an array of integers 0..255, got an object"),
            (b'"abc"', f"{p}: expected an array, got a string"),
            (b'null', f"{p}: expected an array, got null"),
        ]
        for records, message in cases:
            payload = b'{"Produce":{"topic":"t","partition":0,"records":' + records + b'}}'
            self.assertEqual((yield raw.call(payload)), json_error(message), records)
        # usable, and nothing was stored (not even the topic created)
        self.assertEqual((yield raw.call(produce_req("t", 0, [[7]]))),
                         b'{"Produce":{"offsets":[0]}}')
        self.assertEqual((yield raw.call(fetch_req("t", 0, 0))), fetch_reply([(0, b"\x07")], 1))

    @defer.inlineCallbacks
    def test_02_bad_fields_are_parse_errors(self):
        """Wrong types, floats, booleans and out-of-range numbers in every
        request's fields."""
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a"])
        raw = yield self.raw()
        f = "failed to parse request: "
        cases = [
            (b'{"Produce":{"topic":"t","partition":-1,"records":[]}}',
             f + "Produce.partition: expected an integer 0..4294967295, got number -1"),
            (b'{"Produce":{"topic":"t","partition":4294967296,"records":[]}}',
             f + "Produce.partition: expected an integer 0..4294967295, got number 4294967296"),
            (b'{"Produce":{"topic":"t","partition":true,"records":[]}}',
             f + "Produce.partition: expected an integer 0..4294967295, got a boolean"),
            (b'{"Produce":{"topic":"t","partition":0.0,"records":[]}}',
             f + "Produce.partition: expected an integer 0..4294967295, got number 0.0"),
            (b'{"Produce":{"topic":"t","partition":"0","records":[]}}',
             f + "Produce.partition: expected an integer 0..4294967295, got a string"),
            (b'{"Produce":{"topic":7,"partition":0,"records":[]}}',
             f + "Produce.topic: expected a string, got number 7"),
            (b'{"Produce":{"partition":0,"records":[]}}',
             f + "Produce: missing field `topic`"),
            (b'{"Produce":{"topic":"t","partition":0}}',
             f + "Produce: missing field `records`"),
            (b'{"Fetch":{"topic":"t","partition":0,"offset":18446744073709551616,"max_bytes":1}}',
             f + "Fetch.offset: expected an integer 0..18446744073709551615, "
                 "got number 1.8446744073709552e+19"),
            (b'{"Fetch":{"topic":"t","partition":0,"offset":-1,"max_bytes":1}}',
             f + "Fetch.offset: expected an integer 0..18446744073709551615, got number -1"),
            (b'{"Fetch":{"topic":"t","partition":0,"offset":0,"max_bytes":false}}',
             f + "Fetch.max_bytes: expected an integer 0..18446744073709551615, got a boolean"),
            (b'{"Fetch":{"topic":"t","partition":0,"offset":0,"max_bytes":-5}}',
             f + "Fetch.max_bytes: expected an integer 0..18446744073709551615, got number -5"),
            (b'{"Fetch":{"topic":"t","partition":0,"offset":0}}',
             f + "Fetch: missing field `max_bytes`"),
            (b'{"Fetch":{"topic":"t","partition":0,"offset":0,"max_bytes":1,"group_id":5}}',
             f + "Fetch.group_id: expected a string or null, got number 5"),
            (b'{"Fetch":{"topic":"t","partition":0,"offset":0,"max_bytes":1,"group_id":true}}',
             f + "Fetch.group_id: expected a string or null, got a boolean"),
            (b'{"OffsetCommit":{"topic":"t","partition":0,"group_id":"","offset":1}}',
             f + "OffsetCommit.group_id: must not be empty"),
            (b'{"OffsetCommit":{"topic":"t","partition":0,"group_id":null,"offset":1}}',
             f + "OffsetCommit.group_id: expected a string, got null"),
            (b'{"OffsetCommit":{"topic":"t","partition":0,"group_id":"g","offset":1.5}}',
             f + "OffsetCommit.offset: expected an integer 0..18446744073709551615, "
                 "got number 1.5"),
            (b'{"OffsetCommit":{"topic":"t","partition":0,"group_id":"g","offset":-1}}',
             f + "OffsetCommit.offset: expected an integer 0..18446744073709551615, "
                 "got number -1"),
            (b'{"OffsetFetch":{"topic":"t","partition":0}}',
             f + "OffsetFetch: missing field `group_id`"),
            (b'{"OffsetFetch":{"topic":["t"],"partition":0,"group_id":"g"}}',
             f + "OffsetFetch.topic: expected a string, got an array"),
        ]
        for payload, message in cases:
            self.assertEqual((yield raw.call(payload)), json_error(message), payload)
        # Nothing was committed by the refused commits; the connection works.
        self.assertEqual((yield raw.call(js({"OffsetFetch": {
            "topic": "t", "partition": 0, "group_id": "g"}}))), b'{"OffsetFetch":{"offset":null}}')
        self.assertEqual(self.state("t").high_watermark, 1)

    @defer.inlineCallbacks
    def test_02_extreme_valid_numbers_and_extra_fields(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a", b"b"])
        raw = yield self.raw()
        answers = yield raw.call(
            # the largest offset: past the end, so empty
            fetch_req("t", 0, U64_MAX, U64_MAX),
            # the largest partition: valid, but not there
            fetch_req("t", U32_MAX, 0),
            # unknown extra fields are ignored
            js({"Fetch": {"topic": "t", "partition": 0, "offset": 1, "max_bytes": 0,
                          "group_id": None, "extra": [1, {"x": True}]}}),
            js({"OffsetCommit": {"topic": "t", "partition": 0, "group_id": "g",
                                 "offset": 2 ** 63 - 1, "metadata": "x"}}),
            js({"OffsetFetch": {"topic": "t", "partition": 0, "group_id": "g"}}),
            # commits are int64 across the gateway (Kafka's, SQLite's): past
            # that a u64 is an invalid request, not an internal error
            js({"OffsetCommit": {"topic": "t", "partition": 0, "group_id": "g",
                                 "offset": 2 ** 63}}),
            js({"OffsetCommit": {"topic": "t", "partition": 0, "group_id": "g",
                                 "offset": U64_MAX}}),
            js({"OffsetFetch": {"topic": "t", "partition": 0, "group_id": "g"}}),
        )
        self.assertEqual(answers, [
            b'{"Fetch":{"records":[],"next_offset":2}}',
            json_error(f"partition not found: topic=t, partition={U32_MAX}"),
            fetch_reply([(1, b"b")], 2),
            b'{"OffsetCommit":{"success":true}}',
            b'{"OffsetFetch":{"offset":9223372036854775807}}',
            json_error("invalid request: committed offset 9223372036854775808 is above "
                       "9223372036854775807"),
            json_error("invalid request: committed offset 18446744073709551615 is above "
                       "9223372036854775807"),
            b'{"OffsetFetch":{"offset":9223372036854775807}}',
        ])
        # the binary variant: code 2
        binary = yield self.client(binary=True)
        yield self.assertError(binary.commit("g", "t", 0, U64_MAX),
                               "invalid request: committed offset 18446744073709551615 is above "
                               "9223372036854775807", rc.DECODE_ERROR)

    @defer.inlineCallbacks
    def test_03_fetch_returns_offsets_and_next_offset(self):
        yield self.start()
        client = yield self.client()
        values = [b"r%d" % i for i in range(7)]
        # several batches: a fetch reads on across them
        self.assertEqual((yield client.produce("t", 0, values[:3])), [0, 1, 2])
        self.assertEqual((yield client.produce("t", 0, values[3:4])), [3])
        self.assertEqual((yield client.produce("t", 0, values[4:])), [4, 5, 6])
        self.assertEqual((yield client.fetch("t", 0, 0)), FetchResult(list(enumerate(values)), 7))
        self.assertEqual((yield client.fetch("t", 0, 2)),
                         FetchResult(list(enumerate(values))[2:], 7))
        self.assertEqual((yield client.fetch("t", 0, 5)),
                         FetchResult([(5, b"r5"), (6, b"r6")], 7))
        self.assertEqual((yield client.fetch("t", 0, 7)), FetchResult([], 7))
        self.assertEqual((yield client.fetch("t", 0, 1000)), FetchResult([], 7))
        # max_bytes counts payload bytes (2 per record here)
        self.assertEqual((yield client.fetch("t", 0, 1, max_bytes=6)),
                         FetchResult([(1, b"r1"), (2, b"r2"), (3, b"r3")], 4))
        self.assertEqual((yield client.fetch("t", 0, 1, max_bytes=7)),
                         FetchResult([(1, b"r1"), (2, b"r2"), (3, b"r3")], 4))
        self.assertEqual((yield client.fetch("t", 0, 1, max_bytes=5)),
                         FetchResult([(1, b"r1"), (2, b"r2")], 3))
        # an empty produce is a no-op answered with no offsets
        self.assertEqual((yield client.produce("t", 0, [])), [])
        self.assertEqual(self.state("t").high_watermark, 7)

    @defer.inlineCallbacks
    def test_04_max_bytes_smaller_than_first_record(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a" * 1000, b"b" * 10])
        self.assertEqual((yield client.fetch("t", 0, 0, max_bytes=10)),
                         FetchResult([(0, b"a" * 1000)], 1))
        self.assertEqual((yield client.fetch("t", 0, 0, max_bytes=0)),
                         FetchResult([(0, b"a" * 1000)], 1))
        self.assertEqual((yield client.fetch("t", 0, 0, max_bytes=1010)),
                         FetchResult([(0, b"a" * 1000), (1, b"b" * 10)], 2))

    @defer.inlineCallbacks
    def test_05_group_rule(self):
        yield self.start()
        client = yield self.client()
        values = [bytes([i]) for i in range(10)]
        yield client.produce("t", 0, values)
        self.assertTrue((yield client.commit("g", "t", 0, 5)))
        rows = list(enumerate(values))
        # committed 5 > requested 2: from 5
        self.assertEqual((yield client.fetch("t", 0, 2, group_id="g")), FetchResult(rows[5:], 10))
        # committed 5 <= requested 7 (or 5): the requested offset
        self.assertEqual((yield client.fetch("t", 0, 7, group_id="g")), FetchResult(rows[7:], 10))
        self.assertEqual((yield client.fetch("t", 0, 5, group_id="g")), FetchResult(rows[5:], 10))
        # a group that never committed, null, "" and a missing field: requested
        self.assertEqual((yield client.fetch("t", 0, 2, group_id="other")),
                         FetchResult(rows[2:], 10))
        self.assertEqual((yield client.fetch("t", 0, 2, group_id=None)), FetchResult(rows[2:], 10))
        self.assertEqual((yield client.fetch("t", 0, 2, group_id="")), FetchResult(rows[2:], 10))
        raw = yield self.raw()
        self.assertEqual((yield raw.call(fetch_req("t", 0, 8))), fetch_reply(rows[8:], 10))
        self.assertEqual((yield raw.call(fetch_req("t", 0, 8, group_id=""))),
                         fetch_reply(rows[8:], 10))
        # a commit past the end: the group's fetch is at the end
        self.assertTrue((yield client.commit("g2", "t", 0, 50)))
        self.assertEqual((yield client.fetch("t", 0, 0, group_id="g2")), FetchResult([], 10))
        # Fetch never commits; commits overwrite and may move backwards
        self.assertEqual((yield client.committed("g", "t", 0)), 5)
        self.assertIsNone((yield client.committed("other", "t", 0)))
        self.assertTrue((yield client.commit("g", "t", 0, 3)))
        self.assertEqual((yield client.committed("g", "t", 0)), 3)
        self.assertEqual((yield client.fetch("t", 0, 1, group_id="g")), FetchResult(rows[3:], 10))

    @defer.inlineCallbacks
    def test_06_commits_survive_a_restart_and_are_shared(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a", b"b", b"c"])
        self.assertTrue((yield client.commit("g", "t", 0, 2)))
        # what another dialect's group sees through the bus: the same offset
        committed = yield self.service.bus.execute(cmd.FetchCommittedOffset("g", "t", 0))
        self.assertEqual(committed[0], 2)
        # ... and a commit made through the bus (another dialect) is seen here
        yield self.service.bus.execute(cmd.CommitOffset("k", "t", 0, 1))
        self.assertEqual((yield client.committed("k", "t", 0)), 1)
        yield client.close()
        yield self.restart()
        client = yield self.client()
        self.assertEqual((yield client.committed("g", "t", 0)), 2)
        self.assertEqual((yield client.committed("k", "t", 0)), 1)
        self.assertEqual((yield client.fetch("t", 0, 0, group_id="g")), FetchResult([(2, b"c")], 3))

    @defer.inlineCallbacks
    def test_07_offset_fetch_without_commit_is_null(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a"])
        yield client.commit("g", "t", 0, 1)
        self.assertIsNone((yield client.committed("never", "t", 0)))
        # another partition or topic of the group: never committed there either
        self.assertIsNone((yield client.committed("g", "nope", 0)))
        self.assertIsNone((yield client.committed("g", "t", 1)))

    @defer.inlineCallbacks
    def test_08_fetch_below_log_start_after_retention(self):
        yield self.start(storage={"segment_bytes": 1024,
                                  "retention": {"hours": None, "bytes": 1}})
        client = yield self.client()
        for i in range(8):
            yield client.produce("t", 0, [bytes([i]) * 600])
        deleted = self.service.store.enforce_retention()
        state = self.state("t")
        self.assertGreater(state.log_start, 0, deleted)
        start = state.log_start
        yield self.assertError(client.fetch("t", 0, 0),
                               f"offset out of range: requested=0, log_start={start}")
        yield self.assertError(client.fetch("t", 0, start - 1),
                               f"offset out of range: requested={start - 1}, log_start={start}")
        # a group committed below the log start: its start is the commit
        yield client.commit("g", "t", 0, 0)
        yield self.assertError(client.fetch("t", 0, 0, group_id="g"),
                               f"offset out of range: requested=0, log_start={start}")
        got = yield client.fetch("t", 0, start)
        self.assertEqual(got, FetchResult([(o, bytes([o]) * 600) for o in range(start, 8)], 8))
        # the binary variant: empty, pointing at the log start (gateway decision)
        binary = yield self.client(binary=True)
        self.assertEqual((yield binary.fetch("t", 0, 0)), FetchResult([], start))

    @defer.inlineCallbacks
    def test_09_unknown_topic_and_partition(self):
        yield self.start(topics={"default_partitions": 2})
        client = yield self.client()
        yield self.assertError(client.fetch("nope", 0, 0),
                               "partition not found: topic=nope, partition=0")
        # auto-create (on by default) with default_partitions
        self.assertEqual((yield client.produce("t", 1, [b"x"])), [0])
        self.assertEqual(self.service.store.topic("t").partitions, 2)
        yield self.assertError(client.fetch("t", 2, 0), "partition not found: topic=t, partition=2")
        yield self.assertError(client.produce("t", 2, [b"x"]),
                               "partition not found: topic=t, partition=2")
        # commit and offset fetch on unknown topics or partitions
        self.assertFalse((yield client.commit("g", "nope", 0, 1)))
        self.assertFalse((yield client.commit("g", "t", 2, 1)))
        self.assertIsNone((yield client.committed("g", "nope", 0)))
        # Fetch, OffsetCommit and OffsetFetch never create topics
        self.assertEqual(self.service.store.topic_names(), ["t"])
        # invalid names
        for name, shown in [("a/b", "'a/b'"), ("..", "'..'"), ("", "''"), ("x" * 201, None),
                            ("caf\u00e9", "'caf\u00e9'")]:
            shown = shown or repr(name)
            yield self.assertError(client.produce(name, 0, [b"x"]), f"invalid topic name: {shown}")
        self.assertEqual(self.service.store.topic_names(), ["t"])
        self.assertEqual((yield client.produce("A-b_c.9", 0, [b"x"])), [0])

    @defer.inlineCallbacks
    def test_09_auto_create_off(self):
        yield self.start(topics={"auto_create": False})
        client = yield self.client()
        yield self.assertError(client.produce("new", 0, [b"x"]),
                               "partition not found: topic=new, partition=0")
        yield self.assertError(client.fetch("new", 0, 0),
                               "partition not found: topic=new, partition=0")
        self.assertEqual(self.service.store.topic_names(), [])
        # a topic created another way takes produces
        binary = yield self.client(binary=True)
        self.assertTrue((yield binary.create_topic("new", 1)))
        self.assertEqual((yield client.produce("new", 0, [b"x"])), [0])

    @defer.inlineCallbacks
    def test_10_malformed_frames_get_errors_and_the_connection_goes_on(self):
        yield self.start()
        raw = yield self.raw()
        f = "failed to parse request: "
        cases = [
            (b"", f + "empty frame"),
            (b'{"Nope":{}}', f + "unknown request type 'Nope'"),
            (b'{"produce":{"topic":"t","partition":0,"records":[]}}',
             f + "unknown request type 'produce'"),
            (b'{"Produce":{"topic":"t","partition":0,"records":[]},"Fetch":{}}',
             f + "expected an object with exactly one key naming the message type"),
            (b'{}', f + "expected an object with exactly one key naming the message type"),
            (b'[{"Produce":{}}]', f + "expected an object with exactly one key naming the message type"),
            (b'"Produce"', f + "expected an object with exactly one key naming the message type"),
            (b'{"Produce":5}', f + "Produce: expected an object, got number 5"),
            (b'{"Produce":null}', f + "Produce: expected an object, got null"),
        ]
        for payload, message in cases:
            self.assertEqual((yield raw.call(payload)), json_error(message), payload)
        # invalid JSON (the parser's own words follow the prefix)
        for payload in [b'{"Produce":', b"hello", b'{"Produce":{"topic":"t\xff"}}', b"\x00\x00",
                        b'{"Produce":{}}}', b"\x0a" * 3]:
            answer = yield raw.call(payload)
            (kind, body), = orjson.loads(answer).items()
            self.assertEqual(kind, "Error")
            self.assertTrue(body["message"].startswith(f + "invalid JSON: "), (payload, answer))
        # JSON may start with whitespace other than TAB
        self.assertEqual((yield raw.call(b"\n \r" + produce_req("t", 0, [[1]]))),
                         b'{"Produce":{"offsets":[0]}}')
        # a TAB is the binary MetricsFetch tag, so this is a binary error
        self.assertEqual((yield raw.call(b"\t" + fetch_req("t", 0, 0))), binary_error(
            rc.DECODE_ERROR,
            f + f"{len(fetch_req('t', 0, 0))} trailing bytes after MetricsFetch frame"))
        # the connection is still usable, and answers JSON again
        self.assertEqual((yield raw.call(fetch_req("t", 0, 0))), fetch_reply([(0, b"\x01")], 1))
        self.assertFalse(raw.closed)

    @defer.inlineCallbacks
    def test_11_oversized_frame_is_refused_unread_and_closes(self):
        yield self.start()
        raw = yield self.raw()
        self.assertEqual((yield raw.call(produce_req("t", 0, [[1]]))), b'{"Produce":{"offsets":[0]}}')
        # Only the prefix and a few bytes follow: the server must not wait for
        # 10 MiB of body. What does follow (a valid Produce) is never read.
        raw.write(struct.pack(">I", MAX + 1) + frame(produce_req("t", 0, [[2]])))
        self.assertEqual((yield raw.take()), [json_error("max frame size exceeded")])
        yield raw.lost
        self.assertEqual(raw.frames[raw.taken:], [])
        self.assertEqual(self.state("t").high_watermark, 1)
        # the largest prefix too
        raw2 = yield self.raw()
        raw2.write(b"\xff\xff\xff\xff")
        self.assertEqual((yield raw2.take()), [json_error("max frame size exceeded")])
        yield raw2.lost

    @defer.inlineCallbacks
    def test_11_frame_of_exactly_10_mib_is_accepted(self):
        """A Produce whose JSON is exactly 10,485,760 bytes is stored, and
        the connection goes on."""
        yield self.start()
        client = yield self.client()
        record = b"[" + b"7," * 999_999 + b"7]"
        head = b'{"Produce":{"topic":"big","partition":0,"records":['
        body = head + b",".join([record] * 5) + b"]}}"
        payload = body[:-2] + b" " * (MAX - len(body)) + body[-2:]
        self.assertEqual(len(payload), MAX)
        self.assertEqual((yield client.send_raw(payload)), rc.ProduceResponse(0, 5))
        self.assertEqual(self.state("big").high_watermark, 5)
        # The reply stops before the record that could push it past 10 MiB
        # (the bound counts 4 bytes per value byte): two records here.
        got = yield client.fetch("big", 0, 0, max_bytes=MAX)
        self.assertEqual(got, FetchResult([(0, b"\x07" * 1_000_000), (1, b"\x07" * 1_000_000)], 2))
        # and a frame of exactly 10 MiB that does not parse: an Error, still open
        junk = b"{" + b"x" * (MAX - 1)
        e = yield self.assertFailure(client.send_raw(junk), RustLogError)
        self.assertTrue(e.message.startswith("failed to parse request: invalid JSON: "), e.message)
        self.assertEqual((yield client.produce("big", 0, [b"z"])), [5])

    @defer.inlineCallbacks
    def test_12_pipelined_requests_answered_in_order(self):
        yield self.start()
        raw = yield self.raw()
        answers = yield raw.call(
            produce_req("t", 0, [[1], [2]]),
            fetch_req("t", 0, 0),
            js({"OffsetCommit": {"topic": "t", "partition": 0, "group_id": "g", "offset": 1}}),
            fetch_req("t", 0, 0, group_id="g"),
            js({"OffsetFetch": {"topic": "t", "partition": 0, "group_id": "g"}}),
        )
        self.assertEqual(answers, [
            b'{"Produce":{"offsets":[0,1]}}',
            fetch_reply([(0, b"\x01"), (1, b"\x02")], 2),
            b'{"OffsetCommit":{"success":true}}',
            fetch_reply([(1, b"\x02")], 2),
            b'{"OffsetFetch":{"offset":1}}',
        ])

    @defer.inlineCallbacks
    def test_12_fifo_when_an_earlier_request_takes_longer(self):
        """Under ``fsync: interval`` a Produce waits for the next fsync (in a
        thread), while a Fetch of another topic is ready at once: the Fetch's
        answer must still wait its turn."""
        yield self.start(storage={"fsync": "interval", "fsync_interval_ms": 100})
        client = yield self.client()
        yield client.produce("other", 0, [b"o"])
        raw = yield self.raw()
        answers = yield raw.call(
            produce_req("slow", 0, [[1]]),
            fetch_req("other", 0, 0),
            js({"OffsetFetch": {"topic": "other", "partition": 0, "group_id": "g"}}),
            produce_req("slow", 0, [[2], [3]]),
            fetch_req("other", 0, 1),
            b"",
            fetch_req("slow", 0, 0),
        )
        self.assertEqual(answers, [
            b'{"Produce":{"offsets":[0]}}',
            fetch_reply([(0, b"o")], 1),
            b'{"OffsetFetch":{"offset":null}}',
            b'{"Produce":{"offsets":[1,2]}}',
            b'{"Fetch":{"records":[],"next_offset":1}}',
            json_error("failed to parse request: empty frame"),
            # read before the produces were durable: they are not visible yet
            b'{"Fetch":{"records":[],"next_offset":0}}',
        ])
        self.assertEqual((yield client.fetch("slow", 0, 0)),
                         FetchResult([(0, b"\x01"), (1, b"\x02"), (2, b"\x03")], 3))

    @defer.inlineCallbacks
    def test_13_offsets_are_log_offsets(self):
        """The RustLog side of §8.13: offset 41 is the 42nd record, as every
        dialect maps it from the same log offset."""
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"v%d" % i for i in range(41)])
        appended = yield self.service.bus.execute(cmd.Produce(
            "t", 0, RecordBatch([b"from-bus"], keys=[b"a-key"], timestamps=[1234])))
        self.assertEqual(appended.base_offset, 41)
        # values only: the key and the timestamp are not exposed
        self.assertEqual((yield client.fetch("t", 0, 41)), FetchResult([(41, b"from-bus")], 42))
        self.assertEqual(self.state("t").high_watermark, 42)

    @defer.inlineCallbacks
    def test_14_a_storage_failure_stores_nothing(self):
        yield self.start()
        client = yield self.client()
        binary = yield self.client(binary=True)
        yield client.produce("t", 0, [b"a", b"b"])
        segment = self.service.store.partitions[("t", 0)].segments[-1]

        class HalfWrite:
            """``os`` for storage.segment: writes to the segment tear halfway
            and fail with ENOSPC."""
            def __getattr__(self, name):
                return getattr(os, name)

            def write(self, fd, data):
                if fd == segment.fd:
                    os.write(fd, data[:len(data) // 2])
                    raise OSError(errno.ENOSPC, "No space left on device")
                return os.write(fd, data)
        self.patch(storage.segment, "os", HalfWrite())
        yield self.assertError(client.produce("t", 0, [b"c", b"d", b"e"]), "internal error")
        yield self.assertError(binary.produce("t", 0, [b"f"]), "internal error", rc.INTERNAL)
        self.assertEqual(os.path.getsize(segment.path), segment.size)
        storage.segment.os = os
        self.assertEqual((yield client.fetch("t", 0, 0)), FetchResult([(0, b"a"), (1, b"b")], 2))
        self.assertEqual((yield client.produce("t", 0, [b"g"])), [2])
        self.assertEqual((yield client.fetch("t", 0, 0)),
                         FetchResult([(0, b"a"), (1, b"b"), (2, b"g")], 3))
        # and what is on disk reads back the same after a restart
        yield client.close()
        yield binary.close()
        yield self.restart()
        client = yield self.client()
        self.assertEqual((yield client.fetch("t", 0, 0)),
                         FetchResult([(0, b"a"), (1, b"b"), (2, b"g")], 3))

    @defer.inlineCallbacks
    def test_15_binary_examples_byte_exact(self):
        """Every binary example of §7, frame for frame."""
        yield self.start()
        raw = yield self.raw()
        create = bytes.fromhex("00000008 05 000174 00000003")
        raw.write(create + bytes.fromhex("00000001 06"))
        self.assertEqual([frame(r) for r in (yield raw.take(2))], [
            bytes.fromhex("00000002 0501"),
            bytes.fromhex("0000000c 06 00000001 000174 00000003"),
        ])
        client = yield self.client()
        yield client.produce("t", 0, [b"x"] * 41)
        requests = [
            "00000012 01 000174 00000000 00000001 00000002 6162",
            "00000016 02 0000 000174 00000000 0000000000000029 00010000",
            "00000013 03 000167 000174 00000000 000000000000002a",
            "0000000b 04 000167 000174 00000000",
            "0000000b 04 000168 000174 00000000",
            "00000008 08 000174 00000000",
            "00000001 ff",
        ]
        raw.write(b"".join(bytes.fromhex(r) for r in requests))
        replies = yield raw.take(len(requests))
        self.assertEqual([frame(r) for r in replies], [bytes.fromhex(h) for h in [
            "0000000d 01 0000000000000029 00000001",
            "00000013 02 00000001 00000002 6162 000000000000002a",
            "00000002 0301",
            "0000000a 0401 000000000000002a",
            "00000002 0400",
            "00000010 08 000174 00000000 000000000000002a",
            "00000001 ff",
        ]])
        # ListTopics and DescribePartition against §7's own numbers
        yield client.produce("t", 0, [b"y"])
        raw.write(bytes.fromhex("00000001 06 00000008 08 000174 00000000"))
        self.assertEqual([frame(r) for r in (yield raw.take(2))], [
            bytes.fromhex("0000000c 06 00000001 000174 00000003"),
            bytes.fromhex("00000010 08 000174 00000000 000000000000002b"),
        ])

    @defer.inlineCallbacks
    def test_15_binary_group_rule_and_ends(self):
        yield self.start()
        client = yield self.client(binary=True)
        self.assertEqual((yield client.produce("t", 0, [b"0123456789"] * 5)), [0, 1, 2, 3, 4])
        rows = [(o, b"0123456789") for o in range(5)]
        self.assertTrue((yield client.commit("g", "t", 0, 3)))
        # a group's fetch starts at its commit, whatever the request says
        self.assertEqual((yield client.fetch("t", 0, 0, group_id="g")), FetchResult(rows[3:], 5))
        self.assertEqual((yield client.fetch("t", 0, 4, group_id="g")), FetchResult(rows[3:], 5))
        self.assertEqual((yield client.fetch("t", 0, 100, group_id="g")), FetchResult(rows[3:], 5))
        # no commit: empty, next_offset 0
        self.assertEqual((yield client.fetch("t", 0, 2, group_id="none")), FetchResult([], 0))
        # no group: the request offset; past the end echoes it
        self.assertEqual((yield client.fetch("t", 0, 2)), FetchResult(rows[2:], 5))
        self.assertEqual((yield client.fetch("t", 0, 5)), FetchResult([], 5))
        self.assertEqual((yield client.fetch("t", 0, 100)), FetchResult([], 100))
        # max_bytes counts 12 + payload per record, at least one record
        self.assertEqual((yield client.fetch("t", 0, 0, max_bytes=44)), FetchResult(rows[:2], 2))
        self.assertEqual((yield client.fetch("t", 0, 0, max_bytes=43)), FetchResult(rows[:1], 1))
        self.assertEqual((yield client.fetch("t", 0, 0, max_bytes=0)), FetchResult(rows[:1], 1))
        # the commit is the JSON variant's too
        json_client = yield self.client()
        self.assertEqual((yield json_client.committed("g", "t", 0)), 3)
        self.assertFalse((yield client.commit("g", "nope", 0, 1)))

    @defer.inlineCallbacks
    def test_15_binary_error_codes(self):
        yield self.start(topics={"max_partitions": 8})
        client = yield self.client(binary=True)
        yield client.create_topic("t", 2)
        f = "failed to parse request: "
        yield self.assertError(client.fetch("nope", 0, 0),
                               "partition not found: topic=nope, partition=0", 10)
        yield self.assertError(client.produce("t", 2, [b"x"]),
                               "partition not found: topic=t, partition=2", 10)
        yield self.assertError(client.create_topic("t", 1), "topic exists: t", 11)
        yield self.assertError(client.create_topic("u", 0),
                               "partition count must be at least 1", 12)
        yield self.assertError(client.create_topic("u", 9),
                               "invalid request: partition count 9 outside 1..8", 2)
        yield self.assertError(client.create_topic("a b", 1), "invalid topic name: 'a b'", 2)
        yield self.assertError(client.produce("a b", 0, [b"x"]), "invalid topic name: 'a b'", 2)
        yield self.assertError(client.describe_topic("nope"), "unknown topic: nope", 13)
        yield self.assertError(client.describe_partition("nope", 0), "unknown topic: nope", 13)
        yield self.assertError(client.describe_partition("t", 2),
                               "partition not found: topic=t, partition=2", 14)
        # decode errors (code 2) keep the connection open
        raw = yield self.raw()
        produce = b_produce("t", 0, [b"ab"])
        cases = [
            (produce[:-1], f + "truncated Produce frame"),
            (produce + b"\x00", f + "1 trailing bytes after Produce frame"),
            (b"\x01\x00\x02\xff\xfe" + produce[4:], f + "invalid UTF-8 in Produce frame"),
            (b_fetch("t", 0, 0)[:-2], f + "truncated Fetch frame"),
            (b"\x05\x00\x01t", f + "truncated CreateTopic frame"),
            (b"\x06\x00", f + "1 trailing bytes after ListTopics frame"),
            (b"\x01\x00\x01t\x00\x00\x00\x00\xff\xff\xff\xff", f + "truncated Produce frame"),
        ]
        for payload, message in cases:
            self.assertEqual((yield raw.call(payload)), binary_error(2, message), payload)
        self.assertEqual((yield raw.call(b"\xff")), b"\xff")
        self.assertEqual(self.state("t").high_watermark, 0)
        # code 1: an empty frame after a binary one is a frame error: closed
        raw.send(b"")
        self.assertEqual((yield raw.take()), [binary_error(1, f + "empty frame")])
        yield raw.lost
        # code 1 for an oversized frame after a binary one, then closed
        raw = yield self.raw()
        self.assertEqual((yield raw.call(b"\xff")), b"\xff")
        raw.write(struct.pack(">I", MAX + 1))
        self.assertEqual((yield raw.take()), [binary_error(1, "max frame size exceeded")])
        yield raw.lost

    @defer.inlineCallbacks
    def test_16_json_and_binary_on_one_connection(self):
        yield self.start()
        raw = yield self.raw()
        answers = yield raw.call(
            produce_req("t", 0, [[1]]),
            b_produce("t", 0, [b"\x02", b"\x03"]),
            b"\xff",
            fetch_req("t", 0, 0),
            b_fetch("t", 0, 1),
            b"{",
            b"\x06",
            js({"OffsetCommit": {"topic": "t", "partition": 0, "group_id": "g", "offset": 2}}),
            b"\x04" + b_str("g") + b_str("t") + b"\x00\x00\x00\x00",
            b"",          # empty: answered in the last frame's variant (binary) ...
        )
        self.assertEqual(answers[:9], [
            b'{"Produce":{"offsets":[0]}}',
            b"\x01" + struct.pack(">QI", 1, 2),
            b"\xff",
            fetch_reply([(0, b"\x01"), (1, b"\x02"), (2, b"\x03")], 3),
            b_fetch_reply([b"\x02", b"\x03"], 3),
            json_error("failed to parse request: invalid JSON: unexpected end of data: "
                       "line 1 column 2 (char 1)"),
            b"\x06\x00\x00\x00\x01" + b_str("t") + b"\x00\x00\x00\x01",
            b'{"OffsetCommit":{"success":true}}',
            b"\x04\x01" + struct.pack(">Q", 2),
        ])
        # ... where it is a frame error that closes the connection
        self.assertEqual(answers[9], binary_error(1, "failed to parse request: empty frame"))
        yield raw.lost

    @defer.inlineCallbacks
    def test_16_binary_only_requests(self):
        yield self.start()
        client = yield self.client(binary=True)
        self.assertIsNone((yield client.ping()))
        self.assertEqual((yield client.list_topics()), [])
        self.assertTrue((yield client.create_topic("zeta", 3)))
        self.assertTrue((yield client.create_topic("alpha", 1)))
        yield client.produce("zeta", 1, [b"a", b"b"])
        yield client.produce("zeta", 2, [b"c"])
        self.assertEqual((yield client.list_topics()), [("alpha", 1), ("zeta", 3)])
        self.assertEqual((yield client.describe_topic("zeta")),
                         rc.DescribeTopicResponse("zeta", 3, ((0, 0), (1, 2), (2, 1))))
        self.assertEqual((yield client.describe_partition("zeta", 1)), 2)
        self.assertEqual((yield client.describe_partition("alpha", 0)), 0)
        text = yield client.metrics()
        self.assertIn('gateway_partition_high_watermark{partition="1",topic="zeta"} 2.0\n', text)
        self.assertIn('gateway_partition_high_watermark{partition="0",topic="alpha"} 0.0\n', text)
        # JSON clients see what the binary one created
        json_client = yield self.client()
        self.assertEqual((yield json_client.fetch("zeta", 1, 0)),
                         FetchResult([(0, b"a"), (1, b"b")], 2))

    @defer.inlineCallbacks
    def test_16_binary_variant_off(self):
        """``binary: false``: every frame is JSON, so a binary frame gets a
        JSON parse Error (and an empty frame never closes)."""
        yield self.start(listeners=[{"dialect": "rustlog", "binary": False,
                                     "endpoint": "tcp:0:interface=127.0.0.1"}])
        raw = yield self.raw()
        for payload in [b"\xff", b_produce("t", 0, [b"x"]), b"\x06"]:
            answer = yield raw.call(payload)
            message = orjson.loads(answer)["Error"]["message"]
            self.assertTrue(message.startswith("failed to parse request: invalid JSON: "), answer)
        self.assertEqual((yield raw.call(b"")), json_error("failed to parse request: empty frame"))
        self.assertEqual((yield raw.call(produce_req("t", 0, [[1]]))), b'{"Produce":{"offsets":[0]}}')

    @defer.inlineCallbacks
    def test_17_record_too_large_stores_nothing(self):
        yield self.start(limits={"max_record_bytes": 100})
        client = yield self.client()
        binary = yield self.client(binary=True)
        yield client.produce("t", 0, [b"first"])
        yield self.assertError(client.produce("t", 0, [b"a" * 10, b"b" * 101, b"c"]),
                               "record too large: 101 bytes, limit 100")
        yield self.assertError(binary.produce("t", 0, [b"d", b"e" * 1000]),
                               "record too large: 1000 bytes, limit 100", 500)
        self.assertEqual((yield client.fetch("t", 0, 0)), FetchResult([(0, b"first")], 1))
        # exactly the limit is fine
        self.assertEqual((yield client.produce("t", 0, [b"f" * 100, b"g"])), [1, 2])
        self.assertEqual((yield client.fetch("t", 0, 1)),
                         FetchResult([(1, b"f" * 100), (2, b"g")], 3))
        # the same answer for a produce to a new topic
        yield self.assertError(client.produce("other", 0, [b"x" * 101]),
                               "record too large: 101 bytes, limit 100")

    @defer.inlineCallbacks
    def test_18_record_too_large_for_a_json_reply(self):
        """A 4 MiB record of byte 255, written through the bus (as another
        dialect would), costs 16 MiB as JSON: the Fetch from its offset is an
        Error naming it, never an oversized frame, and the next offset goes on."""
        yield self.start(limits={"max_record_bytes": 4 * MiB})
        client = yield self.client()
        yield client.produce("t", 0, [b"before"])
        huge = b"\xff" * (4 * MiB)
        appended = yield self.service.bus.execute(cmd.Produce("t", 0, RecordBatch([huge])))
        o = appended.base_offset
        self.assertEqual(o, 1)
        # 3 MiB of byte 0 is 6 MiB as JSON: more than the cheap bound allows,
        # but its exact size fits, so it is served.
        zeros = b"\x00" * (3 * MiB)
        yield self.service.bus.execute(cmd.Produce("t", 0, RecordBatch([zeros])))
        yield client.produce("t", 0, [b"after"])
        yield self.assertError(client.fetch("t", 0, o),
                               f"record too large: offset={o}, max_frame_bytes=10485760")
        yield self.assertError(client.fetch("t", 0, o, max_bytes=1),
                               f"record too large: offset={o}, max_frame_bytes=10485760")
        # a group whose commit is O starts there, and gets the same Error
        yield client.commit("g", "t", 0, o)
        yield self.assertError(client.fetch("t", 0, 0, group_id="g"),
                               f"record too large: offset={o}, max_frame_bytes=10485760")
        # from before it: the reply stops in front of it
        self.assertEqual((yield client.fetch("t", 0, 0, max_bytes=MAX)),
                         FetchResult([(0, b"before")], 1))
        # from O + 1 the fetch goes on
        self.assertEqual((yield client.fetch("t", 0, o + 1, max_bytes=MAX)),
                         FetchResult([(o + 1, zeros)], o + 2))
        self.assertEqual((yield client.fetch("t", 0, o + 2)), FetchResult([(o + 2, b"after")], o + 3))
        # the binary variant carries raw bytes: 4 MiB fits
        binary = yield self.client(binary=True)
        self.assertEqual((yield binary.fetch("t", 0, o, max_bytes=1)), FetchResult([(o, huge)], o + 1))
        # ... and stops before a record that would pass 10 MiB together
        self.assertEqual((yield binary.fetch("t", 0, o, max_bytes=MAX)),
                         FetchResult([(o, huge), (o + 1, zeros), (o + 2, b"after")], o + 3))
        # the connection that got the Error is fine
        self.assertEqual((yield client.produce("t", 0, [b"last"])), [o + 3])


# ---------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------

class ConnectionTests(GatewayTest):

    @defer.inlineCallbacks
    def test_many_connections_at_once(self):
        yield self.start()
        n = 50
        clients = yield defer.gatherResults([self.client() for _ in range(n)])

        def work(i, client):
            calls = []
            for j in range(4):
                calls.append(client.produce("shared", 0, [b"%d:%d:a" % (i, j), b"%d:%d:b" % (i, j)]))
                calls.append(client.produce(f"own-{i}", 0, [b"%d" % j]))
            return defer.gatherResults(calls)
        results = yield defer.gatherResults([work(i, c) for i, c in enumerate(clients)])
        written = {}
        for i, offsets in enumerate(results):
            shared = offsets[0::2]
            own = offsets[1::2]
            self.assertEqual(own, [[0], [1], [2], [3]])
            for j, pair in enumerate(shared):
                self.assertEqual(pair[1], pair[0] + 1)
                written[pair[0]] = b"%d:%d:a" % (i, j)
                written[pair[1]] = b"%d:%d:b" % (i, j)
        self.assertEqual(sorted(written), list(range(8 * n)))
        reader = clients[0]
        got = yield reader.fetch("shared", 0, 0, max_bytes=MiB)
        self.assertEqual(got, FetchResult(sorted(written.items()), 8 * n))
        owns = yield defer.gatherResults([
            c.fetch(f"own-{i}", 0, 0) for i, c in enumerate(clients)])
        for result in owns:
            self.assertEqual(result, FetchResult([(j, b"%d" % j) for j in range(4)], 4))
        self.assertEqual(len(self.service.listeners[0].factory.connections), n)

    @defer.inlineCallbacks
    def test_bad_frames_do_not_affect_other_connections(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a"])
        # a request of the good connection is in flight while the others misbehave
        first = client.fetch("t", 0, 0)
        bad = yield self.raw()
        bad.write(struct.pack(">I", MAX + 1))
        garbage = yield self.raw()
        garbage.send(b"\x00garbage", b"{", b"")
        torn = yield self.raw()
        torn.write(struct.pack(">I", 100) + b'{"Produce":{"topic":"t"')
        self.assertEqual((yield first), FetchResult([(0, b"a")], 1))
        self.assertEqual((yield bad.take()), [json_error("max frame size exceeded")])
        yield bad.lost
        self.assertEqual(len((yield garbage.take(3))), 3)
        torn.transport.abortConnection()
        yield torn.lost
        self.assertEqual((yield client.produce("t", 0, [b"b"])), [1])
        self.assertEqual((yield client.fetch("t", 0, 0)), FetchResult([(0, b"a"), (1, b"b")], 2))
        self.assertFalse(garbage.closed)
        self.assertEqual((yield garbage.call(fetch_req("t", 0, 1))), fetch_reply([(1, b"b")], 2))

    @defer.inlineCallbacks
    def test_stopping_the_gateway_closes_connections(self):
        yield self.start()
        client = yield self.client()
        yield client.produce("t", 0, [b"a"])
        raw = yield self.raw()
        yield self.service.stopService()
        yield raw.lost
        yield self.assertFailure(client.fetch("t", 0, 0), Exception)


# ---------------------------------------------------------------------------
# Subprocess: durability across restarts and crashes, and the CLI
# ---------------------------------------------------------------------------

class BlockingClient:
    """A tiny blocking client on the codec, for a gateway in a subprocess."""

    def __init__(self, port, variant=rc.JSON):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.variant = variant

    def call(self, request):
        self.sock.sendall(frame(rc.encode_request(self.variant, request)))
        (n,) = struct.unpack(">I", self._read(4))
        _, response = rc.decode_response(self._read(n))
        return response

    def _read(self, n):
        data = bytearray()
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the gateway")
            data += chunk
        return bytes(data)

    def close(self):
        self.sock.close()


DURABLE_CONFIG = """\
storage:
  path: ./data
  fsync: always
listeners:
  - {dialect: rustlog, endpoint: "tcp:0:interface=127.0.0.1"}
"""


class SubprocessTests(TestCase):
    timeout = 60

    def tempdir(self):
        path = tempfile.mkdtemp(prefix="gateway-rustlog-")
        self.addCleanup(shutil.rmtree, path, True)
        return path

    def gateway(self, config_text=DURABLE_CONFIG):
        process = GatewayProcess(self.tempdir(), config_text)
        self.addCleanup(lambda: process.stop("KILL"))
        self.addCleanup(process.log.close)
        return process

    def client(self, port, variant=rc.JSON):
        client = BlockingClient(port, variant)
        self.addCleanup(client.close)
        return client

    def write_and_commit(self, client):
        """Fifty produces and commits, each acknowledged before the next."""
        for i in range(50):
            self.assertEqual(client.call(rc.ProduceRequest("t", 0, (b"%d" % i, b"x" * i))),
                             rc.ProduceResponse(2 * i, 2))
            self.assertEqual(client.call(rc.OffsetCommitRequest("t", 0, "g", 2 * i + 1)),
                             rc.OffsetCommitResponse(True))

    def check_intact(self, client):
        expected = []
        for i in range(50):
            expected += [(2 * i, b"%d" % i), (2 * i + 1, b"x" * i)]
        self.assertEqual(client.call(rc.FetchRequest("t", 0, 0, 10 * MiB)),
                         rc.FetchResponse(tuple(expected), 100))
        self.assertEqual(client.call(rc.OffsetFetchRequest("t", 0, "g")), rc.OffsetFetchResponse(99))
        # and the log goes on densely
        self.assertEqual(client.call(rc.ProduceRequest("t", 0, (b"next",))),
                         rc.ProduceResponse(100, 1))

    def test_durable_across_sigterm(self):
        process = self.gateway()
        ports = process.start()
        self.write_and_commit(self.client(ports["rustlog"]))
        self.assertEqual(process.stop("TERM"), 0)
        ports = process.start()
        self.check_intact(self.client(ports["rustlog"]))
        self.assertEqual(process.stop("TERM"), 0)

    def test_durable_across_sigkill(self):
        process = self.gateway()
        ports = process.start()
        self.write_and_commit(self.client(ports["rustlog"]))
        self.assertEqual(process.stop("KILL"), -signal.SIGKILL)
        ports = process.start()
        self.check_intact(self.client(ports["rustlog"]))

    def run_cli(self, config_text):
        directory = self.tempdir()
        path = os.path.join(directory, "config.yaml")
        with open(path, "w") as f:
            f.write(config_text)
        return subprocess.run([sys.executable, "-m", "gateway.cli", "run", "-c", path],
                              capture_output=True, text=True, timeout=30, cwd=directory,
                              check=False)

    def test_bad_config_exits_2_with_one_line(self):
        result = self.run_cli(DURABLE_CONFIG.replace("always", "sometimes"))
        self.assertEqual((result.returncode, result.stdout, result.stderr), (
            2, "", ("gateway: bad config: storage.fsync: must be one of always, interval, "
                    "never, got 'sometimes'\n")))

    def test_unknown_dialect_exits_2(self):
        result = self.run_cli(DURABLE_CONFIG.replace("rustlog", "rustlogg"))
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stdout, "")
        self.assertEqual(result.stderr.count("\n"), 1)
        self.assertTrue(result.stderr.startswith(
            "gateway: bad config: listeners[0].dialect: unknown dialect 'rustlogg' (known: "),
            result.stderr)

    def test_port_in_use_exits_1_with_one_line(self):
        busy = socket.socket()
        self.addCleanup(busy.close)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = self.run_cli(DURABLE_CONFIG.replace("tcp:0:", f"tcp:{port}:"))
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stdout, "")
        # Log lines (timestamped) may surround it; the problem is one line.
        problems = [line for line in result.stderr.splitlines() if not line[:4].isdigit()]
        self.assertEqual(problems, [(
            f"gateway: cannot listen: Couldn't listen on 127.0.0.1:{port}: "
            "[Errno 98] Address already in use.")])
        self.assertNotIn("Traceback", result.stderr)
