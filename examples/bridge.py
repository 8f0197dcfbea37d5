"""A bridge between legacy clients of four dialects, end to end.

    .venv/bin/pip install kafka-python      # the Kafka consumer is the real client
    .venv/bin/python examples/bridge.py [--figg 127.0.0.1:8119] [--tank 127.0.0.1:11011]
        [--kafka 127.0.0.1:9092] [--pravega 127.0.0.1:12345] [--topic sensor-readings]

Against ``make run``'s gateway. Old sensors speak Figg, new ones TANK; both
feed one topic. A Kafka consumer group totals the readings per sensor, and
a Pravega reader archives the same records, each client in its own dialect
and positions, with no copying between them:

- Figg messages have no key, and their timestamp is the gateway's receive
  time, so a Figg sensor puts its name (and, if it matters, its own clock)
  in the value: here JSON. TANK records carry the sensor as their key.
- The Kafka group therefore takes the sensor from the key when there is
  one, and from the JSON value otherwise; the same rule serves any job that
  groups these records by key (a Spark aggregation, for instance).
- The Pravega reader sees every record as an event of its value, at byte
  positions: the record at offset n starts at the sum of 8 + len(value)
  over the records before it.

Every run tags its readings with a run id, so it can be repeated against
the same gateway.
"""
import argparse
import json
import uuid

from kafka import KafkaConsumer
from twisted.internet import defer, task, threads

from plugins.figg.client import FiggClient
from plugins.pravega.client import EventReader, connect as pravega_connect
from plugins.tank.client import connect as tank_connect

FIGG_READINGS = [("boiler", 3), ("attic", 1), ("boiler", 4)]
TANK_READINGS = [("garage", 10), ("boiler", 2), ("garage", 5)]


def address(text):
    host, port = text.rsplit(":", 1)
    return host, int(port)


@defer.inlineCallbacks
def main(reactor, args):
    run = uuid.uuid4().hex[:8]
    topic = args.topic
    tank = yield tank_connect(reactor, *address(args.tank))
    yield tank.create_topic(topic, 1)           # 1: it exists already; fine
    pravega = yield pravega_connect(reactor, *address(args.pravega))
    segment = f"gateway/{topic}/0.#epoch.0"
    start = (yield pravega.segment_info(segment)).write_offset

    # old sensors publish through Figg, the name inside the value
    figg = FiggClient(reactor, *address(args.figg))
    yield figg.connect()
    for sensor, reading in FIGG_READINGS:
        yield figg.publish_blocking(topic, json.dumps(
            {"run": run, "sensor": sensor, "reading": reading}).encode())
    yield figg.close()
    # new sensors produce through TANK, the name as the key
    yield tank.produce(topic, 0, [json.dumps({"run": run, "reading": r}).encode()
                                  for _, r in TANK_READINGS],
                       keys=[s.encode() for s, _ in TANK_READINGS])
    [seqs] = yield tank.discover_partitions(topic)
    print(f"figg and tank wrote {len(FIGG_READINGS) + len(TANK_READINGS)} readings; "
          f"tank hwMark {seqs.hw_mark}")
    yield tank.close()

    # a Kafka consumer group totals them (kafka-python blocks: in a thread)
    totals, committed = yield threads.deferToThread(total, args.kafka, topic, run)
    print(f"kafka group bridge-totals: {json.dumps(totals, sort_keys=True)}; "
          f"committed offset {committed}")

    # a Pravega reader archives the same records from where this run began
    count = len(FIGG_READINGS) + len(TANK_READINGS)
    reader = EventReader(pravega, segment, start)
    events = []
    while len(events) < count:
        events += yield reader.read()
    events = events[:count]
    first = seqs.hw_mark - count                # this run's first offset
    for i, (position, value) in enumerate(events):
        offset = first + i
        print(f"offset {offset} = tank seq {offset + 1} = figg offset {offset + 1} = "
              f"pravega position {position}: {value.decode()}")
    yield pravega.close()


def total(bootstrap, topic, run):
    """Sum this run's readings per sensor through the group ``bridge-totals``."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="bridge-totals",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    totals = {}
    seen = 0
    while seen < len(FIGG_READINGS) + len(TANK_READINGS):
        for records in consumer.poll(timeout_ms=1000).values():
            for r in records:
                value = json.loads(r.value)
                if value["run"] != run:
                    continue                    # an earlier run's reading
                sensor = r.key.decode() if r.key is not None else value["sensor"]
                totals[sensor] = totals.get(sensor, 0) + value["reading"]
                seen += 1
    consumer.commit()
    committed = max(consumer.committed(tp) for tp in consumer.assignment())
    consumer.close()
    return totals, committed


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--figg", default="127.0.0.1:8119")
    parser.add_argument("--tank", default="127.0.0.1:11011")
    parser.add_argument("--kafka", default="127.0.0.1:9092")
    parser.add_argument("--pravega", default="127.0.0.1:12345")
    parser.add_argument("--topic", default="sensor-readings")
    task.react(main, (parser.parse_args(),))
