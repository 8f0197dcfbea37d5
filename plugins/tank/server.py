"""TANK server: frames <-> bus commands (shared/protocols/tank.md).

The gateway is a standalone TANK 4.0 broker. A connection gets a Ping as
soon as it is accepted. Requests are read in order; each response is
written as soon as it is ready, so a parked Consume is overtaken by later
responses and clients match them by reqId (§2). A frame that cannot be
trusted (too large, unknown msgId, too short for its fields) closes the
connection without a reply, as the real broker does (§7); a bad bundle
inside a well-framed Produce fails only its partition (0x02).

Every bus error is mapped to a TANK code in one place per request kind
(``_produce_code``, ``_fetch_entry``): the protocol has no "invalid request"
or "not authorised" code, so an invalid topic name and a topic the access
rules refuse both look unknown (§1, §6).
"""
import time

from twisted.internet import defer
from twisted.internet.interfaces import IPushProducer
from twisted.python.failure import Failure
from zope.interface import implementer

from gateway import commands as c
from gateway.errors import (
    InvalidRequest, InvalidTopicName, LogError, NotAuthorized, OffsetOutOfRange,
    PartitionSealed, TopicExists, UnknownPartition, UnknownTopic)
from gateway.framing import FramedProtocol
from gateway.protocol import DialectFactory, TrackedConnection
from gateway.records import TANK_BUNDLE, EncodedBatch, Records
from plugins.tank import codec as tc
from plugins.tank.codec import (
    FETCH_BOUNDARY, FETCH_OK, FETCH_SPARSE, FETCH_SYSTEM_ERROR, FETCH_UNKNOWN_PARTITION,
    MAX_FETCH_BYTES, MAX_KEY_BYTES, SPARSE, TAIL_SEQ, BundleError, ConsumeEntry,
    ConsumeTopicResult, TankDecodeError)

#: bus errors after which a topic looks unknown to a TANK client
TOPIC_UNKNOWN = (UnknownTopic, InvalidTopicName, NotAuthorized)
#: a Consume partition that was not read (at its end, answered at once)
_NOTHING = object()
#: an append refused because its partition is sealed: 0x02, or 0xfe for the
#: whole topic when all its partitions are sealed
_SEALED = -1


def first_avail_seq(log_start, high_watermark):
    """§1: the log start + 1, or 0 for a partition never written."""
    return log_start + 1 if high_watermark else 0


def _produce_code(failure):
    """A failed append's Produce code; None means "the topic looks unknown"."""
    if failure.check(*TOPIC_UNKNOWN):
        return None
    if failure.check(UnknownPartition):
        return tc.ERR_UNKNOWN_PARTITION
    if failure.check(OffsetOutOfRange):
        return tc.ERR_INVALID_SEQ
    if failure.check(PartitionSealed):
        return _SEALED
    # RecordTooLarge, PartitionSealed, StorageError and the rest: TANK has
    # no closer code than 0x02 ("invalid bundle" / I/O fault).
    return tc.ERR_INVALID_BUNDLE


def records_bundle(records):
    """A gateway-encoded bundle (§3.5) for decoded records of another
    dialect: plain, uncompressed (loopback and LAN consumers gain nothing
    from Snappy that is worth its CPU here), first message with its ts,
    later equal ones reuse it. A key over 255 bytes is omitted, never
    truncated; a negative timestamp (Kafka's "none") is sent as 0."""
    keys = records.keys
    if keys is not None:
        if all(k is None for k in keys):
            keys = None
        elif any(k is not None and len(k) > MAX_KEY_BYTES for k in keys):
            keys = [None if k is not None and len(k) > MAX_KEY_BYTES else k for k in keys]
    timestamps = records.timestamps
    if timestamps and min(timestamps) < 0:
        timestamps = [max(t, 0) for t in timestamps]
    return tc.encode_bundle(records.values, keys, timestamps)


def _record_cost(value, key):
    """The most one message can take in a gateway-encoded bundle."""
    size = len(value)
    cost = 1 + 8 + tc.varint_size(size) + size
    if key is not None and len(key) <= MAX_KEY_BYTES:
        cost += 1 + len(key)
    return cost


def _fitting(records, room):
    """How many leading records surely fit ``room`` bytes as one chunk entry."""
    keys = records.keys
    used = 6 + 5            # bundle header with a varint count, chunk's length varint
    n = 0
    for i, value in enumerate(records.values):
        used += _record_cost(value, keys[i] if keys is not None else None)
        if used > room:
            break
        n += 1
    return n


