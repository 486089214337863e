//! Web sessionization on the 0.2 state API: events `{"user", "ts", "page"}` keyed by
//! user, a session being the events of one user with less than the gap (30 minutes by
//! default, `--param gap_ms=N`) between one and the next in event time. Events may come
//! out of order (within the pipeline's watermark delay): an event extends the session
//! it falls into, starts a new one, or merges the two it bridges.
//!
//! State: map variable `sessions` from a session's start to the session, and one
//! event-time timer per open session, at its end plus the gap, named by its start.
//! When the watermark reaches the timer no later event can join the session (it would
//! be late), so the handler emits the session and removes it.

use std::collections::BTreeSet;

use groupstate_sdk::v2::{KeyState, KeyedFunction, MapState, Timer, Variable};
use groupstate_sdk::{Error, Event, Params, PluginInfo, export_keyed_plugin};
use serde::{Deserialize, Serialize};

/// The default gap that closes a session: 30 minutes.
const GAP_MS_DEFAULT: i64 = 30 * 60 * 1000;

/// The plugin: the gap, from the parameters.
pub struct Sessions {
    gap_ms: i64,
}

/// One page view.
#[derive(Deserialize)]
pub struct View {
    /// Event time, epoch milliseconds (also the pipeline's time field).
    pub ts: i64,
    /// The page.
    pub page: String,
}

/// An open session.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Session {
    /// Its first and last event times.
    pub start: i64,
    /// See `start`.
    pub end: i64,
    /// Its events.
    pub events: u64,
    /// The pages it visited.
    pub pages: BTreeSet<String>,
}

/// A closed session.
#[derive(Serialize)]
pub struct Closed {
    /// The user.
    pub user: String,
    /// First event time.
    pub start: i64,
    /// Last event time.
    pub end: i64,
    /// Events in the session.
    pub events: u64,
    /// Distinct pages.
    pub pages: usize,
}

const SESSIONS: &str = "sessions";

impl Sessions {
    fn timer_name(start: i64) -> String {
        start.to_string()
    }

    fn close_timer(&self, session: &Session) -> i64 {
        session.end.saturating_add(self.gap_ms)
    }

    /// Adds one view to the user's sessions: the sessions it falls within the gap of
    /// are merged with it into one.
    fn add(&self, map: &MapState<'_, i64, Session>, state: &KeyState<'_>, view: View) -> Result<(), Error> {
        let mut merged = Session { start: view.ts, end: view.ts, events: 1, pages: BTreeSet::from([view.page]) };
        // The sessions within the gap of the view, and then of what they merged into
        // (a view that bridges two sessions), join it.
        loop {
            let near: Vec<(i64, Session)> = map
                .entries()?
                .into_iter()
                .filter(|(_, s)| s.start < merged.end + self.gap_ms && s.end > merged.start - self.gap_ms)
                .collect();
            if near.is_empty() {
                break;
            }
            for (start, session) in near {
                map.remove(&start)?;
                state.delete_timer(self.close_timer(&session), Some(&Self::timer_name(start)))?;
                merged.start = merged.start.min(session.start);
                merged.end = merged.end.max(session.end);
                merged.events += session.events;
                merged.pages.extend(session.pages);
            }
        }
        map.put(&merged.start, &merged)?;
        state.register_timer(self.close_timer(&merged), Some(&Self::timer_name(merged.start)))
    }
}

impl KeyedFunction for Sessions {
    type Key = String;
    type Event = View;
    type Output = Closed;

    fn info() -> PluginInfo {
        PluginInfo { name: "sessions", version: env!("CARGO_PKG_VERSION"), state_schema_version: 1 }
    }

    fn variables() -> Vec<Variable> {
        vec![Variable::map(SESSIONS)]
    }

    fn init(params: &Params) -> Result<Self, Error> {
        params.reject_unknown(&["gap_ms"])?;
        let gap_ms = params.get_or("gap_ms", GAP_MS_DEFAULT)?;
        if gap_ms <= 0 {
            return Err(Error::msg(format_args!("gap_ms must be greater than zero, not {gap_ms}")));
        }
        Ok(Sessions { gap_ms })
    }

    fn process(
        &mut self,
        _user: &String,
        events: Vec<Event<View>>,
        state: &KeyState<'_>,
    ) -> Result<Vec<Closed>, Error> {
        let map = state.map::<i64, Session>(SESSIONS);
        for event in events {
            self.add(&map, state, event.value)?;
        }
        Ok(vec![])
    }

