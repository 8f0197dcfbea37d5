"""Pravega: append events with an idempotent writer, read them back.

    .venv/bin/python examples/pravega_example.py [--address 127.0.0.1:12345] [--topic orders]

Against ``make run``'s gateway. A Pravega position is a byte offset in the
segment, where every record is framed as an event (``int32 0, int32 len,
value``): the record at offset n starts at the sum of 8 + len(value) over
the records before it. The segment of partition 0 of topic ``orders`` is
``gateway/orders/0.#epoch.0`` (scope ``gateway``; a topic with ``_`` is
escaped, see the README).
"""
import argparse

from twisted.internet import defer, task

from plugins.pravega.client import EventReader, EventWriter, connect


@defer.inlineCallbacks
def main(reactor, address, topic):
    host, port = address.rsplit(":", 1)
    segment = f"gateway/{topic}/0.#epoch.0"
    proto = yield connect(reactor, host, int(port))
    yield proto.create_segment(segment)         # False if it exists: fine
    start = (yield proto.segment_info(segment)).write_offset
    writer = EventWriter(reactor, lambda: connect(reactor, host, int(port)), segment)
    orders = [b"order 1: 2 apples", b"order 2: 1 pear", b"order 3: 5 plums"]
    for value in orders:
        writer.write(value)
    yield writer.flush()                        # durable, each event stored once
    end = (yield proto.segment_info(segment)).write_offset
    print(f"appended {len(orders)} events at bytes {start}..{end}")
    reader = EventReader(proto, segment, start)
    events = []
    while len(events) < len(orders):
        events += yield reader.read()
    for position, value in events[:len(orders)]:
        print(f"position {position}: {value.decode()}")
    yield writer.close()
    yield proto.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:12345", help="the Pravega listener")
    parser.add_argument("--topic", default="orders")
    args = parser.parse_args()
    task.react(main, (args.address, args.topic))
