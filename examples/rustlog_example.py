"""RustLog: produce, fetch, and a consumer group's committed offset.

    .venv/bin/python examples/rustlog_example.py [--address 127.0.0.1:9093] [--topic greetings]

Against ``make run``'s gateway. RustLog positions are offsets; a Fetch never
waits, and a Fetch with a ``group_id`` starts at that group's committed
offset when it is larger than the one asked for. Committed offsets are
shared with every dialect: a Kafka consumer of group ``rustlog-example``
starts where this one committed.
"""
import argparse

from twisted.internet import defer, task

from plugins.rustlog.client import connect


@defer.inlineCallbacks
def main(reactor, address, topic):
    host, port = address.rsplit(":", 1)
    client = yield connect(reactor, host, int(port))
    offsets = yield client.produce(topic, 0, [b"hello", b"bonjour", b"hallo"])
    print(f"produced at offsets {offsets}")
    got = yield client.fetch(topic, 0, offsets[0])
    for offset, value in got.records:
        print(f"offset {offset}: {value.decode()}")
    yield client.commit("rustlog-example", topic, 0, got.next_offset)
    committed = yield client.committed("rustlog-example", topic, 0)
    print(f"group rustlog-example committed {committed}, the next offset to read")
    yield client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:9093", help="the RustLog listener")
    parser.add_argument("--topic", default="greetings")
    args = parser.parse_args()
    task.react(main, (args.address, args.topic))
