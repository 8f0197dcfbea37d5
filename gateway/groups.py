"""The group coordinator: one per process, shared by every dialect.

Consumers that join a group under the same name split its work between
them. The coordinator keeps, in memory, who is in each group, which
generation the group is in and what each member was assigned; it never
assigns anything itself. A member (the *leader*) computes the assignment
from the others' subscription metadata and hands it back through
``sync``. Metadata and assignments are opaque bytes, and protocols are
names, so the coordinator knows nothing of any dialect's payloads (Kafka's
consumer protocol, for one, is encoded and decoded by its clients).

A group moves through::

    Empty -> PreparingRebalance -> AwaitingSync -> Stable
                    ^                   |            |
                    +--- join, leave, expiry --------+

* ``join`` records the member and parks its answer; the group prepares a
  rebalance. The join completes once every member has a parked join, or
  once the rebalance timeout (the largest session timeout of the members)
  has passed since the rebalance began; members that did not rejoin are
  removed. Completion starts a new generation, picks the protocol and the
  leader, and answers every parked join (the leader also gets every
  member's metadata).
* ``sync`` from the leader stores the assignment and answers the members
  waiting for theirs; the group is then Stable.
* ``heartbeat`` keeps a session alive, and is how members learn that a
  rebalance has begun (``RebalanceInProgress``).
* ``leave``, and a session that expires, remove a member and rebalance the
  rest. A member whose join is parked never expires: it is waiting for the
  coordinator, not the other way round.

Sessions are timed with the reactor's clock (``callLater``), so tests drive
them with ``twisted.internet.task.Clock``. Membership is not durable: after
a restart every member is unknown and rejoins, which is what clients do
when told ``UnknownMember``. Committed offsets are not kept here; they go
through the bus like every dialect's.
"""
import uuid

from twisted.application.service import Service
from twisted.internet import defer

from gateway.errors import LogError

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
AWAITING_SYNC = "AwaitingSync"
STABLE = "Stable"
#: what ``describe`` answers for a group that does not exist
DEAD = "Dead"


class GroupError(LogError):
    """A group operation was refused; each dialect maps the subclasses to
    its own wire codes."""


class InvalidGroupId(GroupError):
    """The group id is empty."""


class InvalidSessionTimeout(GroupError):
    """The session timeout is outside the configured bounds."""


class InconsistentProtocol(GroupError):
    """No protocol type or names, another protocol type than the group's,
    or no protocol name shared with every current member."""


class UnknownMember(GroupError):
    """The member id is not (or no longer) a member of the group."""


class IllegalGeneration(GroupError):
    """The request names a generation other than the group's current one."""


class RebalanceInProgress(GroupError):
    """The group is rebalancing: the member must join again."""


class JoinResult:
    """A completed join. ``members`` (``[(member_id, metadata)]`` for the
    chosen protocol) is filled for the leader only."""

    __slots__ = ("generation", "protocol", "leader_id", "member_id", "members")

    def __init__(self, generation, protocol, leader_id, member_id, members):
        self.generation = generation
        self.protocol = protocol
        self.leader_id = leader_id
        self.member_id = member_id
        self.members = members

    def __repr__(self):
        return (f"<JoinResult generation={self.generation} protocol={self.protocol!r} "
                f"leader={self.leader_id!r} member={self.member_id!r} "
                f"members={len(self.members)}>")


class GroupDescription:
    """One group as ``describe`` sees it; ``members`` are
    ``(member_id, client_id, client_host, metadata, assignment)``."""

    __slots__ = ("group_id", "state", "protocol_type", "protocol", "members")

    def __init__(self, group_id, state, protocol_type, protocol, members):
        self.group_id = group_id
        self.state = state
        self.protocol_type = protocol_type
        self.protocol = protocol
        self.members = members


class _Member:
    __slots__ = ("group", "member_id", "client_id", "client_host", "session_timeout_ms",
                 "protocols", "assignment", "timer", "join", "sync")

    def __init__(self, group, member_id, client_id, client_host):
        self.group = group
        self.member_id = member_id
        self.client_id = client_id
        self.client_host = client_host
        self.session_timeout_ms = 0
        #: [(name, metadata)] in the member's order of preference
        self.protocols = ()
        self.assignment = b""
        self.timer = None
        #: the parked join and sync answers (Deferreds), if any
        self.join = None
        self.sync = None

    def metadata(self, protocol):
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""


