//! The metrics the admin endpoint serves at `GET /metrics`: a registry of counters and
//! gauges per partition that the batch loop's caller updates from each
//! [`BatchReport`], and their rendering in Prometheus's text exposition format 0.0.4.
//! It owns the metric names and their help texts; it knows nothing of HTTP, and the
//! pipeline knows nothing of it.
//!
//! Every series of a partition's batch loop carries a `partition` label: `"0"` for the
//! one input of a pipeline today; a pipeline over Kafka will label each partition's
//! series with the partition's number.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use crate::pipeline::{BatchReport, StageTimes};
use crate::store::Counters;

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The registry: one [`PartitionMetrics`] per batch loop, and what the loops share.
#[derive(Debug, Default)]
pub struct Metrics {
    /// In partition order.
    partitions: Mutex<Vec<Arc<PartitionMetrics>>>,
}

/// The metrics of one partition's batch loop. Its values sit behind one mutex, taken
/// once per batch by the loop and once per scrape by the endpoint, so that a scrape
/// sees every value of the same batch.
#[derive(Debug)]
pub struct PartitionMetrics {
    partition: u32,
    values: Mutex<PartitionValues>,
}

#[derive(Debug, Clone, Default)]
struct PartitionValues {
    batches: u64,
    /// The sums of the batches' own counts.
    counters: Counters,
    dead_letters: u64,
    stages: StageTimes,
    last: Option<LastBatch>,
    /// Absent until a count of the store is given ([`PartitionMetrics::set_stored`]):
    /// the batches only report how they change it.
    keys: Option<i64>,
    timers: Option<i64>,
    watermark_ms: Option<i64>,
    /// A Kafka partition's lag after its last batch.
    lag: Option<u64>,
    /// Restoring from the changelog: records read, and whether it is under way.
    restore: Option<(u64, bool)>,
    /// Plugin swaps of the partition's batch loop, rollbacks included.
    plugin_swaps: u64,
}

#[derive(Debug, Clone, Copy)]
struct LastBatch {
    id: u64,
    duration_ns: u64,
    stages: StageTimes,
}

impl Metrics {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The metrics of `partition`, registered on first use; its counters are served
    /// (at zero) from then on.
    pub fn partition(&self, partition: u32) -> Arc<PartitionMetrics> {
        let mut partitions = self.partitions.lock().unwrap_or_else(PoisonError::into_inner);
        match partitions.binary_search_by_key(&partition, |p| p.partition) {
            Ok(i) => partitions[i].clone(),
            Err(i) => {
                let metrics = Arc::new(PartitionMetrics { partition, values: Mutex::default() });
                partitions.insert(i, metrics.clone());
                metrics
            }
        }
    }

