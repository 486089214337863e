//! The binary's log: the `tracing` subscriber that writes every event of the library
//! and of the binary to stderr, one line each, as readable text or as JSON. The
//! library only emits events; this is the one place that decides where they go.
//!
//! Text is what a person reads: `groupstate: ` and the message, with `warning: ` or
//! `error: ` before it for those levels, and a plugin's own lines as the host wrote
//! them (`plugin NAME key="K" stdout: ...`). JSON is what a log pipeline reads: one
//! object per line with `time_ms`, `level`, `target`, `message` and the fields of the
//! event and of the spans it is in (`batch` inside a batch; `partition`, once a caller
//! enters a span with it), flattened, the innermost winning.

use std::fmt;
use std::io::Write;

use groupstate::plugin::PLUGIN_OUTPUT_TARGET;
use groupstate::{Clock, SystemClock};
use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// The target of progress lines (plugin ready, batches so far, where the time went),
/// which `--quiet` leaves out.
pub const PROGRESS_TARGET: &str = "groupstate::progress";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `groupstate: ...` lines for a person.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the subscriber for the whole process: events at info and above, progress
/// lines only when not `quiet`.
pub fn install(format: LogFormat, quiet: bool) {
    let progress = if quiet { LevelFilter::WARN } else { LevelFilter::INFO };
    let filter = Targets::new().with_default(LevelFilter::INFO).with_target(PROGRESS_TARGET, progress);
    let layer = LineLayer { format, write: Box::new(write_stderr), now_ms: || SystemClock.now_ms() };
    let subscriber = tracing_subscriber::registry().with(filter).with(layer);
    // Only `main` installs one, once; should another be there already, it logs instead.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// Where a [`LineLayer`] writes a line: stderr, but for its tests.
type WriteLine = Box<dyn Fn(&[u8]) + Send + Sync>;

/// Writes each event as one line.
struct LineLayer {
    format: LogFormat,
    write: WriteLine,
    /// The time of a JSON line.
    now_ms: fn() -> i64,
}

fn write_stderr(line: &[u8]) {
    // A log that cannot be written is no reason to stop the pipeline.
    let _ = std::io::stderr().lock().write_all(line);
}

/// The fields of a span, kept in its extensions for the events inside it.
struct SpanFields(Vec<(&'static str, Value)>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for LineLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        span.extensions_mut().insert(SpanFields(fields.fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        values.record(&mut fields);
        if let Some(SpanFields(kept)) = span.extensions_mut().get_mut::<SpanFields>() {
            merge(kept, fields.fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let line = match self.format {
            LogFormat::Text => text_line(event),
            LogFormat::Json => {
                let mut fields = Vec::new();
                for span in ctx.event_scope(event).into_iter().flat_map(|scope| scope.from_root()) {
                    if let Some(SpanFields(of_span)) = span.extensions().get::<SpanFields>() {
                        merge(&mut fields, of_span.clone());
                    }
                }
                json_line(event, fields, (self.now_ms)())
            }
        };
        (self.write)(line.as_bytes());
    }
}

/// An event's message and its other fields.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    fields: Vec<(&'static str, Value)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = Some(text);
        } else {
            self.fields.push((field.name(), Value::String(text)));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_owned());
        } else {
            self.fields.push((field.name(), Value::from(value)));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.push((field.name(), Value::from(value)));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.push((field.name(), Value::from(value)));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.push((field.name(), Value::from(value)));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.fields.push((field.name(), Value::from(value)));
    }
}

/// Sets `new`'s fields in `kept`, replacing those of the same name.
fn merge(kept: &mut Vec<(&'static str, Value)>, new: Vec<(&'static str, Value)>) {
    for (name, value) in new {
        match kept.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => kept.push((name, value)),
        }
    }
}

/// `groupstate: [warning: |error: ]MESSAGE`, or a plugin's line as it is (it carries
/// its own prefix, and the plugin module escaped and clipped it).
fn text_line(event: &Event<'_>) -> String {
    let mut fields = Fields::default();
    event.record(&mut fields);
    let message = fields.message.unwrap_or_default();
    if event.metadata().target() == PLUGIN_OUTPUT_TARGET {
        return format!("{message}\n");
    }
    let level = match *event.metadata().level() {
        Level::ERROR => "error: ",
        Level::WARN => "warning: ",
        Level::INFO => "",
        Level::DEBUG => "debug: ",
        Level::TRACE => "trace: ",
    };
    format!("groupstate: {level}{message}\n")
}

