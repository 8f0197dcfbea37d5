"""Figg server: frames <-> bus commands (shared/protocols/figg.md).

One ``FiggProtocol`` per connection. What it does with each message:

- PUBLISH: consecutive PUBLISHes to one topic that arrive in one read are
  appended as one batch (one bus ``Produce``), so a pipelining client costs
  one append per read, not one per message. Each PUBLISH gets its ACK once
  its batch is durable, and ACKs leave in arrival order even when batches
  for different topics become durable out of order (the SDK reads an ACK as
  acknowledging everything before it).
- ATTACH: one bus ``Subscribe`` per (connection, topic), an ``_Attachment``
  that is the subscription's consumer. The bus registers the subscription and
  this side writes ATTACHED in the same reactor turn, and the subscription
  reads its first chunk on a later turn, so ATTACHED always precedes the
  attachment's DATA and no record appended in between is missed. The backlog
  streams chunk by chunk, then the subscription waits at the end of the log
  and wakes on appends from any dialect: no gap and no duplicate at the
  switch-over, since both read from one next offset.
- DETACH: the attachment stops, then DETACHED is written.
- PING: PONG with the same timestamp, behind whatever is already written.
- Unknown types and server-to-client types are skipped (§4.5).

Offsets (DESIGN.md): DATA for the record at log offset n carries n + 1;
ATTACH with the flag and X starts at log offset X, clamped into
``[log start, next offset]`` by the bus; ATTACH without it starts at the next
offset.

Flow control. The protocol is the ``IPushProducer`` of its own transport.
When the transport's buffer fills, every attachment of the connection pauses
its subscription, and the connection stops reading (a client that does not
read its ACKs cannot make the gateway queue them either). Each write of DATA
is at most ``max_buffered_bytes`` minus the transport's own buffer (plus one
frame), and nothing more is written until the transport asks to resume, so
a stalled reader holds at most ``max_buffered_bytes`` of DATA in the gateway,
plus the one chunk its subscription has read but not yet written (kept
decoded, no larger than the write size). Resuming re-reads the log from the
next offset, so retention that ran meanwhile clamps the stream up like an
ATTACH would. PUBLISH intake is bounded too: past ``max_unacked``
unacknowledged PUBLISHes, the connection stops reading until half are acked.

Bad input (a field running past ``payload_len``, an oversize
``payload_len``, an invalid topic name, a PUBLISH the bus refuses) closes
that connection only, with one log line: Figg has no error message. ACKs for
PUBLISHes before the offending frame are still written first; none is written
for it or after it.
"""
from collections import deque

from twisted.internet.interfaces import IPushProducer
from twisted.python.failure import Failure
from zope.interface import implementer

from gateway import commands as c
from gateway.errors import InvalidTopicName, LogError, StorageError, UnknownTopic
from gateway.framing import FramedProtocol
from gateway.protocol import DialectFactory, TrackedConnection
from gateway.records import RecordBatch
from plugins.figg import (
    DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_UNACKED,
    TRANSPORT_BUFFER_BYTES,
)
from plugins.figg import codec as fc

#: an offset past any log's end: the bus clamps it down to the next offset
TAIL = fc.U64_MAX
#: how often an ATTACH to a topic that does not exist (auto-create off) looks
#: for it; the bus has no event for "a topic was created"
TOPIC_POLL_SECONDS = 0.5
#: the largest chunk a subscription reads from the log at once
MAX_READ_BYTES = 256 * 1024


class _Run:
    """Consecutive PUBLISHes to one topic: one batch, one Produce, their ACKs.

    ``failed`` marks the place in the ACK queue where the connection closes:
    a refused batch, or the end of what is acknowledged before a close.
    """

    __slots__ = ("done", "failed", "seqs", "topic", "values")

    def __init__(self, topic):
        self.topic = topic
        self.values = []
        self.seqs = []
        self.done = False
        self.failed = False


def _closing_marker():
    """The ACK queue's last entry once the connection is closing: reaching it
    closes the connection after the ACKs ahead of it are written."""
    run = _Run(b"")
    run.done = run.failed = True
    return run


