"""The raw-loopback baseline: a Twisted server with the gateway's framing that
answers every frame with a canned reply, doing no other work.

``python -m bench.echo --ports-file F --reply-file R`` listens on port 0 of
127.0.0.1. Benchmarks report the gateway's figures as a ratio to this
server's, measured in the same run with the same load generator.
"""
import argparse
import struct

from twisted.internet.protocol import Factory

from bench.procs import serve_port0
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
    with open(a.reply_file, "rb") as f:
        body = f.read()
    factory.reply = struct.pack(">I", len(body)) + body
    serve_port0(factory, a.ports_file)


if __name__ == "__main__":
    main()