/// One JSON object: time, level, target and message, and the spans' fields and the
/// event's own (an event's field overrides a span's of the same name).
fn json_line(event: &Event<'_>, mut fields: Vec<(&'static str, Value)>, time_ms: i64) -> String {
    let mut own = Fields::default();
    event.record(&mut own);
    merge(&mut fields, own.fields);
    let meta = event.metadata();
    let mut object = serde_json::Map::new();
    object.insert("time_ms".into(), Value::from(time_ms));
    object.insert("level".into(), Value::from(meta.level().as_str()));
    object.insert("target".into(), Value::from(meta.target()));
    object.insert("message".into(), Value::from(own.message.unwrap_or_default()));
    for (name, value) in fields {
        // The four above are the line's own: a field cannot replace them.
        object.entry(name).or_insert(value);
    }
    format!("{}\n", Value::Object(object))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// The lines `emit` logs through a [`LineLayer`] in `format`, filtered as `install`
    /// filters them.
    fn lines(format: LogFormat, quiet: bool, emit: impl FnOnce()) -> Vec<String> {
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        let layer = LineLayer {
            format,
            write: Box::new(move |line| sink.lock().unwrap().extend_from_slice(line)),
            now_ms: || 1234,
        };
        let progress = if quiet { LevelFilter::WARN } else { LevelFilter::INFO };
        let filter = Targets::new().with_default(LevelFilter::INFO).with_target(PROGRESS_TARGET, progress);
        tracing::subscriber::with_default(tracing_subscriber::registry().with(filter).with(layer), emit);
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    fn some_events() {
        tracing::info!(target: PROGRESS_TARGET, "plugin p ready in 3 ms");
        let span = tracing::info_span!("batch", batch = 12u64);
        let _in_batch = span.enter();
        tracing::info!("plugin swapped at batch 12: a -> b");
        tracing::warn!(key = "k", "batch 12: slow");
        tracing::info!(target: PLUGIN_OUTPUT_TARGET, "plugin p key=\"k\" stdout: hi");
        tracing::debug!("not shown at the default level");
    }

    #[test]
    fn text_reads_as_before_and_quiet_drops_only_progress() {
        let all = lines(LogFormat::Text, false, some_events);
        assert_eq!(
            all,
            [
                "groupstate: plugin p ready in 3 ms",
                "groupstate: plugin swapped at batch 12: a -> b",
                "groupstate: warning: batch 12: slow",
                "plugin p key=\"k\" stdout: hi",
            ]
        );
        assert_eq!(lines(LogFormat::Text, true, some_events), all[1..]);
    }

    #[test]
    fn json_lines_carry_level_target_message_and_the_span_fields() {
        let all: Vec<Value> =
            lines(LogFormat::Json, false, some_events).iter().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(all.len(), 4);
        assert_eq!(all[0]["target"], PROGRESS_TARGET);
        assert_eq!(all[0].get("batch"), None, "outside the batch span");
        assert_eq!(
            all[2],
            serde_json::json!({
                "time_ms": 1234, "level": "WARN", "target": "groupstate::logging::tests",
                "message": "batch 12: slow", "batch": 12, "key": "k",
            })
        );
        assert_eq!(all[3]["batch"], 12);
        assert_eq!(all[3]["message"], "plugin p key=\"k\" stdout: hi");
    }

    #[test]
    fn an_event_field_wins_over_a_span_field_and_cannot_replace_the_line_s_own() {
        let all = lines(LogFormat::Json, false, || {
            let outer = tracing::info_span!("partition", partition = 3u64, batch = 1u64);
            let _outer = outer.enter();
            let inner = tracing::info_span!("batch", batch = 2u64);
            let _inner = inner.enter();
            tracing::info!(batch = 9u64, level = "forged", "m");
        });
        let line: Value = serde_json::from_str(&all[0]).unwrap();
        assert_eq!((&line["partition"], &line["batch"], &line["level"]), (&3.into(), &9.into(), &"INFO".into()));
    }
}