class _Chunk:
    """The bundles of one partition's answer, built from stored batches.

    Stored TANK bundles go out as they are; other batches are encoded
    (``records_bundle``) from the requested record on. The first bundle is
    always whole; later ones are added while the chunk stays within
    ``fetch_size``, and a gateway-encoded one is cut at a record boundary to
    fit, so no partial bundle is ever sent (§5.3).
    """

    __slots__ = ("parts", "size", "base_seq", "sparse")

    def __init__(self, bus, batches, offset, fetch_size):
        self.parts = []
        self.size = 0
        self.base_seq = None
        self.sparse = False
        for batch in batches:
            if batch.format == TANK_BUNDLE:
                if not self._add(batch.payload, fetch_size):
                    return
                if self.base_seq is None:
                    self.base_seq = batch.base_offset + 1
                    self.sparse = bool(batch.payload[0] & SPARSE)
                continue
            records = bus.decode(batch).since(offset)
            if not len(records):
                continue
            if self.base_seq is None:
                self.base_seq = records.base_offset + 1
            if self._add(records_bundle(records), fetch_size, first_whole=False):
                continue
            fit = _fitting(records, fetch_size - self.size) or (0 if self.parts else 1)
            if fit:
                self._add(records_bundle(_head(records, fit)), fetch_size, first_whole=True)
            return

    def _add(self, bundle, fetch_size, first_whole=True):
        """Append ``bundle`` if it fits, or is the first and ``first_whole``;
        False if not."""
        prefix = tc.encode_varint(len(bundle))
        size = len(prefix) + len(bundle)
        if self.size + size > fetch_size and (self.parts or not first_whole):
            return False
        self.parts.append(prefix)
        self.parts.append(bundle)
        self.size += size
        return True


def _head(records, n):
    """The first ``n`` of ``records``."""
    return Records(records.base_offset, records.timestamps[:n],
                   None if records.keys is None else records.keys[:n], records.values[:n])


