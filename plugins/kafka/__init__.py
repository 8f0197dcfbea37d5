"""The Kafka dialect: the released 0.8.2 protocol, the 0.9 group APIs and
ApiVersions v0 (protocols/kafka.md), so that unmodified Kafka clients
(kafka-python, librdkafka, afkak) produce, consume and commit offsets.

Listener options:

- ``advertised_host``: the host Metadata and GroupCoordinator name as the
  broker. Default: the endpoint's interface; required when the endpoint
  listens on every interface.
- ``advertised_port``: default the port actually bound (so a listener on
  port 0 advertises its real port).
- ``node_id``: the broker's node id (default 0).
- ``max_frame_bytes``: the largest request accepted (default 104857600,
  like Kafka's ``socket.request.max.bytes``); also the most a compressed
  message may inflate to.
- ``offset_metadata_max_bytes``: the longest commit metadata (default 4096).

Produced message sets of plain magic-0 messages are stored as the producer
sent them, under format ``KAFKA_MESSAGE_SET``, whose decoder is registered
here so that every dialect can read them.
"""
from twisted.plugin import IPlugin
from zope.interface import implementer

from gateway.config import check_keys, opt_int, opt_str
from gateway.interfaces import IDialect
from gateway.records import KAFKA_MESSAGE_SET
from plugins.kafka.codec import decode_stored

INT32_MAX = 2 ** 31 - 1


@implementer(IPlugin, IDialect)
class KafkaDialect:
    name = "kafka"
    formats = {KAFKA_MESSAGE_SET: decode_stored}

    def validate(self, options):
        check_keys(options, ("advertised_host", "advertised_port", "node_id",
                             "max_frame_bytes", "offset_metadata_max_bytes"))
        return {
            "advertised_host": opt_str(options, "advertised_host", None),
            "advertised_port": opt_int(options, "advertised_port", None, minimum=1,
                                       maximum=65535),
            "node_id": opt_int(options, "node_id", 0, minimum=0, maximum=INT32_MAX),
            "max_frame_bytes": opt_int(options, "max_frame_bytes", 104857600, minimum=64,
                                       maximum=INT32_MAX),
            "offset_metadata_max_bytes": opt_int(options, "offset_metadata_max_bytes", 4096,
                                                 minimum=0, maximum=32767),
        }

    def makeService(self, bus, listener):
        from plugins.kafka.server import KafkaFactory, KafkaListenerService
        return KafkaListenerService(listener, KafkaFactory(bus, listener), bus.reactor)


dialect = KafkaDialect()
