"""The raw-loopback baseline in TANK framing: a Twisted server that answers
every frame with a canned reply (a whole TANK frame), doing no other work.

``python -m bench.tank_echo --ports-file F --reply-file R`` listens on port 0
of 127.0.0.1; ``bench.tank`` reports the gateway's figures as a ratio to
this server's, measured in the same run with the same load generator.
"""
import argparse
import json
import os

from twisted.internet import reactor
from twisted.internet.protocol import Factory

from bench.echo import Canned
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
    factory.noisy = False
    with open(a.reply_file, "rb") as f:
        factory.reply = f.read()
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    with open(a.ports_file + ".tmp", "w") as f:
        json.dump({"port": port.getHost().port}, f)
    os.replace(a.ports_file + ".tmp", a.ports_file)
    reactor.run()


if __name__ == "__main__":
    main()
