"""Figg: subscribe, publish, and receive the messages live.

    .venv/bin/python examples/figg_example.py [--address 127.0.0.1:8119] [--topic chat]

Against ``make run``'s gateway. A Figg offset is "the offset of the next
message": DATA for the record at offset n carries n + 1, and subscribing
from that offset continues after it. Figg messages have no key, and their
timestamp is the gateway's receive time.
"""
import argparse

from twisted.internet import defer, task

from plugins.figg.client import FiggClient


@defer.inlineCallbacks
def main(reactor, address, topic):
    host, port = address.rsplit(":", 1)
    client = FiggClient(reactor, host, int(port))
    yield client.connect()
    messages = [b"hi", b"how are you?", b"bye"]
    received = []
    done = defer.Deferred()

    def on_message(message):
        received.append(message)
        print(f"offset {message.offset}: {message.data.decode()}")
        if len(received) == len(messages):
            done.callback(None)
    start = yield client.subscribe(topic, on_message)
    print(f"subscribed to {topic} from the latest message (next offset {start})")
    for data in messages:
        yield client.publish_blocking(topic, data)
    yield done
    print(f"resume later with subscribe({topic!r}, ..., offset={received[-1].offset})")
    yield client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:8119", help="the Figg listener")
    parser.add_argument("--topic", default="chat")
    args = parser.parse_args()
    task.react(main, (args.address, args.topic))