@implementer(IPushProducer)
class TankProtocol(TrackedConnection, FramedProtocol):
    """One TANK connection.

    It registers itself as the transport's push producer: while the send
    buffer is over its high-water mark, or more than ``max_in_flight``
    requests (the listener's limit, 1024 by default) await their answers
    (parked consumes, produces waiting for fsync), nothing more is read from
    the client (§7).
    """

    header = tc.FRAME_HEADER
    length_field = 1

    def connectionMade(self):
        super().connectionMade()
        factory = self.factory
        self.bus = factory.bus
        self.max_frame_bytes = factory.max_frame_bytes
        self.max_in_flight = factory.in_flight_limit()
        self.pending = set()
        self.open = True
        self.send_blocked = False
        self.reading_paused = False
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            # Small answers to pipelined requests: no Nagle delay behind them.
            set_no_delay(True)
        self.transport.registerProducer(self, True)
        self.transport.write(tc.PING_FRAME)

    def connectionLost(self, reason):
        self.open = False
        pending, self.pending = self.pending, set()
        for d in pending:
            d.cancel()
        super().connectionLost(reason)

    # -- flow control ----------------------------------------------------------------

    def pauseProducing(self):
        self.send_blocked = True
        self._flow()

    def resumeProducing(self):
        self.send_blocked = False
        self._flow()

    def stopProducing(self):
        """The transport is closing; ``connectionLost`` cancels what is pending."""

    def _flow(self):
        blocked = self.send_blocked or len(self.pending) > self.max_in_flight
        if blocked != self.reading_paused and self.open:
            self.reading_paused = blocked
            if blocked:
                self.transport.pauseProducing()
            else:
                self.transport.resumeProducing()

    # -- frames --------------------------------------------------------------------

    def frameTooLarge(self, fields):
        self._close(f"frame {fields[0]:#04x} of {fields[1]} bytes exceeds "
                    f"{self.max_frame_bytes}")

    def _close(self, problem):
        self.log_protocol_error(problem)
        self.stopReading()
        self.transport.loseConnection()

    def frameReceived(self, fields, payload):
        msg_id = fields[0]
        if msg_id == tc.PING:
            return
        try:
            request = tc.decode_request(msg_id, payload)
        except TankDecodeError as e:
            self._close(str(e))
            return
        result = self._handlers[type(request)](self, request)
        if isinstance(result, defer.Deferred):
            # Tracked until answered, so that a parked request is cancelled
            # with the connection and counts as in flight; one answered
            # synchronously (the common case) leaves the set at once.
            self.pending.add(result)
            result.addBoth(self._settled, result)
            if result in self.pending:
                self._flow()
        else:
            self._answer(result)

    def _settled(self, result, d):
        self.pending.discard(d)
        self._answer(result)
        self._flow()

    def _answer(self, result):
        if isinstance(result, Failure):
            if result.check(defer.CancelledError):
                return None
            # A bug or a store failure behind a request: logged with its
            # traceback, and the connection dropped (a TANK client retries).
            self.factory.log_failure(result)
            self.transport.loseConnection()
            return None
        if not self.open:
            return None
        if type(result) is list:
            self.transport.writeSequence(result)
        else:
            self.transport.write(result)
        return None

    # -- Produce (0x01) and ProduceWithSeqnum (0x05) -----------------------------------

    def do_produce(self, req):
        """Validate every bundle, append the valid ones (in request order, so a
        partition named twice gets both bundles in order), and answer once
        every append is durable."""
        outcomes = [self._produce_one(topic.name, part)
                    for topic in req.topics for part in topic.partitions]
        return _settle(outcomes).addCallback(lambda done: self._produce_answer(req, done))

    def _produce_one(self, topic, part):
        try:
            bundle = tc.decode_bundle(part.bundle, self.max_frame_bytes)
        except BundleError as e:
            self.log_protocol_error(f"invalid bundle for {topic}/{part.partition}: {e}")
            return _Local(tc.ERR_INVALID_BUNDLE, topic, part.partition)
        expected = None
        if bundle.first_seq is not None:
            if not bundle.dense:
                return _Local(tc.ERR_INVALID_SEQ, topic, part.partition)
            expected = bundle.first_seq - 1
        if part.first_seq:
            if expected is not None and expected != part.first_seq - 1:
                return _Local(tc.ERR_INVALID_SEQ, topic, part.partition)
            expected = part.first_seq - 1
        timestamps = bundle.timestamps
        lengths = list(map(len, bundle.values))
        batch = EncodedBatch(TANK_BUNDLE, part.bundle, len(lengths), timestamps[0],
                             max(timestamps), sum(lengths), max(lengths))
        d = self.bus.execute(c.Produce(topic, part.partition, batch, expected_offset=expected))
        d.addCallbacks(lambda _: tc.ERR_OK, self._append_failed)
        return d

    def _append_failed(self, failure):
        if not failure.check(LogError):
            self.factory.log_failure(failure)
        return _produce_code(failure)

    def _produce_answer(self, req, outcomes):
        """The flat code list (§4), once every outcome is known (a code, None
        for "topic looks unknown", or a ``_Local``). The topics of partitions
        that failed here, before reaching the bus, are looked up (and
        auto-created, as a Produce to a valid new name does whatever its
        bundles) to tell an unknown topic or partition from a bad bundle; a
        topic whose appends met only sealed partitions is checked for being
        sealed whole (0xfe)."""
        local = [o for o in outcomes if isinstance(o, _Local)]
        sealed = [t.name for t, codes in _per_topic(req, outcomes)
                  if _SEALED in codes and all(code == _SEALED for code in codes)]
        if not local and not sealed:
            return tc.encode_produce_response(req.req_id, _flatten(req, outcomes, ()))
        names = sorted({o.topic for o in local})
        d = self.bus.execute(c.Metadata(names, auto_create=True)) if names else \
            defer.succeed([])

        def resolved(topics):
            known = {t.name: t.info for t in topics}
            for o in local:
                info = known.get(o.topic)
                if info is None:
                    o.code = None
                elif o.partition >= info.partitions:
                    o.code = tc.ERR_UNKNOWN_PARTITION
            return self._read_only_topics(sealed)
        d.addCallback(resolved)
        d.addCallback(lambda read_only: tc.encode_produce_response(
            req.req_id, _flatten(req, [o.code if isinstance(o, _Local) else o
                                       for o in outcomes], read_only)))
        return d

    def _read_only_topics(self, candidates):
        """Which of ``candidates`` (topics whose appends all met sealed
        partitions) have every partition sealed: those answer 0xfe (§1)."""
        if not candidates:
            return defer.succeed(())
        d = self.bus.execute(c.Metadata(candidates))

        def states(topics):
            waits = []
            for t in topics:
                if t.info is not None:
                    waits += [(t.name, self.bus.execute(c.PartitionInfo(t.name, p)))
                              for p in range(t.info.partitions)]
            return defer.DeferredList([w for _, w in waits], consumeErrors=True).addCallback(
                lambda results: _all_sealed([n for n, _ in waits], results))
        return d.addCallback(states)

    # -- Consume (0x02) ----------------------------------------------------------------

    def do_consume(self, req):
        """§5: resolve every partition's start, answer at once if any has data
        or an error, else park one waiting ``Fetch`` over all of them."""
        max_wait = tc.normalize_max_wait(req.max_wait_ms)
        min_bytes = min(req.min_bytes, MAX_FETCH_BYTES)
        wanted = [(t.name, p) for t in req.topics for p in t.partitions]
        infos = _results([self.bus.execute(c.PartitionInfo(name, p.partition))
                          for name, p in wanted])
        return infos.addCallback(self._consume_plan, req, wanted, max_wait, min_bytes)

    def _consume_plan(self, infos, req, wanted, max_wait, min_bytes):
        plans = []
        reads = []
        for (name, p), (ok, state) in zip(wanted, infos):
            if not ok:
                if not state.check(LogError):
                    self.factory.log_failure(state)
                plans.append(_Plan(name, p, error=state.value))
                continue
            plan = _start(name, p, state)
            plans.append(plan)
            if plan.offset is not None and not plan.eof:
                reads.append(plan)
        if reads:
            d = self.bus.execute(c.Fetch([c.FetchPartition(
                pl.topic, pl.partition, pl.offset, min(pl.fetch_size, MAX_FETCH_BYTES))
                for pl in reads]))
            return d.addCallback(self._answer_now, req, plans, reads)
        if max_wait and all(pl.eof for pl in plans):
            d = self.bus.execute(c.Fetch([c.FetchPartition(
                pl.topic, pl.partition, pl.offset, min(pl.fetch_size, MAX_FETCH_BYTES))
                for pl in plans], max_wait, max(min_bytes, 1)))
            return d.addCallback(self._answer_parked, req, plans)
        return self._consume_response(req, plans, {})

    def _answer_now(self, datas, req, plans, reads):
        return self._consume_response(req, plans, {id(pl): data for pl, data in
                                                   zip(reads, datas)})

    def _answer_parked(self, datas, req, plans):
        for pl, data in zip(plans, datas):
            pl.parked = True
        return self._consume_response(req, plans, {id(pl): data for pl, data in
                                                   zip(plans, datas)})

    def _consume_response(self, req, plans, datas):
        topics = []
        it = iter(plans)
        for topic in req.topics:
            mine = [next(it) for _ in topic.partitions]
            entries = [self._fetch_entry(pl, datas.get(id(pl), _NOTHING)) for pl in mine]
            if any(e is None for e in entries):
                topics.append(ConsumeTopicResult(topic.name, len(mine), None))
            else:
                topics.append(ConsumeTopicResult(topic.name, len(mine), tuple(entries)))
        return tc.encode_consume_response(req.req_id, topics)

    def _fetch_entry(self, plan, data):
        """One partition's header entry and chunk; None: the topic looks unknown."""
        error = plan.error
        if data is not _NOTHING and data.error is not None:
            error = data.error
        if error is not None:
            if isinstance(error, TOPIC_UNKNOWN):
                return None
            if isinstance(error, UnknownPartition):
                return ConsumeEntry(plan.partition, FETCH_UNKNOWN_PARTITION)
            if isinstance(error, OffsetOutOfRange):
                hw = max(error.log_end, 0)
                return ConsumeEntry(plan.partition, FETCH_BOUNDARY, hw_mark=hw,
                                    first_avail=first_avail_seq(error.log_start, hw))
            return ConsumeEntry(plan.partition, FETCH_SYSTEM_ERROR)
        if plan.boundary:
            return ConsumeEntry(plan.partition, FETCH_BOUNDARY, hw_mark=plan.hw_mark,
                                first_avail=plan.first_avail)
        if data is _NOTHING:
            # At the end, answered at once: "00, firstAvailSeq, hwMark, 0" (§5.4).
            return ConsumeEntry(plan.partition, FETCH_OK, plan.first_avail, plan.hw_mark,
                                chunk=[])
        try:
            chunk = _Chunk(self.bus, data.batches, data.offset,
                           min(plan.fetch_size, MAX_FETCH_BYTES))
        except LookupError:
            self.factory.log_failure(Failure())
            return ConsumeEntry(plan.partition, FETCH_SYSTEM_ERROR)
        hw = data.high_watermark
        if not chunk.parts:
            base = 0 if plan.parked else first_avail_seq(data.log_start, hw)
            return ConsumeEntry(plan.partition, FETCH_OK, base, hw, chunk=[])
        if chunk.sparse:
            return ConsumeEntry(plan.partition, FETCH_SPARSE, None, hw, chunk=chunk.parts,
                                chunk_len=chunk.size)
        return ConsumeEntry(plan.partition, FETCH_OK, chunk.base_seq, hw, chunk=chunk.parts,
                            chunk_len=chunk.size)

    # -- administration ---------------------------------------------------------------

    def do_discover_partitions(self, req):
        d = self.bus.execute(c.Metadata([req.topic]))

        def described(topics):
            info = topics[0].info
            if info is None:
                return tc.DiscoverPartitionsResponse(req.req_id, req.topic, ())
            numbers = req.partitions or range(min(info.partitions, 0xFFFF))
            return defer.DeferredList(
                [self.bus.execute(c.PartitionInfo(req.topic, p)) for p in numbers],
                consumeErrors=True).addCallback(lambda states: tc.DiscoverPartitionsResponse(
                    req.req_id, req.topic, tuple(_seqs(ok, s) for ok, s in states)))
        return d.addCallback(described).addCallback(tc.encode_response)

    def do_create_topic(self, req):
        def answer(code):
            return tc.encode_response(tc.CreateTopicResponse(req.req_id, req.topic, code))
        if req.partitions == 0:
            return answer(tc.CREATE_INVALID)
        try:
            tc.parse_topic_config(req.config)   # parsed for syntax; retention is global
        except ValueError as e:
            self.log_protocol_error(f"CreateTopic {req.topic}: bad config: {e}")
            return answer(tc.CREATE_BAD_CONFIG)
        d = self.bus.execute(c.CreateTopic(req.topic, req.partitions))

        def failed(failure):
            if failure.check(TopicExists):
                return tc.CREATE_EXISTS
            if failure.check(InvalidTopicName, InvalidRequest, NotAuthorized):
                return tc.CREATE_INVALID
            if not failure.check(LogError):
                self.factory.log_failure(failure)
            return tc.CREATE_SYSTEM_ERROR
        return d.addCallbacks(lambda _: tc.CREATE_OK, failed).addCallback(answer)

    def do_reload_conf(self, req):
        """Nothing to reload (config keys are parsed and ignored), so a known
        partition answers 0 (§2)."""
        d = self.bus.execute(c.PartitionInfo(req.topic, req.partition))

        def failed(failure):
            if failure.check(*TOPIC_UNKNOWN):
                return tc.RELOAD_UNKNOWN_TOPIC
            if failure.check(UnknownPartition):
                return tc.RELOAD_UNKNOWN_PARTITION
            return failure
        d.addCallbacks(lambda _: tc.RELOAD_OK, failed)
        return d.addCallback(lambda code: tc.encode_response(
            tc.ReloadConfResponse(req.req_id, req.topic, req.partition, code)))

    def do_status(self, req):
        def counted(topics):
            known = [t.info for t in topics if t.info is not None]
            partitions = sum(info.partitions for info in known)
            return tc.encode_response(tc.StatusResponse(
                req.req_id, len(known), partitions, partitions, self.factory.startup_ts))
        return self.bus.execute(c.Metadata()).addCallback(counted)

    def do_discover_topics(self, req):
        def listed(topics):
            return tc.encode_response(tc.DiscoverTopicsResponse(req.req_id, tuple(
                tc.TopicSummary(t.name, min(t.info.partitions, 0xFFFF))
                for t in topics if t.info is not None)))
        return self.bus.execute(c.Metadata()).addCallback(listed)

    def do_discover_topology(self, req):
        return tc.encode_response(tc.DiscoverTopologyResponse(req.req_id))

    _handlers = {
        tc.ProduceRequest: do_produce,
        tc.ConsumeRequest: do_consume,
        tc.DiscoverPartitionsRequest: do_discover_partitions,
        tc.CreateTopicRequest: do_create_topic,
        tc.ReloadConfRequest: do_reload_conf,
        tc.StatusRequest: do_status,
        tc.DiscoverTopicsRequest: do_discover_topics,
        tc.DiscoverTopologyRequest: do_discover_topology,
    }


