"""Unit tests of the sessions plugin's logic with the SDK's driver (plain Python):

    PYTHONPATH=../../guest-sdk/python python3 -m unittest -v     # from this folder
"""

import unittest
from collections import defaultdict

from groupstate_sdk.testing import Batch, KeyedDriver
from groupstate_sdk.v2 import Timer

from sessions import GAP_MS_DEFAULT, SESSIONS, Sessions

GAP = GAP_MS_DEFAULT
DELAY = 10 * 60 * 1000
T0 = 1_000_000_000


def driver() -> KeyedDriver:
    return KeyedDriver(Sessions, time_mode="event-time", watermark_delay_ms=DELAY)


def batch(views) -> Batch:
    b = Batch()
    for user, ts, page in views:
        b.event_at(user, ts, {"user": user, "ts": ts, "page": page})
    return b


def closed(output) -> tuple:
    return (output["user"], output["start"], output["end"], output["events"], output["pages"])


def oracle(views, watermark_ms):
    """The plugin's rule, plainly: per user, the views in time order, cut where two are
    GAP or more apart; a session is closed once the watermark reaches its end plus GAP."""
    by_user = defaultdict(list)
    for user, ts, page in views:
        by_user[user].append((ts, page))
    out = []
    for user, vs in by_user.items():
        vs.sort()
        start = 0
        for i in range(1, len(vs) + 1):
            if i == len(vs) or vs[i][0] - vs[i - 1][0] >= GAP:
                s = vs[start:i]
                if s[-1][0] + GAP <= watermark_ms:
                    out.append((user, s[0][0], s[-1][0], len(s), len({p for _, p in s})))
                start = i
    return sorted(out)


def views(n, users, seed):
    """n views of `users` users, time moving on by up to 3 minutes a view, each up to
    half the watermark delay earlier (out of order, never late)."""
    state = seed
    def nxt(m):
        nonlocal state
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        return (state >> 33) % m
    t = 1_700_000_000_000
    out = []
    for _ in range(n):
        t += nxt(180_000)
        ts = t - nxt(DELAY // 2)
        out.append((f"u{nxt(users)}", ts, f"/p{nxt(5)}"))
    return out


class SessionsTest(unittest.TestCase):
    def test_a_session_closes_when_the_watermark_passes_its_end_plus_the_gap(self):
        d = driver()
        first = d.run(batch([("a", T0, "/x"), ("a", T0 + 60_000, "/y"), ("b", T0, "/x")]))
        self.assertEqual(first.outputs(), [])
        self.assertEqual(d.timers("a"), [Timer(T0 + 60_000 + GAP, str(T0))])
        self.assertEqual(d.key_state("a", lambda s: s.map(SESSIONS).keys()), [T0])
        # A batch's watermark comes from the batches before it.
        self.assertEqual(d.run(batch([("c", T0 + 60_000 + GAP + DELAY, "/z")])).outputs(), [])
        third = d.run(Batch())
        self.assertEqual(third.watermark_ms, T0 + 60_000 + GAP)
        self.assertEqual(
            [closed(o) for o in third.output_values()],
            [("b", T0, T0, 1, 1), ("a", T0, T0 + 60_000, 2, 2)],
            "b's timer expires first",
        )
        self.assertEqual(d.keys(), ["c"], "closed sessions leave nothing behind")

    def test_an_out_of_order_view_merges_the_two_sessions_it_bridges(self):
        d = driver()
        d.run(batch([("a", T0, "/x"), ("a", T0 + GAP + 1_000, "/y")]))
        self.assertEqual(len(d.timers("a")), 2)
        # Not late: the watermark is T0 + GAP + 1 s - DELAY.
        d.run(batch([("a", T0 + GAP - 5 * 60_000, "/z")]))
        self.assertEqual(d.timers("a"), [Timer(T0 + 2 * GAP + 1_000, str(T0))])
        done = d.run(Batch(watermark_ms=T0 + 2 * GAP + 1_000))
        self.assertEqual([closed(o) for o in done.output_values()], [("a", T0, T0 + GAP + 1_000, 3, 3)])

    def test_a_key_gets_its_data_call_and_then_its_timer_call_in_one_batch(self):
        d = driver()
        d.run(batch([("a", T0, "/x")]))
        d.run(batch([("b", T0 + GAP + DELAY, "/x")]))
        both = d.run(batch([("a", T0 + GAP + DELAY, "/y")]))
        self.assertEqual([(c.key, c.timer is not None) for c in both.calls], [("a", False), ("a", True)])
        self.assertEqual([closed(o) for o in both.output_values()], [("a", T0, T0, 1, 1)])
        self.assertEqual(len(d.timers("a")), 1)

    def test_sessions_match_the_oracle_at_every_batch_size(self):
        vs = views(1_500, 30, 11)
        max_ts = max(v[1] for v in vs)
        want = oracle(vs, max_ts - DELAY)
        self.assertTrue(len(want) > 50 and any(s[3] > 3 for s in want), "many, long sessions")
        still_open = len(oracle(vs, 2**62)) - len(want)
        self.assertGreater(still_open, 0)
        for size in (1, 7, 100, 5_000):
            d = driver()
            got = []
            for i in range(0, len(vs), size):
                result = d.run(batch(vs[i : i + size]))
                self.assertEqual((result.late, result.errors()), ([], []))
                got += [closed(o) for o in result.output_values()]
            got += [closed(o) for o in d.run(Batch()).output_values()]
            self.assertEqual(sorted(got), want, f"batch size {size}")
            timers = d.all_timers()
            self.assertEqual(len(timers), still_open, f"batch size {size}")
            for user, timer in timers:
                session = d.key_state(user, lambda s, t=timer: s.map(SESSIONS).get(int(t.name)))
                self.assertIsNotNone(session, f"timer of a session not held: {user} {timer}")
                self.assertEqual(timer.expiry_ms, session.end + GAP)
                self.assertGreater(timer.expiry_ms, d.watermark_ms)

    def test_a_timer_of_no_session_fails_the_call_and_is_gone(self):
        d = driver()
        d.key_state("a", lambda s: s.register_timer(5, "not-a-start"))
        result = d.run(Batch(watermark_ms=10))
        self.assertEqual(len(result.errors()), 1)
        self.assertIn("is not one of this plugin's", result.errors()[0][1])
        self.assertEqual(d.timers("a"), [])

    def test_bad_parameters_and_events_are_refused(self):
        with self.assertRaisesRegex(ValueError, "gap_ms"):
            KeyedDriver(Sessions, params=[("gap_ms", "0")])
        d = driver()
        result = d.run(Batch().event("a", {"user": "a", "ts": "soon", "page": "/"}))
        self.assertIn("payload is not a valid View", result.errors()[0][1])

    def test_render_state_shows_sessions_as_json(self):
        d = driver()
        self.assertEqual(d.render_state("sessions", "map-key", (5 + 2**63).to_bytes(8, "big")), "5")
        rendered = d.render_state("sessions", "map-value", b'{"start":1,"end":2,"events":2,"pages":["/"]}')
        self.assertEqual(rendered, '{"start":1,"end":2,"events":2,"pages":["/"]}')
        self.assertIsNone(d.render_state("sessions", "map-value", b"\xff"))


if __name__ == "__main__":
    unittest.main()
