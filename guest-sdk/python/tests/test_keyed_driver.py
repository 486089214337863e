"""The 0.2 layer and its driver against the host's rules, in plain Python:

    cd guest-sdk/python && python3 -m unittest discover -s tests
"""

import itertools
import json
import unittest

from groupstate_sdk import JsonCodec, PluginError
from groupstate_sdk.testing import Batch, KeyedDriver
from groupstate_sdk.v2 import (
    IntKey,
    KeyedFunction,
    StrKey,
    Timer,
    TooManyEntries,
    TooManyTimers,
    Ttl,
    U64Key,
    UnknownVariable,
    Variable,
    export,
)

INSTANCES = itertools.count()


class Probe(KeyedFunction):
    """Does what each event says: {"register": [expiry, name]}, {"delete": [expiry, name]},
    {"note": text} (appends to list `notes`), {"fail": true}. A timer call emits
    "key expiry name"; a timer named `rearm` registers one 10 ms later, `sweep` deletes
    the key's other timers, `fail` notes and fails."""

    name = "probe"
    variables = [Variable.list("notes"), Variable.value("v"), Variable.map("m", key=IntKey())]

    def __init__(self) -> None:
        self.instance = next(INSTANCES)

    def process(self, key, events, state):
        for event in events:
            ops = event.value
            if "register" in ops:
                state.register_timer(*ops["register"])
            if "delete" in ops:
                state.delete_timer(*ops["delete"])
            if "note" in ops:
                state.list("notes").append(ops["note"])
            if "fail" in ops:
                raise PluginError("asked to fail")
        return [f"instance {self.instance}"]

    def handle_expired_timer(self, key, timer, state):
        if timer.name == "rearm":
            state.register_timer(timer.expiry_ms + 10, "rearm")
        elif timer.name == "sweep":
            for t in state.timers():
                state.delete_timer(t.expiry_ms, t.name)
        elif timer.name == "fail":
            state.list("notes").append("from the failed call")
            raise PluginError("timer failed")
        return [f"{key} {timer.expiry_ms} {timer.name or ''}"]


def register(key, at, name):
    return Batch().event(key, {"register": [at, name]})


def timer_outputs(result):
    return [json.loads(o) for c in result.calls if c.timer is not None and c.outputs for o in c.outputs]