    /// Every metric in Prometheus's text format 0.0.4, with `# HELP` and `# TYPE`
    /// lines; a family with no value yet is left out.
    pub fn render(&self) -> String {
        let partitions: Vec<(String, PartitionValues)> = {
            let partitions = self.partitions.lock().unwrap_or_else(PoisonError::into_inner);
            partitions.iter().map(|p| (p.partition.to_string(), p.values())).collect()
        };
        let mut out = Rendering { out: String::new(), partitions };
        out.per_partition("groupstate_batches_total", COUNTER, "Batches committed by this process.", |v| {
            Some(v.batches.to_string())
        });
        out.per_partition(
            "groupstate_input_records_total",
            COUNTER,
            "Input records read: those that went to the plugin, late ones and undecodable ones.",
            |v| Some(v.counters.records.to_string()),
        );
        out.per_partition("groupstate_events_total", COUNTER, "Input records that went to the plugin.", |v| {
            Some(v.counters.events.to_string())
        });
        out.per_partition(
            "groupstate_outputs_total",
            COUNTER,
            "Outputs the plugin returned, written to the output.",
            |v| Some(v.counters.outputs.to_string()),
        );
        out.per_partition(
            "groupstate_late_records_total",
            COUNTER,
            "Input records behind the watermark, written to the late output.",
            |v| Some(v.counters.late.to_string()),
        );
        out.per_partition(
            "groupstate_dead_letters_total",
            COUNTER,
            "Entries written to the dead-letter output: undecodable records, records too far ahead in event time, failed calls under --on-error dead-letter.",
            |v| Some(v.dead_letters.to_string()),
        );
        out.labelled(
            "groupstate_plugin_calls_total",
            COUNTER,
            "Plugin calls, by kind: with data, or for an expired timeout.",
            |v| {
                vec![
                    ("kind", "data", v.counters.data_calls.to_string()),
                    ("kind", "timeout", v.counters.timeout_calls.to_string()),
                ]
            },
        );
        out.per_partition(
            "groupstate_failed_calls_total",
            COUNTER,
            "Plugin calls that failed and were skipped or dead-lettered.",
            |v| Some(v.counters.failed_calls.to_string()),
        );
        out.labelled(
            "groupstate_stage_seconds_total",
            COUNTER,
            "Time the batches spent in each stage (read_decode runs on the input thread, a batch ahead, overlapping the others).",
            |v| stage_samples(&v.stages),
        );
        out.per_partition("groupstate_last_batch_id", GAUGE, "The id of the last committed batch.", |v| {
            v.last.map(|l| l.id.to_string())
        });
        out.per_partition(
            "groupstate_last_batch_duration_seconds",
            GAUGE,
            "Time of the last committed batch, from its boundary to its commit.",
            |v| v.last.map(|l| seconds_of_ns(l.duration_ns)),
        );
        out.labelled(
            "groupstate_last_batch_stage_seconds",
            GAUGE,
            "Time the last committed batch spent in each stage.",
            |v| v.last.map(|l| stage_samples(&l.stages)).unwrap_or_default(),
        );
        out.per_partition("groupstate_keys", GAUGE, "Keys in the store: with a value, a timeout, or both.", |v| {
            v.keys.map(|k| k.to_string())
        });
        out.per_partition("groupstate_timers", GAUGE, "Keys with a timeout pending.", |v| {
            v.timers.map(|t| t.to_string())
        });
        out.per_partition(
            "groupstate_watermark_seconds",
            GAUGE,
            "The watermark the last committed batch ran with, in seconds since the epoch.",
            |v| v.watermark_ms.map(seconds_of_ms),
        );
        out.per_partition(
            "groupstate_input_lag_records",
            GAUGE,
            "A Kafka partition's records after its last committed batch, from the high watermark its consumer last fetched.",
            |v| v.lag.map(|l| l.to_string()),
        );
        out.per_partition(
            "groupstate_restore_records_total",
            COUNTER,
            "Changelog records read to restore the partition's store when it started here.",
            |v| v.restore.map(|(records, _)| records.to_string()),
        );
        out.per_partition(
            "groupstate_restoring",
            GAUGE,
            "1 while the partition's store is being restored from the changelog, 0 after.",
            |v| v.restore.map(|(_, on)| u8::from(on).to_string()),
        );
        out.per_partition(
            "groupstate_plugin_swaps_total",
            COUNTER,
            "Plugin swaps at a batch boundary, rollbacks included.",
            |v| Some(v.plugin_swaps.to_string()),
        );
        out.out
    }
}

impl PartitionMetrics {
    fn values(&self) -> PartitionValues {
        self.values.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Adds a committed batch.
    pub fn record_batch(&self, report: &BatchReport) {
        let mut v = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        v.batches += 1;
        v.counters.add(&report.counters);
        v.dead_letters += report.dead_letters;
        v.stages.add(&report.stages);
        v.last = Some(LastBatch { id: report.batch_id, duration_ns: report.duration_ns, stages: report.stages });
        if let Some(keys) = &mut v.keys {
            *keys += report.keys_delta;
        }
        if let Some(timers) = &mut v.timers {
            *timers += report.timers_delta;
        }
        if report.input_lag.is_some() {
            v.lag = report.input_lag;
        }
        // No event time yet leaves the watermark at its lowest value: there is none.
        v.watermark_ms = (report.watermark_ms != i64::MIN).then_some(report.watermark_ms);
        v.plugin_swaps = report.plugin_swaps;
    }

    /// Sets how far restoring the partition from the changelog has come: changelog
    /// records read, and whether it is still under way.
    pub fn set_restore(&self, records: u64, restoring: bool) {
        self.values.lock().unwrap_or_else(PoisonError::into_inner).restore = Some((records, restoring));
    }

    /// Sets the keys in the store and the timers pending, as counted before the
    /// batches whose reports follow; the reports then move them.
    pub fn set_stored(&self, keys: u64, timers: u64) {
        let mut v = self.values.lock().unwrap_or_else(PoisonError::into_inner);
        v.keys = Some(i64::try_from(keys).unwrap_or(i64::MAX));
        v.timers = Some(i64::try_from(timers).unwrap_or(i64::MAX));
    }
}

const COUNTER: &str = "counter";
const GAUGE: &str = "gauge";

/// The stages' label values, in the order of [`StageTimes`]'s fields.
const STAGES: [&str; 5] = ["read_decode", "input_wait", "state_load", "plugin", "commit"];

/// The text being rendered, and the partitions' values it renders.
struct Rendering {
    out: String,
    partitions: Vec<(String, PartitionValues)>,
}

impl Rendering {
    /// A family with one series per partition, from `value`.
    fn per_partition(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        value: impl Fn(&PartitionValues) -> Option<String>,
    ) {
        let samples: Vec<(String, String)> =
            self.partitions.iter().filter_map(|(p, v)| Some((format!("partition=\"{p}\""), value(v)?))).collect();
        self.family(name, kind, help, &samples);
    }

