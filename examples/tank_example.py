"""TANK: produce a keyed bundle, consume it, and wait at the tail.

    .venv/bin/python examples/tank_example.py [--address 127.0.0.1:11011] [--topic readings]

Against ``make run``'s gateway. TANK positions are sequence numbers: the
record at offset n is seq n + 1, and ``hwMark`` (the last assigned seq) is
the number of records ever written. A Consume of the next seq waits at the
gateway until a record arrives, whichever dialect writes it.
"""
import argparse
import time

from twisted.internet import defer, task

from plugins.tank.client import connect


@defer.inlineCallbacks
def main(reactor, address, topic):
    host, port = address.rsplit(":", 1)
    client = yield connect(reactor, host, int(port))
    now = int(time.time() * 1000)
    yield client.produce(topic, 0, [b"21.5", b"22.0"], keys=[b"kitchen", b"hall"],
                         timestamps=[now, now])
    [seqs] = yield client.discover_partitions(topic)
    print(f"hwMark {seqs.hw_mark} (first available seq {seqs.first_avail})")
    got = yield client.fetch(topic, 0, seqs.hw_mark - 1)
    for m in got.messages:
        print(f"seq {m.seq}: {m.key.decode()} = {m.value.decode()} (ts {m.ts})")
    # a consume of the next seq parks until the produce below wakes it
    waiting = client.fetch(topic, 0, got.next_seq, max_wait_ms=10000)
    yield client.produce(topic, 0, [b"19.0"], keys=[b"cellar"], timestamps=[now])
    woken = yield waiting
    for m in woken.messages:
        print(f"woken by seq {m.seq}: {m.key.decode()} = {m.value.decode()}")
    yield client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:11011", help="the TANK listener")
    parser.add_argument("--topic", default="readings")
    args = parser.parse_args()
    task.react(main, (args.address, args.topic))