@implementer(IPushProducer)
class FiggProtocol(TrackedConnection, FramedProtocol):
    header = fc.HEADER
    length_field = 2

    def connectionMade(self):
        super().connectionMade()
        factory = self.factory
        self.bus = factory.bus
        self.max_frame_bytes = factory.max_payload_bytes
        self.max_record_bytes = self.bus.limits.max_record_bytes
        #: topic name -> _Attachment
        self.attachments = {}
        #: _Runs in arrival order, until their ACKs are written
        self.acks = deque()
        self.run = None
        self.unacked = 0
        self.intake_full = False
        self.writing_paused = False
        self.reading_paused = False
        self.closing = False
        self.lost = False
        self.turn = 0
        # ACKs, PONGs and live DATA are small writes that a client waits for.
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)
        self.transport.registerProducer(self, True)

    def connectionLost(self, reason):
        self.lost = True
        self.closing = True
        self._stop_attachments()
        self.acks.clear()
        self.run = None
        super().connectionLost(reason)

    # -- frames ------------------------------------------------------------------------

    def dataReceived(self, data):
        super().dataReceived(data)
        self._flush_run()

    def frameTooLarge(self, fields):
        self.refuse(f"{fc.NAMES.get(fields[0], f'type {fields[0]}')} frame with "
                    f"payload_len {fields[2]} exceeds {self.max_frame_bytes}")

    def frameReceived(self, fields, payload):
        msg_type = fields[0]
        if msg_type == fc.PUBLISH:
            self._publish(payload)
            return
        self._flush_run()
        if msg_type == fc.ATTACH or msg_type == fc.DETACH or msg_type == fc.PING:
            try:
                message = fc.decode_payload(msg_type, payload)
            except fc.FiggDecodeError as e:
                self.refuse(str(e))
                return
            if msg_type == fc.ATTACH:
                self._attach(message)
            elif msg_type == fc.DETACH:
                self._detach(message)
            else:
                self.transport.write(fc.encode(fc.Pong(message.timestamp)))
        # Anything else (unknown, or a server-to-client type) is skipped (§4.5).

    # -- closing -----------------------------------------------------------------------

    def refuse(self, problem):
        """A client's mistake: one log line, then close this connection."""
        if not self.closing:
            self.log_protocol_error(problem)
            self._close()

    def _bus_failed(self, failure, what):
        """A command failed: the client's doing (one line) or the gateway's
        (a storage failure or a bug, logged with its traceback); either way
        the connection closes, Figg's only signal."""
        if self.closing:
            return
        if failure.check(LogError) and not failure.check(StorageError):
            self.refuse(f"{what}: {failure.value}")
            return
        self.factory.log_failure(failure)
        self._close()

    def _close(self):
        """Stop serving: read nothing more, stream nothing more, and close once
        the ACKs owed for what was stored before are written."""
        if self.closing:
            return
        self.closing = True
        self.stopReading()
        self.run = None
        self._stop_attachments()
        self.acks.append(_closing_marker())
        self._drain()

    def _stop_attachments(self):
        attachments, self.attachments = self.attachments, {}
        for attachment in attachments.values():
            attachment.stop()

    # -- PUBLISH -> ACK ----------------------------------------------------------------

    def _publish(self, payload):
        try:
            topic, seq_num, data = fc.decode_publish(payload)
        except fc.FiggDecodeError as e:
            self.refuse(str(e))
            return
        if len(data) > self.max_record_bytes:
            self._flush_run()
            self.refuse(f"PUBLISH to {_show(topic)}: record of {len(data)} bytes exceeds "
                        f"limits.max_record_bytes ({self.max_record_bytes})")
            return
        run = self.run
        if run is None or run.topic != topic:
            self._flush_run()
            if self.closing:
                return
            run = self.run = _Run(topic)
        run.values.append(data)
        run.seqs.append(seq_num)

    def _flush_run(self):
        run = self.run
        if run is None:
            return
        self.run = None
        self.acks.append(run)
        self.unacked += len(run.seqs)
        if self.unacked > self.factory.max_unacked and not self.intake_full:
            self.intake_full = True
            self._update_reading()
        d = self.bus.execute(c.Produce(run.topic.decode("latin-1"), 0,
                                       RecordBatch(run.values)))
        # The bus holds the values until they are stored; the ACKs need only the seqs.
        run.values = None
        d.addCallbacks(self._stored, self._not_stored, callbackArgs=(run,),
                       errbackArgs=(run,))

    def _stored(self, _, run):
        run.done = True
        self._drain()

    def _not_stored(self, failure, run):
        run.done = run.failed = True
        self._bus_failed(failure, f"PUBLISH to {_show(run.topic)}")
        self._drain()

    def _drain(self):
        """Write the ACKs at the head of the queue whose batches are durable."""
        if self.lost:
            return
        acks = self.acks
        out = []
        while acks and acks[0].done:
            run = acks.popleft()
            if run.failed:
                if out:
                    self.transport.write(b"".join(out))
                self._close_now()
                return
            out.append(fc.encode_acks(run.seqs))
            self.unacked -= len(run.seqs)
        if out:
            self.transport.write(b"".join(out))
        if self.intake_full and self.unacked <= self.factory.max_unacked // 2:
            self.intake_full = False
            self._update_reading()

    def _close_now(self):
        self.acks.clear()
        # A registered producer would hold the close until it unregisters.
        self.transport.unregisterProducer()
        self.transport.loseConnection()

    # -- ATTACH / DETACH -----------------------------------------------------------------

    def _attach(self, message):
        name = message.topic.decode("latin-1")
        old = self.attachments.pop(name, None)
        if old is not None:
            old.stop()
        attachment = self.attachments[name] = _Attachment(self, name, message.topic)
        attachment.start(message.offset if message.from_offset else TAIL)

    def _detach(self, message):
        name = message.topic.decode("latin-1")
        attachment = self.attachments.pop(name, None)
        if attachment is not None:
            attachment.stop()
            self.transport.write(fc.encode(fc.Detached(message.topic)))
            return
        # Never attached here: still answered (§4.2), if the name is valid.
        d = self.bus.execute(c.Metadata([name]))

        def answer(topics):
            if isinstance(topics[0].error, InvalidTopicName):
                self.refuse(f"DETACH: {topics[0].error}")
            elif not self.closing:
                self.transport.write(fc.encode(fc.Detached(message.topic)))
        d.addCallbacks(answer, self._bus_failed, errbackArgs=("DETACH",))

    # -- flow control (IPushProducer) ----------------------------------------------------

    def pauseProducing(self):
        """The transport's buffer is full: stop streaming and reading."""
        self.writing_paused = True
        for attachment in self.attachments.values():
            attachment.pause()
        self._update_reading()

    def resumeProducing(self):
        """The transport's buffer has drained: stream again, starting with a
        different attachment each time so that no topic starves the others."""
        if getattr(self.transport, "disconnecting", False):
            # loseConnection() from outside (the listener stopping): the
            # transport asks for more instead of closing while we are its
            # producer, so let go of it and let it close.
            self.transport.unregisterProducer()
            return
        self.writing_paused = False
        self._update_reading()
        attachments = list(self.attachments.values())
        if not attachments:
            return
        self.turn = (self.turn + 1) % len(attachments)
        for attachment in attachments[self.turn:] + attachments[:self.turn]:
            if self.writing_paused:
                break
            attachment.resume()

    def stopProducing(self):
        """The connection is gone; ``connectionLost`` cleans up."""

    def _update_reading(self):
        if self.closing:
            return
        want = self.writing_paused or self.intake_full
        if want != self.reading_paused:
            self.reading_paused = want
            if want:
                self.transport.pauseProducing()
            else:
                self.transport.resumeProducing()