class _Local:
    """A Produce partition decided before the bus (bad bundle or seqs); its
    code may still turn into "unknown topic/partition" once looked up."""

    __slots__ = ("code", "topic", "partition")

    def __init__(self, code, topic, partition):
        self.code = code
        self.topic = topic
        self.partition = partition


def _results(deferreds):
    """``[(ok, result or Failure)]`` of ``deferreds``, in a plain Deferred:
    cancelling one chained to a parked Fetch reaches the bus (a DeferredList
    ignores ``cancel`` once it has fired)."""
    out = defer.Deferred()
    defer.DeferredList(deferreds, consumeErrors=True).addCallback(out.callback)
    return out


def _settle(items):
    """A Deferred of ``items`` with every Deferred among them replaced by its
    result; it has fired already when none was pending (no fsync to wait for)."""
    waits = [(i, d) for i, d in enumerate(items) if isinstance(d, defer.Deferred)]
    if not waits:
        return defer.succeed(items)
    out = list(items)

    def fill(results):
        for (i, _), (_, value) in zip(waits, results):
            out[i] = value
        return out
    return defer.DeferredList([d for _, d in waits], consumeErrors=True).addCallback(fill)


def _per_topic(req, codes):
    """``(topic, [code of each of its partitions whose append was tried])``."""
    it = iter(codes)
    for topic in req.topics:
        yield topic, [code for code in (next(it) for _ in topic.partitions)
                      if type(code) is int]


