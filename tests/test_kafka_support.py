"""Helpers for the Kafka dialect's tests (no tests here): a raw Twisted
client that sends encoded frames and collects the answers as they arrive,
and gateway configurations with a Kafka listener."""
import os
import struct

from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol

from gateway.framing import FramedProtocol
from plugins.kafka import codec as kc
from tests.support import gateway_config

LOCAL = "tcp:0:interface=127.0.0.1"


def kafka_config(data_dir, kafka_options=None, **sections):
    """A Kafka listener and a RustLog one on port 0 of 127.0.0.1."""
    listeners = [{"dialect": "kafka", "endpoint": LOCAL, **(kafka_options or {})},
                 {"dialect": "rustlog", "endpoint": LOCAL}]
    return gateway_config(data_dir, listeners, **sections)


def data_dir(testcase):
    path = testcase.mktemp()
    os.makedirs(path)
    return path


class RawKafka(FramedProtocol):
    """Sends frames as they are; answers are kept in arrival order.

    ``call`` sends one request and fires with its decoded body once the
    answer with its correlation id arrives; ``send`` sends bytes and
    expects nothing. ``frames`` holds every answer frame received.
    """

    header = struct.Struct(">I")
    max_frame_bytes = 1 << 30

    def __init__(self):
        self.frames = []
        self.waiting = {}
        self.correlation = 0
        self.closed = defer.Deferred()
        self.is_closed = False

    def connectionMade(self):
        self.transport.setTcpNoDelay(True)

    def connectionLost(self, reason):
        self.is_closed = True
        waiting, self.waiting = self.waiting, {}
        for d, _, _ in waiting.values():
            d.errback(reason)
        self.closed.callback(None)

    def frameReceived(self, fields, frame):
        self.frames.append(frame)
        correlation = struct.unpack_from(">i", frame)[0]
        entry = self.waiting.pop(correlation, None)
        if entry is not None:
            d, key, version = entry
            d.callback(kc.decode_response(key, version, frame)[1])

    def frameTooLarge(self, fields):
        self.transport.loseConnection()

    def frame(self, key, version, body, client_id="test"):
        self.correlation += 1
        return self.correlation, kc.encode_request(key, version, self.correlation, client_id,
                                                   body)

    def call(self, key, version, body, client_id="test"):
        correlation, frame = self.frame(key, version, body, client_id)
        d = defer.Deferred()
        self.waiting[correlation] = (d, key, version)
        self.transport.write(frame)
        return d

    def send(self, data):
        self.transport.write(data)

    def close(self):
        if not self.is_closed:
            self.transport.loseConnection()
        return self.closed


@defer.inlineCallbacks
def connect_raw(testcase, port):
    client = yield connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), RawKafka())
    testcase.addCleanup(client.close)
    return client


def produce_body(topic, partition, records, acks=1, magic=0, codec=kc.CODEC_NONE):
    return kc.ProduceRequest(acks, 1000, ((topic, ((partition,
                                                    kc.encode_message_set(records, magic,
                                                                          codec)),)),))


def fetch_body(topic, partition, offset, max_bytes=1 << 20, max_wait_ms=0, min_bytes=0):
    return kc.FetchRequest(-1, max_wait_ms, min_bytes, ((topic, ((partition, offset,
                                                                  max_bytes),)),))


def only_partition(body):
    """The single partition answer of a one-topic, one-partition response."""
    return body.topics[0][1][0]


def sleep(seconds):
    d = defer.Deferred()
    reactor.callLater(seconds, d.callback, None)
    return d