    /// A family with one series per partition and value of another label, from
    /// `values`: (label, label value, value).
    fn labelled(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        values: impl Fn(&PartitionValues) -> Vec<(&'static str, &'static str, String)>,
    ) {
        let samples: Vec<(String, String)> = self
            .partitions
            .iter()
            .flat_map(|(p, v)| {
                values(v)
                    .into_iter()
                    .map(move |(label, of, value)| (format!("partition=\"{p}\",{label}=\"{of}\""), value))
            })
            .collect();
        self.family(name, kind, help, &samples);
    }

    /// Writes a family: its `# HELP` and `# TYPE` lines and its samples, each a set of
    /// labels (empty for none) and a value; nothing when it has no sample.
    fn family(&mut self, name: &str, kind: &str, help: &str, samples: &[(String, String)]) {
        if samples.is_empty() {
            return;
        }
        // Writing to a String cannot fail.
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = if labels.is_empty() {
                writeln!(self.out, "{name} {value}")
            } else {
                writeln!(self.out, "{name}{{{labels}}} {value}")
            };
        }
    }
}

fn stage_samples(stages: &StageTimes) -> Vec<(&'static str, &'static str, String)> {
    let ns = [stages.read_decode_ns, stages.input_wait_ns, stages.state_load_ns, stages.plugin_ns, stages.commit_ns];
    STAGES.iter().zip(ns).map(|(stage, ns)| ("stage", *stage, seconds_of_ns(ns))).collect()
}