class DriverTest(unittest.TestCase):
    def test_timers_fire_after_the_data_calls_at_or_below_the_threshold_in_order_once(self):
        d = KeyedDriver(Probe)
        for key, at, name in [("b", 20, "x"), ("a", 20, "y"), ("a", 20, "x"), ("a", 10, "z"), ("c", 21, "x")]:
            d.run(register(key, at, name))
        r = d.run(Batch(watermark_ms=20).event("z", {}))
        self.assertEqual((r.calls[0].key, r.calls[0].timer), ("z", None), "data calls first")
        self.assertEqual(timer_outputs(r), ["a 10 z", "a 20 x", "a 20 y", "b 20 x"])
        self.assertEqual(timer_outputs(d.run(Batch())), [], "each fires once")
        self.assertEqual(d.all_timers(), [("c", Timer(21, "x"))])

    def test_a_timer_registered_or_deleted_in_a_batch_does_not_fire_in_it(self):
        d = KeyedDriver(Probe)
        d.run(register("a", 5, "old"))
        r = d.run(Batch(watermark_ms=100).event("a", {"register": [5, "new"]}).event("a", {"delete": [5, "old"]}))
        self.assertEqual(timer_outputs(r), [])
        self.assertEqual(timer_outputs(d.run(Batch())), ["a 5 new"])
        d.run(register("k", 150, "sweep").event("k", {"register": [160, "later"]}))
        self.assertEqual(timer_outputs(d.run(Batch(watermark_ms=200))), ["k 150 sweep"])
        d.run(register("r", 300, "rearm"))
        self.assertEqual(timer_outputs(d.run(Batch(watermark_ms=400))), ["r 300 rearm"])
        self.assertEqual(timer_outputs(d.run(Batch())), ["r 310 rearm"])

    def test_a_failed_call_changes_nothing_but_its_timer_is_gone_and_the_instance_is_fresh(self):
        d = KeyedDriver(Probe)
        first = d.run(register("a", 5, "fail").event("a", {"note": "kept"}))
        failed = d.run(Batch().event("a", {"note": "lost"}).event("a", {"fail": True}))
        self.assertEqual(failed.errors(), [("a", "asked to fail")])
        notes = lambda: d.key_state("a", lambda s: s.list("notes").get())  # noqa: E731
        self.assertEqual(notes(), ["kept"])
        after = d.run(Batch(watermark_ms=5).event("b", {}))
        self.assertNotEqual(after.outputs()[0], first.outputs()[0], "a fresh instance after the failure")
        self.assertEqual(after.errors(), [("a", "timer failed")])
        self.assertEqual(notes(), ["kept"])
        self.assertEqual(d.timers("a"), [])

    def test_requests_are_refused_as_the_host_refuses_them(self):
        d = KeyedDriver(Probe, time_mode="none")
        self.assertIn("the pipeline has no timers", d.run(register("a", 5, "x")).errors()[0][1])
        d = KeyedDriver(Probe, time_mode="processing-time", timers_per_key_max=2, state_writes_per_call_max=3)
        r = d.run(register("a", 5, "x").event("a", {"register": [6, "y"]}).event("a", {"register": [7, "z"]}))
        self.assertIn("timers_per_key_max (2)", r.errors()[0][1])
        self.assertEqual(d.timers("a"), [])
        # Three appends are three elements and the list's length: four entries.
        r = d.run(Batch().event("a", {"note": 1}).event("a", {"note": 2}).event("a", {"note": 3}))
        self.assertIn("state_writes_per_call_max (3)", r.errors()[0][1])
        with self.assertRaises(UnknownVariable):
            d.key_state("a", lambda s: s.value("nope").get())
        with self.assertRaises(UnknownVariable):
            d.key_state("a", lambda s: s.map("notes"))
        d.run(register("a", 50, "x"))
        self.assertEqual(timer_outputs(d.run(Batch(watermark_ms=100, processing_time_ms=49))), [])
        self.assertEqual(timer_outputs(d.run(Batch(processing_time_ms=50))), ["a 50 x"])
        # The typed errors carry the limit.
        d = KeyedDriver(Probe, timers_per_key_max=1, state_writes_per_call_max=1)
        d.key_state("t", lambda s: s.register_timer(1))

        def two(s):
            s.register_timer(2)

        with self.assertRaises(TooManyTimers) as caught:
            d.key_state("t", two)
        self.assertEqual(caught.exception.value, 1)

    def test_reads_over_the_write_limit_are_refused(self):
        d = KeyedDriver(Probe, state_writes_per_call_max=2)
        d.key_state("a", lambda s: [s.list("notes").append(i) for i in range(3)])
        r = d.run(Batch().event("a", {}))
        self.assertEqual(r.errors(), [])

        class Reader(Probe):
            def process(self, key, events, state):
                return state.list("notes").get()

        d2 = KeyedDriver(Reader, state_writes_per_call_max=2)
        d2.key_state("a", lambda s: [s.list("notes").append(i) for i in range(3)])
        self.assertIn("state_writes_per_call_max (2)", d2.run(Batch().event("a", {})).errors()[0][1])

        class Catcher(Probe):
            def process(self, key, events, state):
                try:
                    state.list("notes").get()
                except TooManyEntries as refused:
                    return [refused.value]
                return []

        d3 = KeyedDriver(Catcher, state_writes_per_call_max=2)
        d3.key_state("a", lambda s: [s.list("notes").append(i) for i in range(3)])
        self.assertEqual(d3.run(Batch().event("a", {})).output_values(), [2], "a typed error carrying the limit")

    def test_the_watermark_follows_the_earlier_batches_and_late_events_are_kept_apart(self):
        d = KeyedDriver(Probe, watermark_delay_ms=10)
        self.assertEqual(d.run(Batch().event_at("a", 100, {})).watermark_ms, 0)
        r = d.run(Batch().event_at("a", 89, {}).event_at("b", 90, {}).event_at("c", 50, {}))
        self.assertEqual(r.watermark_ms, 90)
        self.assertEqual([k for k, _, _ in r.late], ["a", "c"])
        self.assertEqual(len(r.calls), 1)
        self.assertEqual(d.watermark_ms, 90)
        with self.assertRaises(AssertionError):
            d.run(Batch(watermark_ms=80))

    def test_map_keys_keep_their_order_and_the_rust_bytes(self):
        self.assertEqual(IntKey().encode(-1), bytes.fromhex("7fffffffffffffff"))
        self.assertEqual(IntKey().encode(1), bytes.fromhex("8000000000000001"))
        self.assertEqual(U64Key().encode(258), bytes.fromhex("0000000000000102"))
        self.assertEqual(StrKey().encode("é"), "é".encode())
        d = KeyedDriver(Probe)
        d.key_state("a", lambda s: [s.map("m").put(k, {"k": k}) for k in (5, -3, 0, 2**40)])
        self.assertEqual(d.key_state("a", lambda s: s.map("m").keys()), [-3, 0, 5, 2**40])
        self.assertEqual(d.key_state("a", lambda s: (s.map("m").get(-3), -3 in s.map("m"), 7 in s.map("m"))), ({"k": -3}, True, False))

    def test_the_defaults_of_the_new_exports(self):
        d = KeyedDriver(Probe)
        self.assertIn("no initial-state handler", d.initial_state("a", {"x": 1}))
        self.assertEqual(d.keys(), [])
        self.assertIsNone(d.render_state("v", "value", b"1"))

    def test_the_export_declares_the_variables(self):
        world = export(Probe)()
        self.assertEqual(world.init([]), [("notes", "list", None, 1), ("v", "value", None, 1), ("m", "map", None, 1)])

        class Twice(Probe):
            variables = [Variable.value("a"), Variable.list("a")]

        with self.assertRaises(Exception) as caught:
            export(Twice)().init([])
        self.assertIn("declared twice", str(caught.exception))

        class WithTtl(Probe):
            variables = [Variable.value("a").with_ttl(Ttl.event_time(1000))]

        self.assertEqual(export(WithTtl)().init([]), [("a", "value", (1000, "event-time"), 1)])

        class Evolved(Probe):
            variables = [Variable.value("a").with_ttl(Ttl.event_time(1000)).with_schema_version(3)]

        self.assertEqual(export(Evolved)().init([]), [("a", "value", (1000, "event-time"), 3)])

        class ZeroSchema(Probe):
            variables = [Variable.value("a").with_schema_version(0)]

        with self.assertRaises(Exception) as caught:
            export(ZeroSchema)().init([])
        self.assertIn("schema_version 0", str(caught.exception))

    def test_migrate_state_refuses_by_default_and_converts_through_the_declared_codec(self):
        world = export(Probe)()
        world.init([])
        with self.assertRaises(Exception) as caught:
            world.migrate_state("v", None, 1, b"1")
        self.assertIn("converts none", str(caught.exception))

        class Widened(Probe):
            variables = [Variable.value("v").with_schema_version(2)]

            def migrate_state(self, variable, part, from_version, data):
                return self.migrate_declared(variable, data, JsonCodec(), lambda n: {"n": n, "unit": "c"})

        world = export(Widened)()
        world.init([])
        self.assertEqual(json.loads(world.migrate_state("v", None, 1, b"41")), {"n": 41, "unit": "c"})

        class ZeroTtl(Probe):
            variables = [Variable.value("a").with_ttl(Ttl.processing_time(0))]

        with self.assertRaisesRegex(ValueError, "TTL"):
            KeyedDriver(ZeroTtl)


