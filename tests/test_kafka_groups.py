"""The group coordinator (gateway/groups.py) on a fake clock: generations,
member ids, session expiry, rebalancing on join, leave and expiry, the
sync barrier and the commit guard (protocols/kafka.md §2.4)."""
from twisted.internet import defer, task
from twisted.trial.unittest import SynchronousTestCase

from gateway.config import GroupsConfig
from gateway.groups import (
    AWAITING_SYNC, DEAD, PREPARING, STABLE, GroupCoordinator, IllegalGeneration,
    InconsistentProtocol, InvalidGroupId, InvalidSessionTimeout, RebalanceInProgress,
    UnknownMember)

RANGE = [("range", b"meta-r"), ("roundrobin", b"meta-rr")]


class CoordinatorTests(SynchronousTestCase):

    def setUp(self):
        self.clock = task.Clock()
        self.coordinator = GroupCoordinator(GroupsConfig(6000, 300000), self.clock)

    def join(self, member_id="", session=10000, protocols=RANGE, group="g", client="c",
             protocol_type="consumer"):
        return self.coordinator.join(group, member_id, client, "127.0.0.1", session,
                                     protocol_type, protocols)

    def result(self, d):
        return self.successResultOf(d)

    def error(self, d, kind):
        return self.failureResultOf(d, kind)

    def stable_pair(self):
        """Two members in a Stable group, generation 2."""
        a = self.result(self.join(client="a"))
        self.result(self.coordinator.sync("g", 1, a.member_id, [(a.member_id, b"all")]))
        joining_b = self.join(client="b")
        self.assertNoResult(joining_b)
        # a learns of the rebalance from its heartbeat, and rejoins
        self.error(self.coordinator.heartbeat("g", 1, a.member_id), RebalanceInProgress)
        a2 = self.result(self.join(a.member_id))
        b = self.result(joining_b)
        self.assertEqual((a2.generation, b.generation), (2, 2))
        sync_b = self.coordinator.sync("g", 2, b.member_id, [])
        self.assertNoResult(sync_b)
        self.result(self.coordinator.sync("g", 2, a.member_id,
                                          [(a.member_id, b"p0"), (b.member_id, b"p1")]))
        self.assertEqual(self.result(sync_b), b"p1")
        return a2, b

    def test_first_member_leads_generation_one(self):
        joined = self.result(self.join(client="client-1"))
        self.assertEqual(joined.generation, 1)
        self.assertEqual(joined.leader_id, joined.member_id)
        self.assertTrue(joined.member_id.startswith("client-1-"))
        self.assertEqual(joined.protocol, "range")
        self.assertEqual(joined.members, [(joined.member_id, b"meta-r")])
        self.assertEqual(self.coordinator.describe("g").state, AWAITING_SYNC)
        assignment = self.result(self.coordinator.sync("g", 1, joined.member_id,
                                                       [(joined.member_id, b"mine")]))
        self.assertEqual(assignment, b"mine")
        self.assertEqual(self.coordinator.describe("g").state, STABLE)
        self.result(self.coordinator.heartbeat("g", 1, joined.member_id))

    def test_second_member_rebalances_and_only_leader_gets_members(self):
        a, b = self.stable_pair()
        self.assertEqual(a.leader_id, a.member_id)
        self.assertEqual(sorted(m for m, _ in a.members), sorted([a.member_id, b.member_id]))
        self.assertEqual(b.members, [])
        self.assertEqual(b.leader_id, a.member_id)
        described = self.coordinator.describe("g")
        self.assertEqual(described.state, STABLE)
        self.assertEqual(sorted(m[4] for m in described.members), [b"p0", b"p1"])
        self.assertEqual(self.coordinator.list_groups(), [("g", "consumer")])

    def test_third_member_triggers_new_generation(self):
        a, b = self.stable_pair()
        joining_c = self.join(client="c3")
        self.assertNoResult(joining_c)
        self.assertEqual(self.coordinator.describe("g").state, PREPARING)
        for m in (a, b):
            self.error(self.coordinator.heartbeat("g", 2, m.member_id), RebalanceInProgress)
        ja, jb = self.join(a.member_id), self.join(b.member_id)
        results = [self.result(d) for d in (ja, jb, joining_c)]
        self.assertEqual({r.generation for r in results}, {3})
        self.assertEqual(results[0].leader_id, a.member_id)   # the old leader stays
        self.assertEqual(len(results[0].members), 3)

    def test_leave_rebalances_the_rest(self):
        a, b = self.stable_pair()
        self.result(self.coordinator.leave("g", b.member_id))
        self.error(self.coordinator.heartbeat("g", 2, b.member_id), UnknownMember)
        self.error(self.coordinator.heartbeat("g", 2, a.member_id), RebalanceInProgress)
        again = self.result(self.join(a.member_id))
        self.assertEqual(again.generation, 3)
        self.assertEqual(again.members, [(a.member_id, b"meta-r")])

    def test_session_expiry_removes_member(self):
        a, b = self.stable_pair()
        for _ in range(3):
            self.clock.advance(3)
            self.result(self.coordinator.heartbeat("g", 2, a.member_id))
        self.clock.advance(3)
        # t = 12 s: b's 10 s session is over; a's, renewed at 9 s, is not
        self.error(self.coordinator.heartbeat("g", 2, b.member_id), UnknownMember)
        self.error(self.coordinator.heartbeat("g", 2, a.member_id), RebalanceInProgress)

    def test_member_that_does_not_rejoin_is_dropped_at_rebalance_timeout(self):
        a, b = self.stable_pair()
        joining_c = self.join(client="c3", session=6000)
        ja = self.join(a.member_id)
        self.assertNoResult(ja)
        # b keeps its session alive but never rejoins: after the rebalance
        # timeout (the largest session, 10 s) it is out.
        for _ in range(5):
            self.clock.advance(2)
            self.coordinator.heartbeat("g", 2, b.member_id).addErrback(lambda f: None)
        results = [self.result(ja), self.result(joining_c)]
        self.assertEqual({r.generation for r in results}, {3})
        self.error(self.coordinator.heartbeat("g", 3, b.member_id), UnknownMember)

    def test_parked_join_does_not_expire(self):
        a, b = self.stable_pair()
        ja = self.join(a.member_id)
        self.clock.advance(9)
        self.coordinator.heartbeat("g", 2, b.member_id).addErrback(lambda f: None)
        self.clock.advance(9.5)     # a's 10 s session would be over; its join is parked
        # the rebalance timed out (10 s): b did not rejoin, a is alone in generation 3
        self.assertEqual(self.result(ja).generation, 3)

    def test_cancelled_join_lets_session_run_again(self):
        a = self.result(self.join())
        self.result(self.coordinator.sync("g", 1, a.member_id, []))
        joining_b = self.join(client="b")
        joining_b.cancel()      # b's connection went away while it waited
        self.failureResultOf(joining_b, defer.CancelledError)
        rejoined = self.join(a.member_id)
        self.assertNoResult(rejoined)       # b is still a member, without a parked join
        self.clock.advance(10)
        # b's session ran out (and the rebalance timed out): a is alone
        joined = self.result(rejoined)
        self.assertEqual(joined.generation, 2)
        self.assertEqual(joined.members, [(a.member_id, b"meta-r")])

    def test_follower_with_same_metadata_rejoins_without_rebalance(self):
        a, b = self.stable_pair()
        again = self.result(self.join(b.member_id))
        self.assertEqual(again.generation, 2)
        self.assertEqual(again.members, [])
        self.assertEqual(self.coordinator.describe("g").state, STABLE)

    def test_sync_waits_for_leader_and_fails_on_rebalance(self):
        a = self.result(self.join(client="a"))
        self.result(self.coordinator.sync("g", 1, a.member_id, []))
        joining_b = self.join(client="b")
        a2 = self.result(self.join(a.member_id))
        b = self.result(joining_b)
        waiting = self.coordinator.sync("g", 2, b.member_id, [])
        self.assertNoResult(waiting)
        self.join(client="late")
        self.error(waiting, RebalanceInProgress)
        self.assertEqual(a2.generation, 2)

    def test_errors(self):
        self.error(self.join(group=""), InvalidGroupId)
        self.error(self.join(session=100), InvalidSessionTimeout)
        self.error(self.join(session=400000), InvalidSessionTimeout)
        self.error(self.join(protocols=[]), InconsistentProtocol)
        self.error(self.join(protocol_type=""), InconsistentProtocol)
        self.error(self.join("nobody"), UnknownMember)
        a = self.result(self.join())
        self.error(self.join(protocols=[("other", b"")]), InconsistentProtocol)
        self.error(self.join(protocol_type="connect"), InconsistentProtocol)
        self.error(self.coordinator.sync("g", 7, a.member_id, []), IllegalGeneration)
        self.error(self.coordinator.sync("g", 1, "nobody", []), UnknownMember)
        self.error(self.coordinator.heartbeat("g", 0, a.member_id), IllegalGeneration)
        self.error(self.coordinator.heartbeat("other", 1, a.member_id), UnknownMember)
        self.error(self.coordinator.leave("g", "nobody"), UnknownMember)
        self.error(self.coordinator.leave("", "x"), InvalidGroupId)

    def test_protocol_is_the_one_most_members_prefer(self):
        a = self.result(self.join(client="a", protocols=[("roundrobin", b"1"), ("range", b"2")]))
        self.result(self.coordinator.sync("g", 1, a.member_id, []))
        jb = self.join(client="b", protocols=[("range", b"3")])
        ja = self.join(a.member_id, protocols=[("roundrobin", b"1"), ("range", b"2")])
        self.assertEqual(self.result(ja).protocol, "range")    # the only shared one
        self.assertEqual(self.result(jb).protocol, "range")

    def test_commit_guard(self):
        check = self.coordinator.check_commit
        check("g", -1, "")                              # no members: a 0.8 client commits
        self.assertRaises(IllegalGeneration, check, "g", 3, "m")
        self.assertRaises(InvalidGroupId, check, "", -1, "")
        a = self.result(self.join())
        self.assertRaises(RebalanceInProgress, check, "g", 1, a.member_id)   # AwaitingSync
        self.result(self.coordinator.sync("g", 1, a.member_id, []))
        check("g", 1, a.member_id)
        self.assertRaises(UnknownMember, check, "g", -1, "")
        self.assertRaises(UnknownMember, check, "g", 1, "nobody")
        self.assertRaises(IllegalGeneration, check, "g", 0, a.member_id)
        self.join(client="b")                           # PreparingRebalance: still allowed
        check("g", 1, a.member_id)

    def test_last_member_leaving_forgets_group(self):
        a = self.result(self.join())
        self.result(self.coordinator.leave("g", a.member_id))
        self.assertEqual(self.coordinator.describe("g").state, DEAD)
        self.assertEqual(self.coordinator.list_groups(), [])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.result(self.join()).generation, 1)

    def test_stop_cancels_timers_and_parked_calls(self):
        a, b = self.stable_pair()
        waiting = self.join(client="c3")
        self.coordinator.startService()
        self.coordinator.stopService()
        self.error(waiting, RebalanceInProgress)
        self.assertEqual(self.clock.getDelayedCalls(), [])