class _Attachment:
    """One topic attached on one connection: the consumer of its subscription.

    ``held`` keeps the values of a delivery that could not be written yet
    (the transport filled up meanwhile), the first of them at log offset
    ``held_offset``; while anything is held the subscription stays paused,
    so a delivery only comes when nothing is held, and memory is bounded by
    one read chunk.
    """

    def __init__(self, conn, name, topic):
        self.conn = conn
        self.name = name
        self.topic = topic
        self.encoder = fc.DataEncoder(topic)
        self.subscription = None
        self.held = []
        self.held_offset = 0
        self.announced = False
        self.stopped = False
        self.poll = None

    def start(self, offset):
        conn = self.conn
        d = conn.bus.execute(c.Subscribe(self.name, 0, offset, self,
                                         max_bytes=conn.factory.read_chunk))
        d.addCallbacks(self._subscribed, self._not_subscribed)

    def _subscribed(self, subscription):
        if self.stopped:
            subscription.cancel()
            return
        self.subscription = subscription
        if not self.announced:
            # The bus clamped the start; the subscription reads on a later
            # reactor turn, so this is written before any DATA.
            self._announce(subscription.offset)
        if self.conn.writing_paused:
            subscription.pause()

    def _announce(self, offset):
        self.announced = True
        self.conn.transport.write(fc.encode(fc.Attached(self.topic, offset)))

    def _not_subscribed(self, failure):
        if self.stopped:
            return
        if not failure.check(UnknownTopic):
            self.conn._bus_failed(failure, f"ATTACH {_show(self.topic)}")
            return
        # Create it (if the config allows) or learn that the name is invalid.
        d = self.conn.bus.execute(c.Metadata([self.name], auto_create=True))
        d.addCallbacks(self._looked_up, self.conn._bus_failed,
                       errbackArgs=(f"ATTACH {_show(self.topic)}",))

    def _looked_up(self, topics):
        if self.stopped:
            return
        found = topics[0]
        if found.info is not None:
            # The topic did not exist when ATTACH arrived, so everything in it
            # came after: its next offset then was 0.
            self.start(0)
        elif isinstance(found.error, UnknownTopic):
            # Auto-create is off: attached all the same, at 0; DATA flows once
            # another dialect creates the topic (§1 Topics).
            if not self.announced:
                self._announce(0)
            self.poll = self.conn.bus.reactor.callLater(TOPIC_POLL_SECONDS, self._look_again)
        else:
            self.conn._bus_failed(Failure(found.error), f"ATTACH {_show(self.topic)}")

    def _look_again(self):
        self.poll = None
        d = self.conn.bus.execute(c.Metadata([self.name]))
        d.addCallbacks(self._looked_up, self.conn._bus_failed,
                       errbackArgs=(f"ATTACH {_show(self.topic)}",))

    # -- ISubscriber --------------------------------------------------------------------

    def deliver(self, subscription, batches, offset):
        if self.stopped:
            return
        decode = self.conn.bus.decode
        values = []
        try:
            for batch in batches:
                values += decode(batch).since(offset).values
        except Exception:
            # A stored batch no reader can decode is the gateway's bug.
            self.conn.factory.log_failure(Failure())
            self.conn._close()
            return
        # The log is dense and the batches consecutive: one run of values
        # from ``offset`` on, encoded with a few calls instead of one per batch.
        if not self.held:
            self.held_offset = offset
        self.held += values
        self._send()

    def failed(self, subscription, error):
        if not self.stopped:
            self.conn._bus_failed(Failure(error), f"ATTACH {_show(self.topic)}")

    # -- streaming -------------------------------------------------------------------------

    def _send(self):
        """Write held values while the transport takes them, in writes of at
        most the connection's write size (plus one frame)."""
        conn = self.conn
        if getattr(conn.transport, "disconnecting", False):
            # Closing from outside (the listener stopping): stream no more.
            self.stop()
            return
        budget = conn.factory.write_chunk
        encode_into = self.encoder.encode_into
        held = self.held
        start = 0
        while start < len(held) and not conn.writing_paused and not self.stopped:
            parts = []
            n, _ = encode_into(parts, self.held_offset + start + 1, held, start, budget)
            start += n
            conn.transport.write(b"".join(parts))
        if start:
            del held[:start]
            self.held_offset += start
        if held and self.subscription is not None:
            self.subscription.pause()

    def pause(self):
        if self.subscription is not None:
            self.subscription.pause()

    def resume(self):
        if self.stopped:
            return
        self._send()
        if not self.held and not self.conn.writing_paused and self.subscription is not None:
            self.subscription.resume()

    def stop(self):
        """No DATA from here on (DETACH, a new ATTACH, closing)."""
        self.stopped = True
        self.held = []
        if self.subscription is not None:
            self.subscription.cancel()
        if self.poll is not None:
            self.poll.cancel()
            self.poll = None