/// Nanoseconds as seconds, exactly (no float rounding): `1500000` is `0.001500000`.
fn seconds_of_ns(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

/// Milliseconds (possibly before the epoch) as seconds, exactly: `-1500` is `-1.500`.
fn seconds_of_ms(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let abs = ms.unsigned_abs();
    format!("{sign}{}.{:03}", abs / 1000, abs % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(batch_id: u64, records: u64, outputs: u64) -> BatchReport {
        BatchReport {
            batch_id,
            records,
            watermark_ms: 1_700_000_000_123,
            counters: Counters { records, events: records - 1, late: 1, outputs, data_calls: 2, ..Counters::default() },
            dead_letters: 3,
            keys_delta: 2,
            timers_delta: -1,
            stages: StageTimes { plugin_ns: 1_500_000, commit_ns: 2_000_000_000, ..StageTimes::default() },
            duration_ns: 2_250_000_000,
            ..BatchReport::default()
        }
    }

    /// Pairs of text: (series, value) or (family, type).
    type Pairs = Vec<(String, String)>;

    /// The samples of a rendering, `name{labels}` to value, and every family's TYPE.
    fn parse(text: &str) -> (Pairs, Pairs) {
        let (mut samples, mut types) = (Vec::new(), Vec::new());
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                types.push((name.to_owned(), kind.to_owned()));
            } else if !line.starts_with("# HELP ") {
                let (series, value) = line.rsplit_once(' ').unwrap();
                samples.push((series.to_owned(), value.to_owned()));
            }
        }
        (samples, types)
    }

    fn value<'a>(samples: &'a [(String, String)], series: &str) -> Option<&'a str> {
        samples.iter().find(|(s, _)| s == series).map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_partition_shows_zero_counters_before_its_first_batch_and_no_last_batch() {
        let metrics = Metrics::new();
        metrics.partition(0);
        let (samples, _) = parse(&metrics.render());
        assert_eq!(value(&samples, "groupstate_batches_total{partition=\"0\"}"), Some("0"));
        assert_eq!(value(&samples, "groupstate_plugin_swaps_total{partition=\"0\"}"), Some("0"));
        assert!(samples.iter().all(|(s, _)| !s.starts_with("groupstate_last_batch")), "{samples:?}");
        assert!(samples.iter().all(|(s, _)| !s.starts_with("groupstate_keys")), "no count of the store was given");
    }

    #[test]
    fn batches_add_up_and_the_last_one_is_shown_exactly() {
        let metrics = Metrics::new();
        let p0 = metrics.partition(0);
        p0.set_stored(10, 4);
        p0.record_batch(&report(7, 100, 5));
        p0.record_batch(&BatchReport { plugin_swaps: 2, ..report(8, 50, 6) });
        let text = metrics.render();
        let (samples, types) = parse(&text);
        let p = |name: &str| value(&samples, &format!("{name}{{partition=\"0\"}}")).map(str::to_owned);
        assert_eq!(p("groupstate_batches_total").as_deref(), Some("2"));
        assert_eq!(p("groupstate_input_records_total").as_deref(), Some("150"));
        assert_eq!(p("groupstate_events_total").as_deref(), Some("148"));
        assert_eq!(p("groupstate_outputs_total").as_deref(), Some("11"));
        assert_eq!(p("groupstate_late_records_total").as_deref(), Some("2"));
        assert_eq!(p("groupstate_dead_letters_total").as_deref(), Some("6"));
        assert_eq!(p("groupstate_last_batch_id").as_deref(), Some("8"));
        assert_eq!(p("groupstate_last_batch_duration_seconds").as_deref(), Some("2.250000000"));
        assert_eq!(p("groupstate_keys").as_deref(), Some("14"));
        assert_eq!(p("groupstate_timers").as_deref(), Some("2"));
        assert_eq!(p("groupstate_watermark_seconds").as_deref(), Some("1700000000.123"));
        let stage = |name: &str, stage: &str| value(&samples, &format!("{name}{{partition=\"0\",stage=\"{stage}\"}}"));
        assert_eq!(stage("groupstate_last_batch_stage_seconds", "plugin"), Some("0.001500000"));
        assert_eq!(stage("groupstate_stage_seconds_total", "commit"), Some("4.000000000"));
        assert_eq!(stage("groupstate_stage_seconds_total", "read_decode"), Some("0.000000000"));
        let calls = value(&samples, "groupstate_plugin_calls_total{partition=\"0\",kind=\"data\"}");
        assert_eq!(calls, Some("4"));
        assert_eq!(p("groupstate_plugin_swaps_total").as_deref(), Some("2"));

        // Every family is typed once, counters end in _total, and each sample follows
        // its family's HELP and TYPE lines.
        for (name, kind) in &types {
            assert_eq!(types.iter().filter(|(n, _)| n == name).count(), 1, "{name} typed twice");
            assert_eq!(name.ends_with("_total"), kind == "counter", "{name} is a {kind}");
            let help = text.find(&format!("# HELP {name} ")).unwrap();
            let typed = text.find(&format!("# TYPE {name} ")).unwrap();
            let first = text.find(&format!("\n{name}")).unwrap();
            assert!(help < typed && typed < first, "{name}: HELP, TYPE, then samples");
        }
        for (series, value) in &samples {
            let name = series.split('{').next().unwrap();
            assert!(types.iter().any(|(n, _)| n == name), "{series} has no TYPE");
            assert!(value.parse::<f64>().is_ok(), "{series} {value}");
        }
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn partitions_are_labelled_and_kept_apart_in_order() {
        let metrics = Metrics::new();
        metrics.partition(3).record_batch(&report(1, 30, 0));
        metrics.partition(1).record_batch(&report(1, 10, 0));
        assert!(Arc::ptr_eq(&metrics.partition(3), &metrics.partition(3)));
        let text = metrics.render();
        let (samples, _) = parse(&text);
        assert_eq!(value(&samples, "groupstate_input_records_total{partition=\"1\"}"), Some("10"));
        assert_eq!(value(&samples, "groupstate_input_records_total{partition=\"3\"}"), Some("30"));
        let one = text.find("groupstate_batches_total{partition=\"1\"}").unwrap();
        let three = text.find("groupstate_batches_total{partition=\"3\"}").unwrap();
        assert!(one < three);
    }

    #[test]
    fn times_are_rendered_exactly() {
        assert_eq!(seconds_of_ns(0), "0.000000000");
        assert_eq!(seconds_of_ns(12_345_678_901), "12.345678901");
        assert_eq!(seconds_of_ms(-1500), "-1.500");
        assert_eq!(seconds_of_ms(999), "0.999");
        assert_eq!(seconds_of_ms(i64::MIN + 1), "-9223372036854775.807");
    }
}