def _flatten(req, codes, read_only):
    """The flat error list: one byte for a topic that looks unknown for every
    partition named (0xff) or is sealed whole (0xfe), else one per partition;
    a partition of a topic that vanished meanwhile gets 0x01."""
    out = []
    it = iter(codes)
    for topic in req.topics:
        mine = [next(it) for _ in topic.partitions]
        if all(code is None for code in mine):
            out.append(tc.ERR_UNKNOWN_TOPIC)
        elif topic.name in read_only:
            out.append(tc.ERR_READ_ONLY)
        else:
            out.extend(tc.ERR_UNKNOWN_PARTITION if code is None else
                       tc.ERR_INVALID_BUNDLE if code == _SEALED else code for code in mine)
    return out


def _all_sealed(names, results):
    sealed = {}
    for name, (ok, state) in zip(names, results):
        sealed[name] = sealed.get(name, True) and ok and state.sealed
    return {name for name, flag in sealed.items() if flag}


def _seqs(ok, state):
    """DiscoverPartitions' (firstAvailSeq, hwMark) for one partition; a
    partition that cannot be described gets the error form (2^64-1 twice,
    reason 0xfb), the only per-partition error the response has."""
    if not ok:
        return tc.PartitionSeqs(tc.U64_MAX, tc.U64_MAX, tc.DISCOVER_SYSTEM_ERROR)
    return tc.PartitionSeqs(first_avail_seq(state.log_start, state.high_watermark),
                            state.high_watermark)


