"""The raw-loopback baseline for Figg: a Twisted server with the gateway's
framing that does the least a Figg server can, and nothing durable.

- PUBLISH: an ACK with its seq_num, and the same bytes as DATA to every
  connection attached without the offset flag (a relay); what one read
  brings in is answered with one write per connection, as the gateway does;
- ATTACH without the flag: ATTACHED, then the relayed DATA;
- ATTACH with the flag: ATTACHED, then ``--backlog`` DATA frames of
  ``--size`` bytes, streamed as fast as the client reads through an
  ``IPushProducer`` like the gateway's, from one canned chunk encoded at
  start (so only the transport is measured: its offsets repeat).

``python -m bench.figg_echo --ports-file F [--backlog N] [--size B]``
listens on port 0 of 127.0.0.1. The Figg benchmarks report the gateway's
figures as ratios to this server's, measured in the same run.
"""
import argparse

from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory
from zope.interface import implementer

from bench.procs import serve_port0
from gateway.framing import FramedProtocol
from plugins.figg import codec as fc

#: DATA frames per write while streaming the canned backlog
CHUNK = 512


@implementer(IPushProducer)
class Echo(FramedProtocol):
    header = fc.HEADER
    length_field = 2
    max_frame_bytes = fc.DEFAULT_MAX_PAYLOAD_BYTES

    def connectionMade(self):
        self.transport.setTcpNoDelay(True)
        self.left = 0
        self.paused = False
        self.transport.registerProducer(self, True)

    def connectionLost(self, reason):
        self.factory.live.discard(self)

    def dataReceived(self, data):
        self.acks = []
        self.relayed = []
        super().dataReceived(data)
        if self.acks:
            self.transport.write(fc.encode_acks(self.acks))
        if self.relayed:
            frames = b"".join(self.relayed)
            for conn in self.factory.live:
                conn.transport.write(frames)

    def frameReceived(self, fields, payload):
        msg_type = fields[0]
        if msg_type == fc.PUBLISH:
            topic, seq, data = fc.decode_publish(payload)
            self.acks.append(seq)
            if self.factory.live:
                self.relayed.append(fc.encode(fc.Data(topic, 1, data)))
        elif msg_type == fc.ATTACH:
            attach = fc.decode_payload(fc.ATTACH, payload)
            self.transport.write(fc.encode(fc.Attached(attach.topic, 0)))
            if attach.from_offset:
                self.left = self.factory.backlog
                self.resumeProducing()
            else:
                self.factory.live.add(self)

    def frameTooLarge(self, fields):
        self.transport.loseConnection()

    def pauseProducing(self):
        self.paused = True

    def resumeProducing(self):
        self.paused = False
        chunk = self.factory.chunk
        while self.left and not self.paused:
            if self.left >= CHUNK:
                self.transport.write(chunk)
                self.left -= CHUNK
            else:
                self.transport.write(chunk[:self.left * len(chunk) // CHUNK])
                self.left = 0

    def stopProducing(self):
        self.left = 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ports-file", required=True)
    p.add_argument("--backlog", type=int, default=0)
    p.add_argument("--size", type=int, default=100)
    a = p.parse_args()
    factory = Factory.forProtocol(Echo)
    factory.live = set()
    factory.backlog = a.backlog
    parts = []
    fc.DataEncoder(b"bench").encode_into(parts, 1, [b"v" * a.size] * CHUNK, 0, 1 << 40)
    factory.chunk = b"".join(parts)
    serve_port0(factory, a.ports_file)


if __name__ == "__main__":
    main()