class TtlProbe(KeyedFunction):
    """{"set": x} (value v, event-time TTL 100), {"put": [k, x]} (map m, processing-time
    TTL 50), {"append": x} (list l, event-time TTL 100); each call outputs what it sees."""

    name = "ttl-probe"
    variables = [
        Variable.value("v").with_ttl(Ttl.event_time(100)),
        Variable.map("m").with_ttl(Ttl.processing_time(50)),
        Variable.list("l").with_ttl(Ttl.event_time(100)),
    ]

    def process(self, key, events, state):
        for event in events:
            ops = event.value
            if "set" in ops:
                state.value("v").set(ops["set"])
            if "put" in ops:
                state.map("m").put(*ops["put"])
            if "append" in ops:
                state.list("l").append(ops["append"])
        return [self.seen(state)]

    def handle_expired_timer(self, key, timer, state):
        state.value("v").set("from a timer")
        return [self.seen(state)]

    @staticmethod
    def seen(state):
        return {"v": state.value("v").get(), "m": state.map("m").entries(), "l": state.list("l").get(), "len": state.list("l").len()}


class TtlTest(unittest.TestCase):
    def test_entries_expire_at_their_write_time_plus_the_ttl_each_on_its_clock(self):
        d = KeyedDriver(TtlProbe)
        r = d.run(Batch(processing_time_ms=10).event_at("a", 990, {"set": "x", "append": "e1", "put": ["k1", 1]}).event_at("a", 1000, {}))
        self.assertEqual(r.output_values()[0]["v"], "x")
        d.run(Batch(processing_time_ms=40).event_at("a", 1040, {"put": ["k2", 2], "append": "e2"}))
        seen = d.run(Batch(processing_time_ms=60, watermark_ms=1099).event("a", {})).output_values()[0]
        self.assertEqual(seen["v"], "x", "1100 is not reached yet")
        self.assertEqual(seen["m"], [["k2", 2]], "k1 expired at 60, on processing time")
        self.assertEqual((seen["l"], seen["len"]), (["e1", "e2"], 2))
        seen = d.run(Batch(watermark_ms=1100).event("a", {})).output_values()[0]
        self.assertIsNone(seen["v"], "the value expires at 1000 + 100")
        self.assertEqual((seen["l"], seen["len"]), (["e2"], 1))
        d.run(Batch(processing_time_ms=90, watermark_ms=1140))
        self.assertEqual(d.keys(), [])

    def test_a_rewrite_renews_an_entry_and_stages_its_index_entries(self):
        d = KeyedDriver(TtlProbe)
        d.run(Batch(processing_time_ms=0).event_at("a", 1000, {"put": ["k", 1]}))
        d.run(Batch(processing_time_ms=30).event_at("a", 1000, {"put": ["k", 2]}))
        self.assertEqual(d.run(Batch(processing_time_ms=60).event("a", {})).output_values()[0]["m"], [["k", 2]])
        d = KeyedDriver(TtlProbe, state_writes_per_call_max=2)
        self.assertEqual(d.run(Batch().event("a", {"put": ["k", 1]})).errors(), [])
        self.assertEqual(d.run(Batch().event("a", {"put": ["k", 2]})).errors(), [], "the same expiry: the same index entry")
        r = d.run(Batch(processing_time_ms=10).event("a", {"put": ["k", 3]}))
        self.assertIn("state_writes_per_call_max (2)", r.errors()[0][1])

    def test_a_timer_call_writes_at_the_watermark(self):
        d = KeyedDriver(TtlProbe)
        d.key_state("a", lambda s: s.register_timer(500))
        self.assertEqual(d.run(Batch(watermark_ms=600)).output_values()[0]["v"], "from a timer")
        self.assertEqual(d.run(Batch(watermark_ms=699).event("a", {})).output_values()[0]["v"], "from a timer")
        self.assertIsNone(d.run(Batch(watermark_ms=700).event("a", {})).output_values()[0]["v"])


if __name__ == "__main__":
    unittest.main()
