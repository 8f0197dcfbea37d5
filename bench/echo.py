"""The raw-loopback baseline: a Twisted server with the gateway's framing that
answers every frame with a canned reply, doing no other work.

``python -m bench.echo --ports-file F --reply-file R`` listens on port 0 of
127.0.0.1. Benchmarks report the gateway's figures as a ratio to this
server's, measured in the same run with the same load generator.
"""
import argparse
import json
import struct

from twisted.internet import reactor
from twisted.internet.protocol import Factory

from gateway.framing import FramedProtocol


class Canned(FramedProtocol):
    header = struct.Struct(">I")
    max_frame_bytes = 10 * 1024 * 1024

    def frameReceived(self, fields, body):
        self.transport.write(self.factory.reply)

    def frameTooLarge(self, fields):
        self.transport.loseConnection()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ports-file", required=True)
    p.add_argument("--reply-file", required=True)
    a = p.parse_args()
    factory = Factory.forProtocol(Canned)
    factory.noisy = False
    with open(a.reply_file, "rb") as f:
        body = f.read()
    factory.reply = struct.pack(">I", len(body)) + body
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    with open(a.ports_file + ".tmp", "w") as f:
        json.dump({"port": port.getHost().port}, f)
    import os
    os.replace(a.ports_file + ".tmp", a.ports_file)
    reactor.run()


if __name__ == "__main__":
    main()
