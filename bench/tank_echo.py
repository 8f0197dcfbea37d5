"""The raw-loopback baseline in TANK framing: a Twisted server that answers
every frame with a canned reply (a whole TANK frame), doing no other work.

``python -m bench.tank_echo --ports-file F --reply-file R`` listens on port 0
of 127.0.0.1; ``bench.tank`` reports the gateway's figures as a ratio to
this server's, measured in the same run with the same load generator.
"""
import argparse

from twisted.internet.protocol import Factory

from bench.echo import Canned
from bench.procs import serve_port0
from plugins.tank.codec import FRAME_HEADER


class TankCanned(Canned):
    header = FRAME_HEADER
    length_field = 1
    max_frame_bytes = 64 * 1024 * 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ports-file", required=True)
    p.add_argument("--reply-file", required=True)
    a = p.parse_args()
    factory = Factory.forProtocol(TankCanned)
    with open(a.reply_file, "rb") as f:
        factory.reply = f.read()
    serve_port0(factory, a.ports_file)


if __name__ == "__main__":
    main()
