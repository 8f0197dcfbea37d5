"""Pravega with the other dialects on one topic (pravega.md §11 item 12,
DESIGN.md "Records and offsets"): RustLog, TANK and Figg write and read the
same partition as a Pravega writer and reader.

The record at offset 41 is offset 41 to RustLog, seq 42 to TANK, "next =
42" to Figg, and byte position Σ_{i<41}(8 + len(value_i)) to Pravega. The
topic's name has an ``_``, so Pravega reaches it through the escaped scoped
name ``s/x--shared-ulog/0.#epoch.0`` and the plain ``shared_log/0``.
"""
from twisted.internet import defer, reactor

from plugins.figg.client import FiggClient
from plugins.pravega.client import EventReader, EventWriter, connect
from plugins.tank.client import connect as tank_connect
from tests.support import gateway_config, start_gateway
from tests.test_pravega_server import PravegaTest, events, sleep

TOPIC = "shared_log"
SEG = "s/x--shared-ulog/0.#epoch.0"


class CrossDialectTests(PravegaTest):

    @defer.inlineCallbacks
    def start(self, **sections):
        self.directory = self.tempdir()
        listeners = [{"dialect": d, "endpoint": "tcp:0:interface=127.0.0.1"}
                     for d in ("pravega", "rustlog", "tank", "figg")]
        listeners[0]["scope"] = "s"
        listeners[0]["long_poll_ms"] = 20000
        self.config = gateway_config(self.directory, listeners, **sections)
        self.service, self.ports = yield start_gateway(self, self.config)
        self.port = self.ports["pravega"]
        self.rustlog_port = self.ports["rustlog"]

    @defer.inlineCallbacks
    def tank(self):
        client = yield tank_connect(reactor, "127.0.0.1", self.ports["tank"])
        self.addCleanup(client.close)
        return client

    @defer.inlineCallbacks
    def figg(self):
        client = FiggClient(reactor, "127.0.0.1", self.ports["figg"])
        yield client.connect()
        self.addCleanup(client.close)
        return client

    @defer.inlineCallbacks
    def pravega(self):
        proto = yield connect(reactor, "127.0.0.1", self.port)
        self.addCleanup(proto.close)
        return proto

    @defer.inlineCallbacks
    def test_one_topic_every_dialect(self):
        yield self.start()
        yield self.create(TOPIC)
        rustlog = yield self.rustlog()
        tank = yield self.tank()
        figg = yield self.figg()
        writer = EventWriter(reactor, lambda: connect(reactor, "127.0.0.1", self.port), SEG)
        self.addCleanup(writer.close)
        values = []
        for i in range(12):
            batch = [b"", b"pravega-%d-%s" % (i, b"p" * i)]
            for v in batch:
                writer.write(v)
            yield writer.flush()
            values += batch
            yield rustlog.produce(TOPIC, 0, [b"rustlog-%d" % i])
            values.append(b"rustlog-%d" % i)
            # TANK keys are invisible to Pravega readers
            yield tank.produce(TOPIC, 0, [b"tank-%d" % i], keys=[b"key-%d" % i])
            values.append(b"tank-%d" % i)
            yield figg.publish_blocking(TOPIC, b"figg-%d" % i)
            values.append(b"figg-%d" % i)
        self.assertEqual(len(values), 60)
        positions = [0]
        for v in values:
            positions.append(positions[-1] + 8 + len(v))

        # Pravega reads everything, at the positions DESIGN defines
        proto = yield self.pravega()
        info = yield proto.segment_info(SEG)
        self.assertEqual(info.write_offset, positions[-1])
        reader = EventReader(proto, SEG, read_size=1000)
        got = []
        while reader.position < positions[-1]:
            got += yield reader.read()
        self.assertEqual(got, list(zip(positions, values)))
        plain = yield proto.read_segment(f"{TOPIC}/0", 0)
        self.assertEqual(plain.data, events(*values))

        # the record at offset 41, as each dialect names it
        target = values[41]
        self.assertEqual(target, b"pravega-8-pppppppp")
        self.assertEqual((yield rustlog.fetch(TOPIC, 0, 41, max_bytes=1)).records[0], (41, target))
        fetched = yield tank.fetch(TOPIC, 0, 42)
        self.assertEqual((fetched.messages[0].seq, fetched.messages[0].value), (42, target))
        seen = []
        yield figg.subscribe(TOPIC, seen.append, offset=41)
        yield self.until(lambda: seen)
        self.assertEqual((seen[0].offset, seen[0].data), (42, target))
        at = yield EventReader(proto, SEG, positions[41]).read()
        self.assertEqual(at[0], (positions[41], target))
        mid = yield proto.read_segment(SEG, positions[41] + 3, 8)
        self.assertEqual(mid.data, events(*values)[positions[41] + 3:positions[41] + 11])

        # the other dialects read what Pravega wrote
        everything = yield rustlog.fetch(TOPIC, 0, 0, max_bytes=1 << 20)
        self.assertEqual([v for _, v in everything.records], values)
        fetched = yield tank.fetch(TOPIC, 0, 1, fetch_size=1 << 20)
        self.assertEqual([m.value for m in fetched.messages], values)
        self.assertEqual([m.seq for m in fetched.messages], list(range(1, 61)))

    @defer.inlineCallbacks
    def test_parked_read_is_woken_by_every_dialect(self):
        yield self.start()
        yield self.create(TOPIC)
        rustlog = yield self.rustlog()
        tank = yield self.tank()
        figg = yield self.figg()
        proto = yield self.pravega()
        reader = EventReader(proto, SEG)
        for name, write in (("tank", lambda v: tank.produce(TOPIC, 0, [v])),
                            ("figg", lambda v: figg.publish_blocking(TOPIC, v)),
                            ("rustlog", lambda v: rustlog.produce(TOPIC, 0, [v]))):
            waiting = reader.read()
            yield sleep(0.1)
            self.assertFalse(waiting.called, name)
            yield write(name.encode())
            self.assertEqual([v for _, v in (yield waiting)], [name.encode()])

    @defer.inlineCallbacks
    def test_seal_through_pravega_is_seen_by_every_dialect(self):
        yield self.start()
        yield self.create(TOPIC)
        figg = yield self.figg()
        yield figg.publish_blocking(TOPIC, b"last")
        proto = yield self.pravega()
        yield proto.seal_segment(SEG)
        rustlog = yield self.rustlog()
        failed = yield defer.DeferredList([rustlog.produce(TOPIC, 0, [b"x"])],
                                          consumeErrors=True)
        self.assertFalse(failed[0][0])
        tank = yield self.tank()
        failed = yield defer.DeferredList([tank.produce(TOPIC, 0, [b"x"])], consumeErrors=True)
        self.assertFalse(failed[0][0])
        reader = EventReader(proto, SEG)
        self.assertEqual((yield reader.read()), [(0, b"last")])
        self.assertEqual((yield reader.read()), [])
        self.assertTrue(reader.end_of_segment)

    def until(self, check, timeout=10.0):
        deadline = reactor.seconds() + timeout

        @defer.inlineCallbacks
        def loop():
            while not check():
                if reactor.seconds() > deadline:
                    raise AssertionError("condition not reached in time")
                yield sleep(0.02)
        return loop()
