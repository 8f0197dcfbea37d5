"""TLS listeners through Twisted ``ssl:`` endpoint strings, for every
dialect and for the metrics endpoint, with a self-signed certificate made
at test time; clients verify it for ``localhost``. Kafka is also checked
with kafka-python's own TLS support."""
import uuid

from twisted.internet import defer, threads
from twisted.internet.endpoints import connectProtocol

from plugins.figg import codec as fc
from plugins.pravega import codec as pc
from plugins.pravega.client import PravegaClientProtocol
from plugins.rustlog.client import RustLogClientProtocol
from plugins.tank.client import TankClientProtocol
from tests.figg_support import RawFigg
from tests.ops_support import (
    DIALECTS, HTTP, LOCAL, LogLines, OpsTest, TLSKafkaClient, client_endpoint,
    make_certificate, raw_connect, sample, tls_endpoint)


class TLSTests(OpsTest):

    @defer.inlineCallbacks
    def setUp(self):
        directory = self.tempdir()
        self.key, self.cert, self.pem = make_certificate(directory)
        endpoint = tls_endpoint(self.key, self.cert)
        yield self.start([{"dialect": d, "endpoint": endpoint} for d in DIALECTS],
                         directory=directory, metrics={"endpoint": endpoint})
        self.port = dict(zip(DIALECTS, self.ports))

    @defer.inlineCallbacks
    def connect(self, dialect, proto):
        yield connectProtocol(client_endpoint(self.port[dialect], self.pem), proto)
        self.addCleanup(lambda: proto.transport.loseConnection())
        return proto

    def stored(self, topic):
        return self.service.bus.decode(self.service.store.read(topic, 0, 0, 1 << 20)[0]).values

    @defer.inlineCallbacks
    def test_rustlog(self):
        client = yield self.connect("rustlog", RustLogClientProtocol())
        yield client.produce("tls.rustlog", 0, [b"secret", b"sauce"])
        got = yield client.fetch("tls.rustlog", 0, 0)
        self.assertEqual([v for _, v in got.records], [b"secret", b"sauce"])

    @defer.inlineCallbacks
    def test_tank(self):
        client = yield self.connect("tank", TankClientProtocol())
        yield client.produce("tls.tank", 0, [b"a", b"b"])
        got = yield client.fetch("tls.tank", 0, 0)
        self.assertEqual([m.value for m in got.messages], [b"a", b"b"])

    @defer.inlineCallbacks
    def test_kafka(self):
        def run():
            with TLSKafkaClient("127.0.0.1", self.port["kafka"], self.cert) as client:
                client.produce("tls.kafka", 0, [(b"k", b"v")])
                return [(m.key, m.value) for m in client.fetch("tls.kafka", 0, 0).messages]
        self.assertEqual((yield threads.deferToThread(run)), [(b"k", b"v")])

    @defer.inlineCallbacks
    def test_kafka_python_over_tls(self):
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition
        servers = f"localhost:{self.port['kafka']}"
        tls = {"security_protocol": "SSL", "ssl_cafile": self.cert,
               "api_version": (0, 9)}

        def run():
            producer = KafkaProducer(bootstrap_servers=servers, **tls)
            try:
                producer.send("tls.kafka-python", b"over tls").get(timeout=20)
            finally:
                producer.close()
            consumer = KafkaConsumer(bootstrap_servers=servers, consumer_timeout_ms=10000,
                                     auto_offset_reset="earliest", **tls)
            try:
                consumer.assign([TopicPartition("tls.kafka-python", 0)])
                return [next(consumer).value]
            finally:
                consumer.close()
        self.assertEqual((yield threads.deferToThread(run)), [b"over tls"])

    @defer.inlineCallbacks
    def test_figg(self):
        conn = yield raw_connect(self, self.port["figg"], self.pem, proto=RawFigg())
        conn.send(fc.Publish(b"tls.figg", 1, b"hello"),
                  fc.Attach(b"tls.figg", 0, fc.FROM_OFFSET))
        got = yield conn.take(3)
        self.assertEqual(got, [fc.Ack(1), fc.Attached(b"tls.figg", 0),
                               fc.Data(b"tls.figg", 1, b"hello")])

    @defer.inlineCallbacks
    def test_pravega(self):
        client = yield self.connect("pravega", PravegaClientProtocol())
        yield client.hello
        segment = "gateway/tls.pravega/0.#epoch.0"
        yield client.create_segment(segment)
        writer = uuid.uuid4().bytes
        yield client.setup_append(segment, writer)
        data = pc.frame_events([b"e1", b"e2"])
        client.send(pc.AppendBlockEnd(writer, len(data), data, 2, 2, 9))
        read = yield client.read_segment(segment, 0)
        self.assertEqual(read.data, data)
        self.assertEqual(self.stored("tls.pravega"), [b"e1", b"e2"])

    @defer.inlineCallbacks
    def test_metrics_over_https(self):
        http = HTTP(self.pem)
        rustlog = yield self.connect("rustlog", RustLogClientProtocol())
        yield rustlog.produce("tls.metrics", 0, [b"x"])
        code, _, body = yield http.get(f"https://localhost:{self.metrics_port}/")
        self.assertEqual(code, 200)
        self.assertIn(b"<canvas", body)
        got = yield self.scrape(http, scheme="https")
        key = {"listener": "listeners[0]", "dialect": "rustlog"}
        self.assertEqual(sample(got, "gateway_connections_open", **key), 1)
        self.assertEqual(sample(got, "gateway_partition_appended_records_total",
                                topic="tls.metrics", partition="0"), 1)
        status = yield self.status(http, scheme="https")
        self.assertTrue(all(listener["tls"] for listener in status["listeners"]))

    @defer.inlineCallbacks
    def test_a_plain_client_on_a_tls_listener_is_dropped_quietly(self):
        logs = LogLines(self)
        conn = yield raw_connect(self, self.port["rustlog"])
        conn.transport.write(b"\x00\x00\x00\x02{}" * 100)
        yield conn.lost
        client = yield self.connect("rustlog", RustLogClientProtocol())
        yield client.produce("tls.after", 0, [b"still serving"])
        self.assertEqual(logs.failures(), [])


class PlainAndTLSTests(OpsTest):
    """One dialect on a plain and a TLS listener at once: the same topics."""

    @defer.inlineCallbacks
    def test_same_log_either_way(self):
        directory = self.tempdir()
        key, cert, pem = make_certificate(directory)
        yield self.start([{"dialect": "rustlog", "endpoint": LOCAL},
                          {"dialect": "rustlog", "endpoint": tls_endpoint(key, cert)}],
                         directory=directory)
        plain = RustLogClientProtocol()
        yield connectProtocol(client_endpoint(self.ports[0]), plain)
        self.addCleanup(plain.transport.loseConnection)
        secure = RustLogClientProtocol()
        yield connectProtocol(client_endpoint(self.ports[1], pem), secure)
        self.addCleanup(secure.transport.loseConnection)
        yield plain.produce("both", 0, [b"plain"])
        yield secure.produce("both", 0, [b"secure"])
        got = yield plain.fetch("both", 0, 0)
        self.assertEqual([v for _, v in got.records], [b"plain", b"secure"])
