"""A gateway killed (SIGKILL) and started again on the same data directory:
what every dialect acknowledged is there for every dialect, at the same
positions, and the state kept beside the records survives too: a group's
committed offset, a Pravega writer's event number (so a writer that resends
after the crash is not stored twice), a Figg subscriber's place.
"""
import shutil
import tempfile
import uuid

from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from plugins.pravega.client import EventWriter, connect as pravega_connect
from tests.cross_support import (
    DIALECTS, HOST, KEYED, Seen, native_positions, open_side, pravega_segment)
from tests.support import GatewayProcess

CONFIG = """
storage: {path: ./data}
listeners:
""" + "".join(f'  - {{dialect: {d}, endpoint: "tcp:0:interface=127.0.0.1"}}\n'
              for d in DIALECTS)

TOPIC = "durable"


class CrashRestart(TestCase):

    timeout = 90

    def setUp(self):
        self.directory = tempfile.mkdtemp(prefix="gateway-restart-")
        self.addCleanup(shutil.rmtree, self.directory, True)
        self.gateway = GatewayProcess(self.directory, CONFIG)
        self.ports = self.gateway.start()
        self.addCleanup(self.gateway.stop)

    @defer.inlineCallbacks
    def test_everything_acknowledged_survives_a_kill(self):
        values, keys, sides = [], [], []
        for dialect in DIALECTS:
            side = yield open_side(self, dialect, self.ports)
            sides.append(side)
            batch = [b"%s-%d" % (dialect.encode(), i) for i in range(2)]
            batch_keys = [b"key-%d" % i for i in range(2)] if dialect in KEYED else None
            yield side.produce(TOPIC, batch, batch_keys)
            values += batch
            keys += batch_keys or [None, None]
        # a Pravega writer with an identity of its own, and its event number
        writer_id = uuid.uuid4().bytes
        writer = EventWriter(reactor, lambda: pravega_connect(reactor, HOST,
                                                               self.ports["pravega"]),
                             pravega_segment(TOPIC), writer_id=writer_id)
        yield writer.write(b"pravega-writer-0")
        yield writer.write(b"pravega-writer-1")
        values += [b"pravega-writer-0", b"pravega-writer-1"]
        keys += [None, None]
        rustlog = yield open_side(self, "rustlog", self.ports)
        self.assertTrue((yield rustlog.client.commit("survivors", TOPIC, 0, 5)))
        figg = yield open_side(self, "figg", self.ports)
        seen = yield figg.read(TOPIC, 7)
        figg_offset = seen[-1].position
        # closed first, so that no client keeps reconnecting to the old ports
        yield writer.close()
        for side in sides + [rustlog, figg]:
            yield side.close()

        self.assertIsNotNone(self.gateway.stop("KILL"))
        self.ports = self.gateway.start()

        n = len(values)
        for dialect in DIALECTS:
            side = yield open_side(self, dialect, self.ports)
            got = yield side.read(TOPIC, n)
            positions = native_positions(dialect, values)
            self.assertEqual([(s.position, s.value) for s in got],
                             list(zip(positions, values)), dialect)
            if dialect in KEYED:
                self.assertEqual([s.key for s in got], keys, dialect)
        rustlog = yield open_side(self, "rustlog", self.ports)
        self.assertEqual((yield rustlog.client.committed("survivors", TOPIC, 0)), 5)
        pravega = yield open_side(self, "pravega", self.ports)
        self.assertEqual((yield pravega.proto.setup_append(pravega_segment(TOPIC), writer_id)),
                         2)
        # a Figg subscriber continues after the last message it saw
        figg = yield open_side(self, "figg", self.ports)
        got = yield figg.read(TOPIC, n - 7, offset=figg_offset)
        self.assertEqual(got[0], Seen(figg_offset + 1, None, None, values[7]))