class _Plan:
    """Where one requested partition of a Consume starts (§5.3)."""

    __slots__ = ("topic", "partition", "fetch_size", "error", "offset", "eof", "boundary",
                 "hw_mark", "first_avail", "parked")

    def __init__(self, topic, part, error=None):
        self.topic = topic
        self.partition = part.partition
        self.fetch_size = part.fetch_size
        self.error = error
        self.offset = None
        self.eof = False
        self.boundary = False
        self.hw_mark = 0
        self.first_avail = 0
        self.parked = False


def _start(topic, part, state):
    plan = _Plan(topic, part)
    hw = state.high_watermark
    plan.hw_mark = hw
    plan.first_avail = first_avail = first_avail_seq(state.log_start, hw)
    seq = part.seq
    if seq == 0:
        seq = state.log_start + 1
    if seq == TAIL_SEQ or seq == hw + 1:
        plan.offset = hw
        plan.eof = True
    elif seq > hw + 1 or seq - 1 < state.log_start:
        plan.boundary = True
        plan.first_avail = first_avail
    else:
        plan.offset = seq - 1
    return plan


class TankFactory(DialectFactory):
    protocol = TankProtocol

    def __init__(self, bus, listener):
        super().__init__(bus, listener)
        self.max_frame_bytes = listener.options.get("max_frame_bytes",
                                                    tc.DEFAULT_MAX_FRAME_BYTES)
        #: Status reports when this listener was made (epoch seconds)
        self.startup_ts = int(time.time())