class _Group:
    __slots__ = ("group_id", "state", "generation", "protocol_type", "protocol",
                 "leader_id", "members", "rebalance_timer")

    def __init__(self, group_id):
        self.group_id = group_id
        self.state = EMPTY
        self.generation = 0
        self.protocol_type = None
        self.protocol = None
        self.leader_id = None
        #: member id -> _Member, in the order they first joined
        self.members = {}
        self.rebalance_timer = None


class GroupCoordinator(Service):
    """Every group of the process. ``config`` is the ``groups:`` section
    (``GroupsConfig``); ``reactor`` provides ``callLater``.

    As a service it is stopped after the listeners (their connections are
    gone by then) and cancels its timers; the group state simply ends with
    the process.
    """

    name = "groups"

    def __init__(self, config, reactor):
        self.min_session_timeout_ms = config.min_session_timeout_ms
        self.max_session_timeout_ms = config.max_session_timeout_ms
        self.reactor = reactor
        self.groups = {}

    def stopService(self):
        super().stopService()
        for group in list(self.groups.values()):
            self._cancel_rebalance_timer(group)
            for member in list(group.members.values()):
                self._remove(group, member, RebalanceInProgress(
                    f"group {group.group_id}: the coordinator is stopping"))
        self.groups.clear()

    # -- requests ------------------------------------------------------------------

    def join(self, group_id, member_id, client_id, client_host, session_timeout_ms,
             protocol_type, protocols):
        """Join (or rejoin) a group; fires with a ``JoinResult`` once the
        rebalance completes. ``member_id`` is "" for a new member, which gets
        the id ``<client_id>-<uuid4>``. ``protocols`` are ``[(name,
        metadata)]`` in order of preference."""
        try:
            return self._join(group_id, member_id, client_id, client_host,
                              session_timeout_ms, protocol_type, protocols)
        except GroupError as e:
            return defer.fail(e)

    def _join(self, group_id, member_id, client_id, client_host, session_timeout_ms,
              protocol_type, protocols):
        if not group_id:
            raise InvalidGroupId("empty group id")
        if not (self.min_session_timeout_ms <= session_timeout_ms
                <= self.max_session_timeout_ms):
            raise InvalidSessionTimeout(
                f"session timeout {session_timeout_ms} ms outside "
                f"{self.min_session_timeout_ms}..{self.max_session_timeout_ms}")
        protocols = tuple(protocols)
        if not protocol_type or not protocols:
            raise InconsistentProtocol("no protocol type or no protocols")
        group = self.groups.get(group_id)
        if member_id and (group is None or member_id not in group.members):
            raise UnknownMember(f"group {group_id}: unknown member {member_id}")
        if group is not None and group.members:
            self._check_protocols(group, member_id, protocol_type, protocols)
        if group is None:
            group = self.groups[group_id] = _Group(group_id)
        if not group.members:
            group.protocol_type = protocol_type
        if member_id:
            member = group.members[member_id]
            unchanged = member.protocols == protocols
        else:
            member = _Member(group, f"{client_id or ''}-{uuid.uuid4()}", client_id,
                             client_host)
            group.members[member.member_id] = member
            unchanged = False
        member.session_timeout_ms = session_timeout_ms
        member.protocols = protocols
        if group.state == STABLE and unchanged and member.member_id != group.leader_id:
            # A follower asking again with what it had: nothing to rebalance.
            self._touch(member)
            return defer.succeed(self._join_result(group, member))
        if member.join is not None:
            # A join replacing one still parked: the older answer is dropped.
            old, member.join = member.join, None
            old.errback(RebalanceInProgress(f"group {group_id}: joined again"))
        parked = member.join = defer.Deferred(lambda d, m=member: self._join_cancelled(m, d))
        self._cancel_timer(member)
        if group.state != PREPARING:
            self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        return parked

    @staticmethod
    def _check_protocols(group, member_id, protocol_type, protocols):
        if protocol_type != group.protocol_type:
            raise InconsistentProtocol(
                f"group {group.group_id} uses protocol type {group.protocol_type!r}, "
                f"not {protocol_type!r}")
        names = {name for name, _ in protocols}
        for other in group.members.values():
            if other.member_id != member_id:
                names &= {name for name, _ in other.protocols}
        if not names:
            raise InconsistentProtocol(
                f"group {group.group_id}: no protocol shared with every member")

    def sync(self, group_id, generation, member_id, assignments):
        """Fires with this member's assignment (bytes). The leader passes
        ``assignments`` (``[(member_id, assignment)]``); the others pass none
        and wait for it."""
        try:
            group, member = self._member(group_id, member_id)
            if generation != group.generation:
                raise IllegalGeneration(
                    f"group {group_id}: generation {generation}, current {group.generation}")
            if group.state == PREPARING:
                raise RebalanceInProgress(f"group {group_id} is rebalancing")
        except GroupError as e:
            return defer.fail(e)
        self._touch(member)
        if group.state == STABLE:
            return defer.succeed(member.assignment)
        if member.member_id != group.leader_id:
            if member.sync is None:
                member.sync = defer.Deferred(lambda d, m=member: self._sync_cancelled(m, d))
            return member.sync
        given = dict(assignments)
        for other in group.members.values():
            other.assignment = given.get(other.member_id, b"")
        group.state = STABLE
        for other in group.members.values():
            waiting, other.sync = other.sync, None
            if waiting is not None:
                waiting.callback(other.assignment)
        return defer.succeed(member.assignment)

    def heartbeat(self, group_id, generation, member_id):
        """Keep the member's session alive. Fails with ``RebalanceInProgress``
        while the group rebalances (the session is refreshed all the same)."""
        try:
            group, member = self._member(group_id, member_id)
            if generation != group.generation:
                raise IllegalGeneration(
                    f"group {group_id}: generation {generation}, current {group.generation}")
        except GroupError as e:
            return defer.fail(e)
        self._touch(member)
        if group.state != STABLE:
            return defer.fail(RebalanceInProgress(f"group {group_id} is rebalancing"))
        return defer.succeed(None)

    def leave(self, group_id, member_id):
        """Remove the member at once; the others rebalance."""
        try:
            group, member = self._member(group_id, member_id)
        except GroupError as e:
            return defer.fail(e)
        self._remove(group, member, UnknownMember(f"group {group_id}: {member_id} left"))
        self._after_removal(group)
        return defer.succeed(None)

    def check_commit(self, group_id, generation, member_id):
        """Raise the ``GroupError`` that forbids this member to commit
        offsets for the group, or refresh its session and return.

        ``generation`` < 0 is a client that does not take part in group
        membership (it assigns partitions itself): it may commit only to a
        group without members. A member may commit in PreparingRebalance,
        so that it can save its position before it rejoins.
        """
        if not group_id:
            raise InvalidGroupId("empty group id")
        group = self.groups.get(group_id)
        members = group.members if group is not None else {}
        if generation < 0:
            if not members:
                return
            if group.state == AWAITING_SYNC:
                raise RebalanceInProgress(f"group {group_id} is rebalancing")
            raise UnknownMember(f"group {group_id} has members; {member_id!r} is not one")
        if not members:
            raise IllegalGeneration(f"group {group_id} has no members")
        if group.state == AWAITING_SYNC:
            raise RebalanceInProgress(f"group {group_id} is rebalancing")
        member = members.get(member_id)
        if member is None:
            raise UnknownMember(f"group {group_id}: unknown member {member_id}")
        if generation != group.generation:
            raise IllegalGeneration(
                f"group {group_id}: generation {generation}, current {group.generation}")
        self._touch(member)

    def describe(self, group_id):
        """A ``GroupDescription``; a group without members is ``Dead``."""
        group = self.groups.get(group_id)
        if group is None or not group.members:
            return GroupDescription(group_id, DEAD, "", "", [])
        protocol = group.protocol if group.state != PREPARING else None
        return GroupDescription(
            group_id, group.state, group.protocol_type or "", protocol or "",
            [(m.member_id, m.client_id or "", m.client_host or "",
              m.metadata(protocol) if protocol else b"",
              m.assignment if group.state == STABLE else b"")
             for m in group.members.values()])

    def list_groups(self):
        """``[(group_id, protocol_type)]`` of the groups that have members."""
        return [(g.group_id, g.protocol_type) for g in self.groups.values() if g.members]

    # -- rebalancing -----------------------------------------------------------------

    def _prepare_rebalance(self, group):
        group.state = PREPARING
        for member in group.members.values():
            waiting, member.sync = member.sync, None
            if waiting is not None:
                waiting.errback(RebalanceInProgress(f"group {group.group_id} is rebalancing"))
        self._cancel_rebalance_timer(group)
        timeout = max(m.session_timeout_ms for m in group.members.values())
        group.rebalance_timer = self.reactor.callLater(
            timeout / 1000.0, self._rebalance_timed_out, group)

    def _rebalance_timed_out(self, group):
        group.rebalance_timer = None
        self._complete_join(group)

    def _maybe_complete_join(self, group):
        if group.state == PREPARING and all(
                m.join is not None for m in group.members.values()):
            self._complete_join(group)

    def _complete_join(self, group):
        self._cancel_rebalance_timer(group)
        for member in [m for m in group.members.values() if m.join is None]:
            self._remove(group, member, UnknownMember(
                f"group {group.group_id}: {member.member_id} did not rejoin in time"))
        if not group.members:
            self._empty(group)
            return
        group.generation += 1
        group.protocol = self._select_protocol(group)
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.state = AWAITING_SYNC
        for member in group.members.values():
            waiting, member.join = member.join, None
            self._touch(member)
            waiting.callback(self._join_result(group, member))

    @staticmethod
    def _select_protocol(group):
        """The protocol every member supports that most members prefer
        (ties go to the earliest member's preference)."""
        members = list(group.members.values())
        shared = set(name for name, _ in members[0].protocols)
        for member in members[1:]:
            shared &= {name for name, _ in member.protocols}
        votes = {}
        for member in members:
            choice = next(name for name, _ in member.protocols if name in shared)
            votes[choice] = votes.get(choice, 0) + 1
        ranked = [name for name, _ in members[0].protocols if name in shared]
        return max(ranked, key=lambda name: (votes.get(name, 0), -ranked.index(name)))

    def _join_result(self, group, member):
        members = []
        if member.member_id == group.leader_id:
            members = [(m.member_id, m.metadata(group.protocol))
                       for m in group.members.values()]
        return JoinResult(group.generation, group.protocol, group.leader_id,
                          member.member_id, members)

    def _after_removal(self, group):
        if not group.members:
            self._empty(group)
        elif group.state == PREPARING:
            self._maybe_complete_join(group)
        else:
            self._prepare_rebalance(group)
            self._maybe_complete_join(group)

    def _empty(self, group):
        """No members left: the group is forgotten (its committed offsets,
        kept by the store, are not)."""
        self._cancel_rebalance_timer(group)
        group.state = EMPTY
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]

    # -- members ----------------------------------------------------------------------

    def _member(self, group_id, member_id):
        if not group_id:
            raise InvalidGroupId("empty group id")
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is None:
            raise UnknownMember(f"group {group_id}: unknown member {member_id}")
        return group, member

    def _touch(self, member):
        """(Re)start the member's session, unless its join is parked."""
        if member.join is not None:
            return
        seconds = member.session_timeout_ms / 1000.0
        if member.timer is not None and member.timer.active():
            member.timer.reset(seconds)
        else:
            member.timer = self.reactor.callLater(seconds, self._expired, member)

    def _expired(self, member):
        member.timer = None
        group = member.group
        if group.members.get(member.member_id) is member:
            self._remove(group, member, UnknownMember(
                f"group {group.group_id}: session of {member.member_id} expired"))
            self._after_removal(group)

    def _remove(self, group, member, error):
        """Take the member out of the group; its parked answers fail with
        ``error``."""
        del group.members[member.member_id]
        self._cancel_timer(member)
        for waiting in (member.join, member.sync):
            if waiting is not None and not waiting.called:
                waiting.errback(error)
        member.join = member.sync = None

    def _join_cancelled(self, member, d):
        """The connection waiting for this join went away: the member is
        no longer waiting, so its session runs again."""
        if member.join is d:
            member.join = None
            if member.group.members.get(member.member_id) is member:
                self._touch(member)

    @staticmethod
    def _sync_cancelled(member, d):
        if member.sync is d:
            member.sync = None

    @staticmethod
    def _cancel_timer(member):
        if member.timer is not None and member.timer.active():
            member.timer.cancel()
        member.timer = None

    @staticmethod
    def _cancel_rebalance_timer(group):
        if group.rebalance_timer is not None and group.rebalance_timer.active():
            group.rebalance_timer.cancel()
        group.rebalance_timer = None
