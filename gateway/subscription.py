"""Push subscriptions: records delivered to a consumer as they arrive.

A subscription reads a chunk, hands it to its consumer, and goes on with
the next chunk on a later reactor turn, so one subscriber catching up on a
long backlog never starves the others. At the end of the log it parks on
the store's append waiter and wakes on the next durable append, from any
dialect; the switch from backlog to live has neither gap nor duplicate
because both read from the same next offset.

Flow control is the consumer's transport's: its dialect registers an
``IPushProducer`` and forwards ``pauseProducing``/``resumeProducing`` to
``pause``/``resume`` here, so a client that stops reading holds at most the
transport's buffer plus one chunk of the gateway's memory.
"""
from twisted.internet import defer

from gateway.errors import LogError, OffsetOutOfRange


class Subscription:
    def __init__(self, bus, topic, partition, offset, consumer, max_bytes):
        self.bus = bus
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.consumer = consumer
        self.max_bytes = max_bytes
        self.paused = False
        self.cancelled = False
        self._wait = None
        self._call = None

    def start(self):
        self._schedule()

    def _schedule(self):
        if self._call is None and self._wait is None and not self.paused and not self.cancelled:
            self._call = self.bus.reactor.callLater(0, self._step)

    def _step(self):
        self._call = None
        if self.paused or self.cancelled:
            return
        store = self.bus.store
        try:
            try:
                batches = store.read(self.topic, self.partition, self.offset, self.max_bytes)
            except OffsetOutOfRange as e:
                # Retention passed us: continue from the new log start.
                self.offset = e.log_start
                batches = store.read(self.topic, self.partition, self.offset, self.max_bytes)
            if not batches:
                if store.offsets(self.topic, self.partition).sealed:
                    return  # nothing will ever come: stay idle, wake no one
                self._wait = store.wait_for_append(self.topic, self.partition, self.offset)
                self._wait.addCallbacks(self._woken, self._wait_failed)
                return
        except LogError as e:
            self._fail(e)
            return
        start = self.offset
        self.offset = batches[-1].next_offset
        self.consumer.deliver(self, batches, start)
        self._schedule()

    def _woken(self, _):
        self._wait = None
        self._schedule()

    def _wait_failed(self, failure):
        self._wait = None
        if failure.check(defer.CancelledError):
            return
        self._fail(failure.value)

    def _fail(self, error):
        if not self.cancelled:
            self.cancel()
            self.consumer.failed(self, error)

    def pause(self):
        self.paused = True
        if self._call is not None:
            self._call.cancel()
            self._call = None

    def resume(self):
        self.paused = False
        self._schedule()

    def cancel(self):
        """Stop for good (DETACH, connection lost)."""
        self.cancelled = True
        self.bus.subscriptions.discard(self)
        if self._call is not None:
            self._call.cancel()
            self._call = None
        if self._wait is not None:
            wait, self._wait = self._wait, None
            wait.cancel()
