//! Independent oracles: the workload's logic written plainly, without the host, the
//! SDK or the plugin.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// Per-sensor state of the sensor-alerts logic.
#[derive(Default)]
struct Sensor {
    consecutive_errors: u32,
    first_error_ts: i64,
    last_ts: Option<i64>,
}

/// The alerts (sensor, ts, first_ts) of WORKLOAD.md over the input file.
pub fn sensor_alerts(input: &Path) -> BTreeSet<(String, i64, i64)> {
    let text = std::fs::read_to_string(input).expect("read input");
    let mut events: Vec<(String, i64, bool)> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("input line is JSON");
            (
                v["sensor_id"].as_str().expect("sensor_id").to_owned(),
                v["ts"].as_i64().expect("ts"),
                v["status"] == "err",
            )
        })
        .collect();
    // Per sensor in ts order; a stable sort keeps arrival order for equal times.
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut sensors: HashMap<&str, Sensor> = HashMap::new();
    let mut alerts = BTreeSet::new();
    for (id, ts, err) in &events {
        let s = sensors.entry(id.as_str()).or_default();
        if s.last_ts.is_some_and(|last| ts - last > 600_000) {
            *s = Sensor::default();
        }
        s.last_ts = Some(*ts);
        if *err {
            s.consecutive_errors += 1;
            if s.consecutive_errors == 1 {
                s.first_error_ts = *ts;
            }
            if s.consecutive_errors == 3 && ts - s.first_error_ts <= 60_000 {
                alerts.insert((id.clone(), *ts, s.first_error_ts));
            }
        } else {
            s.consecutive_errors = 0;
        }
    }
    alerts
}

/// One closed session: (user, start, end, events, distinct pages).
pub type Session = (String, i64, i64, u64, usize);

/// The sessions plugin's logic, plainly: per user, the views sorted by time, cut where
/// two consecutive views are `gap_ms` or more apart; a session is closed once
/// `watermark_ms` has reached its end plus the gap.
pub fn sessions(views: &[(String, i64, String)], gap_ms: i64, watermark_ms: i64) -> Vec<Session> {
    let mut by_user: HashMap<&str, Vec<(i64, &str)>> = HashMap::new();
    for (user, ts, page) in views {
        by_user.entry(user).or_default().push((*ts, page));
    }
    let mut closed = Vec::new();
    for (user, mut views) in by_user {
        views.sort();
        let mut start = 0;
        for i in 1..=views.len() {
            if i == views.len() || views[i].0 - views[i - 1].0 >= gap_ms {
                let session = &views[start..i];
                let end = session[session.len() - 1].0;
                if end + gap_ms <= watermark_ms {
                    let pages: BTreeSet<&str> = session.iter().map(|v| v.1).collect();
                    closed.push((user.to_owned(), session[0].0, end, session.len() as u64, pages.len()));
                }
                start = i;
            }
        }
    }
    closed.sort();
    closed
}
