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