    fn handle_expired_timer(
        &mut self,
        user: &String,
        timer: Timer,
        state: &KeyState<'_>,
    ) -> Result<Vec<Closed>, Error> {
        let Some(start) = timer.name.as_deref().and_then(|n| n.parse::<i64>().ok()) else {
            return Err(Error::msg(format_args!(
                "timer {timer:?} is not one of this plugin's (named by a session start)"
            )));
        };
        let map = state.map::<i64, Session>(SESSIONS);
        let Some(session) = map.get(&start)? else {
            return Ok(vec![]);
        };
        map.remove(&start)?;
        Ok(vec![Closed {
            user: user.clone(),
            start: session.start,
            end: session.end,
            events: session.events,
            pages: session.pages.len(),
        }])
    }
}

export_keyed_plugin!(Sessions);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use groupstate_sdk::testing::{Batch, KeyedDriver};
    use groupstate_sdk::v2::TimeMode;

    use super::*;

    const GAP: i64 = GAP_MS_DEFAULT;
    const DELAY: i64 = 10 * 60 * 1000;

    fn view(user: &str, ts: i64, page: &str) -> (String, i64, String) {
        (user.to_owned(), ts, page.to_owned())
    }

    fn driver() -> KeyedDriver<Sessions> {
        KeyedDriver::<Sessions>::new(&[], TimeMode::EventTime).expect("init").with_watermark_delay_ms(DELAY)
    }

    fn batch(views: &[(String, i64, String)]) -> Batch {
        views.iter().fold(Batch::new(), |b, (user, ts, page)| {
            b.event_at(user, *ts, &format!(r#"{{"user":"{user}","ts":{ts},"page":"{page}"}}"#))
        })
    }

    /// (user, start, end, events, pages) of a closed-session output.
    fn closed(output: &serde_json::Value) -> (String, i64, i64, u64, u64) {
        let int = |f: &str| output[f].as_i64().unwrap_or_else(|| panic!("{f} in {output}"));
        (
            output["user"].as_str().unwrap_or_default().to_owned(),
            int("start"),
            int("end"),
            int("events") as u64,
            int("pages") as u64,
        )
    }

    /// The plugin's rule, plainly: per user, the views in time order, cut where two
    /// are `GAP` or more apart; a session is closed once the watermark reaches its end
    /// plus `GAP`.
    fn oracle(views: &[(String, i64, String)], watermark_ms: i64) -> Vec<(String, i64, i64, u64, u64)> {
        let mut by_user: BTreeMap<&str, Vec<(i64, &str)>> = BTreeMap::new();
        for (user, ts, page) in views {
            by_user.entry(user).or_default().push((*ts, page));
        }
        let mut out = Vec::new();
        for (user, mut views) in by_user {
            views.sort();
            let mut start = 0;
            for i in 1..=views.len() {
                if i == views.len() || views[i].0 - views[i - 1].0 >= GAP {
                    let s = &views[start..i];
                    let end = s[s.len() - 1].0;
                    if end + GAP <= watermark_ms {
                        let pages: BTreeSet<&str> = s.iter().map(|v| v.1).collect();
                        out.push((user.to_owned(), s[0].0, end, s.len() as u64, pages.len() as u64));
                    }
                    start = i;
                }
            }
        }
        out.sort();
        out
    }

    /// `n` views of `users` users, time moving on by up to 3 minutes a view, each up to
    /// half the watermark delay earlier (out of order, never late).
    fn views(n: usize, users: u64, seed: u64) -> Vec<(String, i64, String)> {
        let mut state = seed;
        let mut next = move |m: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        let mut t = 1_700_000_000_000i64;
        (0..n)
            .map(|_| {
                t += next(180_000) as i64;
                let ts = t - next(DELAY as u64 / 2) as i64;
                (format!("u{}", next(users)), ts, format!("/p{}", next(5)))
            })
            .collect()
    }

    #[test]
    fn a_session_closes_when_the_watermark_passes_its_end_plus_the_gap() {
        let mut d = driver();
        let t0 = 1_000_000_000;
        let first = d.run(batch(&[view("a", t0, "/x"), view("a", t0 + 60_000, "/y"), view("b", t0, "/x")]));
        assert!(first.outputs().is_empty());
        assert_eq!(d.timers("a"), [Timer { expiry_ms: t0 + 60_000 + GAP, name: Some(t0.to_string()) }]);
        let open = d.key_state("a", |s| s.map::<i64, Session>(SESSIONS).keys()).unwrap();
        assert_eq!(open, [t0]);
        // A batch's watermark comes from the batches before it: c's view moves it to
        // a's timer (t0 + 60 s + GAP) for the batch after.
        let second = d.run(batch(&[view("c", t0 + 60_000 + GAP + DELAY, "/z")]));
        assert!(second.outputs().is_empty());
        let third = d.run(Batch::new());
        assert_eq!(third.watermark_ms, t0 + 60_000 + GAP);
        assert_eq!(
            third.output_values().iter().map(closed).collect::<Vec<_>>(),
            [("b".into(), t0, t0, 1, 1), ("a".into(), t0, t0 + 60_000, 2, 2)],
            "b's timer expires first"
        );
        assert_eq!(d.keys(), ["c"], "closed sessions leave nothing behind");
    }

    #[test]
    fn an_out_of_order_view_merges_the_two_sessions_it_bridges() {
        let mut d = driver();
        let t0 = 1_000_000_000;
        d.run(batch(&[view("a", t0, "/x"), view("a", t0 + GAP + 1_000, "/y")]));
        assert_eq!(d.timers("a").len(), 2, "two sessions, a timer each");
        // Not late: the watermark is t0 + GAP + 1 s - DELAY.
        d.run(batch(&[view("a", t0 + GAP - 5 * 60_000, "/z")]));
        assert_eq!(d.timers("a"), [Timer { expiry_ms: t0 + 2 * GAP + 1_000, name: Some(t0.to_string()) }]);
        let done = d.run(Batch::new().watermark_ms(t0 + 2 * GAP + 1_000));
        assert_eq!(
            done.output_values().iter().map(closed).collect::<Vec<_>>(),
            [("a".into(), t0, t0 + GAP + 1_000, 3, 3)]
        );
    }

    #[test]
    fn a_key_gets_its_data_call_and_then_its_timer_call_in_one_batch() {
        let mut d = driver();
        let t0 = 1_000_000_000;
        d.run(batch(&[view("a", t0, "/x")]));
        // A view far later: the data call opens a second session; the old one's timer,
        // reached by this batch's watermark, fires after it.
        d.run(batch(&[view("b", t0 + GAP + DELAY, "/x")]));
        let both = d.run(batch(&[view("a", t0 + GAP + DELAY, "/y")]));
        let calls: Vec<(&str, bool)> = both.calls.iter().map(|c| (c.key.as_str(), c.timer.is_some())).collect();
        assert_eq!(calls, [("a", false), ("a", true)]);
        assert_eq!(both.output_values().iter().map(closed).collect::<Vec<_>>(), [("a".into(), t0, t0, 1, 1)]);
        assert_eq!(d.timers("a").len(), 1, "the new session's timer");
    }

    #[test]
    fn sessions_match_the_oracle_at_every_batch_size() {
        let views = views(3_000, 40, 11);
        let max_ts = views.iter().map(|v| v.1).max().unwrap_or(0);
        let want = oracle(&views, max_ts - DELAY);
        assert!(want.len() > 100 && want.iter().any(|s| s.3 > 3), "a workload with many, long sessions");
        let open = oracle(&views, i64::MAX).len() - want.len();
        assert!(open > 0, "some sessions stay open");
        for size in [1, 7, 100, 5_000] {
            let mut d = driver();
            let mut got = Vec::new();
            for chunk in views.chunks(size) {
                let result = d.run(batch(chunk));
                assert!(result.late.is_empty() && result.errors().is_empty(), "{:?}", result.errors());
                got.extend(result.output_values().iter().map(closed));
            }
            // The host's last batch at the end of the input fires what the final watermark reached.
            got.extend(d.run(Batch::new()).output_values().iter().map(closed));
            got.sort();
            assert_eq!(got, want, "batch size {size}");
            // One map entry and one timer per open session, the timer named by its start.
            let timers = d.all_timers();
            assert_eq!(timers.len(), open, "batch size {size}");
            for (user, timer) in timers {
                let start: i64 = timer.name.as_deref().unwrap_or_default().parse().unwrap();
                let session = d.key_state(&user, |s| s.map::<i64, Session>(SESSIONS).get(&start)).unwrap();
                let session = session.unwrap_or_else(|| panic!("timer of a session not held: {user} {start}"));
                assert_eq!(timer.expiry_ms, session.end + GAP);
                assert!(timer.expiry_ms > d.watermark_ms(), "an expired timer was left");
            }
        }
    }

    #[test]
    fn a_timer_of_no_session_fails_the_call_and_is_gone() {
        let mut d = driver();
        d.key_state("a", |s| s.register_timer(5, Some("not-a-start"))).unwrap();
        let result = d.run(Batch::new().watermark_ms(10));
        assert_eq!(result.errors().len(), 1, "{:?}", result.calls);
        assert!(result.errors()[0].1.contains("is not one of this plugin's"), "{:?}", result.errors());
        assert!(d.timers("a").is_empty());
    }
}
