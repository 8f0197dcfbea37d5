"""The RustLog client against a scripted fake server on a real socket: FIFO
matching of pipelined requests, Error replies, and connection loss."""
from twisted.internet import defer, reactor
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.protocol import Factory
from twisted.protocols.basic import Int32StringReceiver
from twisted.trial.unittest import TestCase

from plugins.rustlog import codec as c
from plugins.rustlog.client import FetchResult, RustLogError, connect

CLOSE = object()


class Raw(bytes):
    """A script entry written as it is, without a length prefix."""


class ScriptedServer(Int32StringReceiver):
    """After the n-th request, sends ``script[n]``: a list of reply payloads,
    possibly ending in CLOSE. An empty list holds the replies back, so that
    several requests are in flight together."""

    MAX_LENGTH = c.MAX_FRAME_BYTES

    def connectionMade(self):
        self.factory.connections.append(self)

    def stringReceived(self, payload):
        step = len(self.factory.received)
        self.factory.received.append(payload)
        for reply in self.factory.script[step]:
            if reply is CLOSE:
                self.transport.loseConnection()
            elif type(reply) is Raw:
                self.transport.write(reply)
            else:
                self.sendString(reply)

    def connectionLost(self, reason):
        self.factory.closed.callback(None)


class ScriptedFactory(Factory):
    protocol = ScriptedServer

    def __init__(self, script):
        self.script = script
        self.received = []
        self.connections = []
        self.closed = defer.Deferred()


class ClientTests(TestCase):

    @defer.inlineCallbacks
    def connect(self, script, binary=False):
        factory = ScriptedFactory(script)
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        client = yield connect(reactor, "127.0.0.1", port.getHost().port, binary=binary)

        @defer.inlineCallbacks
        def close():
            yield client.close()
            yield factory.closed
        self.addCleanup(close)
        return client, factory

    @defer.inlineCallbacks
    def test_pipelined_requests_are_matched_in_order(self):
        replies = [
            b'{"Produce":{"offsets":[41,42]}}',
            b'{"Fetch":{"records":[{"offset":41,"payload":[104,105]},'
            b'{"offset":42,"payload":[0,255]}],"next_offset":43}}',
            b'{"OffsetCommit":{"success":true}}',
            b'{"OffsetFetch":{"offset":null}}',
        ]
        client, factory = yield self.connect([[], [], [], replies])
        results = yield defer.gatherResults([
            client.produce("t", 0, [b"hi", b"\x00\xff"]),
            client.fetch("t", 0, 41),
            client.commit("g", "t", 0, 43),
            client.committed("g", "t", 0),
        ])
        self.assertEqual(results, [
            [41, 42],
            FetchResult([(41, b"hi"), (42, b"\x00\xff")], 43),
            True,
            None,
        ])
        self.assertEqual(factory.received, [
            b'{"Produce":{"topic":"t","partition":0,"records":[[104,105],[0,255]]}}',
            b'{"Fetch":{"topic":"t","partition":0,"offset":41,"max_bytes":1048576,"group_id":null}}',
            b'{"OffsetCommit":{"topic":"t","partition":0,"group_id":"g","offset":43}}',
            b'{"OffsetFetch":{"topic":"t","partition":0,"group_id":"g"}}',
        ])

    @defer.inlineCallbacks
    def test_error_reply_fails_only_its_own_request(self):
        error = b'{"Error":{"message":"partition not found: topic=nope, partition=0"}}'
        client, _ = yield self.connect([[], [error, b'{"OffsetFetch":{"offset":7}}']])
        failed = client.fetch("nope", 0, 0)
        fine = client.committed("g", "t", 0)
        e = yield self.assertFailure(failed, RustLogError)
        self.assertEqual(e.message, "partition not found: topic=nope, partition=0")
        self.assertIsNone(e.code)
        self.assertEqual((yield fine), 7)

    @defer.inlineCallbacks
    def test_send_raw(self):
        client, factory = yield self.connect([[b'{"OffsetCommit":{"success":false}}']])
        payload = c.encode_request(c.JSON, c.OffsetCommitRequest("t", 9, "g", 1))
        response = yield client.send_raw(payload)
        self.assertEqual(response, c.OffsetCommitResponse(False))
        self.assertEqual(factory.received, [payload])

    @defer.inlineCallbacks
    def test_binary_variant(self):
        script = [
            [c.encode_response(c.BINARY, c.ProduceResponse(41, 1))],
            [c.encode_response(c.BINARY, c.ErrorResponse("unknown partition", c.UNKNOWN_PARTITION))],
            [c.encode_response(c.BINARY, c.ListTopicsResponse((("t", 3),)))],
            [c.encode_response(c.BINARY, c.PongResponse())],
        ]
        client, factory = yield self.connect(script, binary=True)
        self.assertEqual((yield client.produce("t", 0, [b"ab"])), [41])
        e = yield self.assertFailure(client.fetch("t", 7, 0), RustLogError)
        self.assertEqual((e.code, e.message), (10, "unknown partition"))
        self.assertEqual((yield client.list_topics()), [("t", 3)])
        self.assertIsNone((yield client.ping()))
        self.assertEqual(factory.received[0], bytes.fromhex("01 0001 74 00000000 00000001 00000002 6162"))

    @defer.inlineCallbacks
    def test_binary_only_requests_fail_in_json_mode(self):
        client, factory = yield self.connect([])
        yield self.assertFailure(client.create_topic("t", 1), ValueError)
        self.assertEqual(factory.received, [])

    @defer.inlineCallbacks
    def test_connection_loss_fails_every_pending_request(self):
        client, _ = yield self.connect([[], [b'{"OffsetFetch":{"offset":1}}', CLOSE], []])
        first = client.committed("g", "t", 0)
        second = client.committed("g", "t", 1)
        third = client.committed("g", "t", 2)   # sent, never answered
        self.assertEqual((yield first), 1)
        yield self.assertFailure(second, ConnectionDone, ConnectionLost)
        yield self.assertFailure(third, ConnectionDone, ConnectionLost)
        yield self.assertFailure(client.committed("g", "t", 3), ConnectionDone, ConnectionLost)

    @defer.inlineCallbacks
    def test_oversized_reply_fails_the_call_and_drops_the_connection(self):
        # Only the length prefix of a 10 MiB + 1 reply and a little of its
        # body: the client must judge it on the prefix, not wait for the body.
        client, factory = yield self.connect([[], [Raw(b"\x00\xa0\x00\x01" + b"{" * 100)]])
        first = client.committed("g", "t", 0)
        second = client.committed("g", "t", 1)
        e = yield self.assertFailure(first, c.RustLogDecodeError)
        self.assertEqual(e.message, "failed to parse response: "
                                    "frame of 10485761 bytes exceeds 10485760")
        yield self.assertFailure(second, ConnectionDone, ConnectionLost)
        yield factory.closed

    @defer.inlineCallbacks
    def test_reply_of_exactly_10_mib_in_many_segments(self):
        values = (bytes(range(256)) * 40960)[:c.MAX_FRAME_BYTES - 17]
        payload = c.encode_response(c.BINARY, c.FetchResponse(((6, values),), 7))
        self.assertEqual(len(payload), c.MAX_FRAME_BYTES)
        data = len(payload).to_bytes(4, "big") + payload
        pieces = [Raw(data[i:i + 65536]) for i in range(0, len(data), 65536)]
        client, _ = yield self.connect([pieces])
        result = yield client.fetch("t", 0, 6)
        self.assertEqual(result, FetchResult([(6, values)], 7))