def _show(topic):
    """A topic's bytes for a log line."""
    return repr(topic.decode("latin-1"))


class FiggFactory(DialectFactory):
    """The listener's ``limits`` tighten the Figg options of the same
    meaning: ``max_in_flight`` bounds unacknowledged PUBLISHes like
    ``max_unacked``, and ``max_buffered_bytes`` the DATA held for a stalled
    subscriber like the option of that name."""

    protocol = FiggProtocol

    def configure(self, listener):
        super().configure(listener)
        options = listener.options
        self.max_payload_bytes = options.get("max_payload_bytes",
                                             fc.DEFAULT_MAX_PAYLOAD_BYTES)
        self.max_unacked = self.in_flight_limit(options.get("max_unacked", DEFAULT_MAX_UNACKED))
        buffered = options.get("max_buffered_bytes", DEFAULT_MAX_BUFFERED_BYTES)
        if listener.limits.max_buffered_bytes is not None:
            buffered = min(buffered, listener.limits.max_buffered_bytes)
        #: DATA bytes per write: with the transport's own buffer, the bound
        self.write_chunk = buffered - TRANSPORT_BUFFER_BYTES
        self.read_chunk = min(self.write_chunk, MAX_READ_BYTES)

    def send_buffer_bytes(self):
        """Twisted's default: the DATA bound above counts on it."""
        return None
