//! What a plugin writes for people: its `log` messages and its WASI stdout and stderr.
//! All three share one budget per call (`log_bytes_per_call_max`): the host keeps what
//! fits in a buffer, drops and counts the rest, and after the call writes the buffer to
//! its own log, each line prefixed with the plugin's name and the key: one `tracing`
//! event per line, with the target [`super::PLUGIN_OUTPUT_TARGET`], so that the
//! binary can show it without the host's own prefix.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi_io::bytes::Bytes;

/// The most one `write` to the plugin's stdout or stderr may carry; the plugin asks
/// again for the rest. (wasmtime allocates this much for `write-zeroes`.)
const WRITE_PERMIT_BYTES: usize = 64 << 10;

/// The most of a plugin name or key shown in a log prefix.
const PREFIX_PART_CHARS_MAX: usize = 64;

/// How much of the plugin's stderr a trap message quotes.
const STDERR_TAIL_BYTES_MAX: usize = 512;

/// Where a line of plugin output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// The `log` interface, with the message's level.
    Log(&'static str),
    /// WASI stdout.
    Stdout,
    /// WASI stderr.
    Stderr,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Self::Log(level) => level,
            Self::Stdout => "stdout",
            Self::Stderr => "stderr",
        }
    }

    /// The index of the stream's unfinished line, for the two byte streams.
    fn stream(self) -> Option<usize> {
        match self {
            Self::Log(_) => None,
            Self::Stdout => Some(0),
            Self::Stderr => Some(1),
        }
    }
}

/// What the plugin was doing when it wrote: shown in the prefix of its lines.
#[derive(Debug, Clone, Copy)]
pub(super) enum Activity<'a> {
    /// `info` or `init` of a new instance.
    Init,
    /// `process` for this key.
    Key(&'a str),
    /// `migrate-state` from this schema version.
    Migrate(u32),
}

impl fmt::Display for Activity<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Init => f.write_str("init"),
            // Debug quotes the key and escapes what it must.
            Self::Key(key) => write!(f, "key={:?}", clip_chars(key, PREFIX_PART_CHARS_MAX)),
            Self::Migrate(from) => write!(f, "migrate-state from schema {from}"),
        }
    }
}

/// The plugin output of one instance: shared by its `log` host function and its stdout
/// and stderr streams, and flushed by the host after each call.
#[derive(Clone)]
pub(super) struct PluginLog {
    buffer: Arc<Mutex<Buffer>>,
}

struct Buffer {
    plugin: String,
    budget_bytes: usize,
    used_bytes: usize,
    dropped_messages: u64,
    dropped_bytes: u64,
    /// Whole lines, in the order they were written.
    lines: Vec<(Source, String)>,
    /// Stdout's and stderr's text after their last newline.
    unfinished: [Vec<u8>; 2],
    /// While a `process-batch` runs ([`PluginLog::hold`]): its calls' lines, flushed
    /// call by call but written out only once its outcomes are used. At most
    /// `batch_calls_max` budgets of `log_bytes_per_call_max`.
    held: Option<Vec<String>>,
}

impl PluginLog {
    /// A log for the plugin called `plugin` (its file name until `info` tells its name),
    /// with `budget_bytes` per call.
    pub(super) fn new(plugin: &str, budget_bytes: usize) -> Self {
        let buffer = Buffer {
            plugin: prefix_part(plugin),
            budget_bytes,
            used_bytes: 0,
            dropped_messages: 0,
            dropped_bytes: 0,
            lines: Vec::new(),
            unfinished: [Vec::new(), Vec::new()],
            held: None,
        };
        Self { buffer: Arc::new(Mutex::new(buffer)) }
    }

    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // A panic while holding the lock cannot leave the buffer inconsistent in a way
        // that matters: at worst some lines are lost.
        self.buffer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Names the plugin in the prefix of its lines.
    pub(super) fn set_plugin(&self, name: &str) {
        self.lock().plugin = prefix_part(name);
    }

    /// A message from the `log` interface. It costs its length plus one byte, so that
    /// a flood of empty messages runs out of budget too.
    pub(super) fn message(&self, level: &'static str, text: &str) {
        let mut buffer = self.lock();
        let cost = text.len().saturating_add(1);
        if buffer.used_bytes.saturating_add(cost) > buffer.budget_bytes {
            buffer.dropped_messages += 1;
            return;
        }
        buffer.used_bytes += cost;
        buffer.lines.push((Source::Log(level), text.to_owned()));
    }

    /// Bytes the plugin wrote to stdout or stderr: what fits in the budget is kept,
    /// the rest dropped and counted.
    fn write(&self, source: Source, bytes: &[u8]) {
        let Some(stream) = source.stream() else { return };
        let mut buffer = self.lock();
        let room = buffer.budget_bytes.saturating_sub(buffer.used_bytes);
        let (kept, dropped) = bytes.split_at(bytes.len().min(room));
        buffer.used_bytes += kept.len();
        buffer.dropped_bytes += dropped.len() as u64;
        let mut rest = kept;
        while let Some(newline) = rest.iter().position(|&b| b == b'\n') {
            let mut line = std::mem::take(&mut buffer.unfinished[stream]);
            line.extend_from_slice(&rest[..newline]);
            buffer.lines.push((source, String::from_utf8_lossy(&line).into_owned()));
            rest = &rest[newline + 1..];
        }
        buffer.unfinished[stream].extend_from_slice(rest);
    }

    /// The end of what the plugin wrote to stderr in this call (a panic message, most
    /// often), on one line; `None` if it wrote nothing there.
    pub(super) fn stderr_tail(&self) -> Option<String> {
        let buffer = self.lock();
        let unfinished = String::from_utf8_lossy(&buffer.unfinished[1]);
        let mut parts: Vec<&str> = Vec::new();
        let mut bytes = 0;
        let stderr_lines = buffer.lines.iter().rev().filter(|(s, _)| *s == Source::Stderr).map(|(_, l)| l.as_str());
        for line in std::iter::once(unfinished.as_ref()).chain(stderr_lines) {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if bytes + line.len() > STDERR_TAIL_BYTES_MAX && !parts.is_empty() {
                break;
            }
            bytes += line.len();
            parts.push(line);
        }
        parts.reverse();
        let tail = parts.join(" | ");
        (!tail.is_empty()).then(|| escape_unprintable(&clip_chars(&tail, STDERR_TAIL_BYTES_MAX)))
    }

    /// Sends what the plugin wrote during `activity` to the host's log, a line per
    /// event, and starts a new budget.
    /// While held, the lines are kept instead, for [`PluginLog::release`].
    pub(super) fn flush(&self, activity: Activity<'_>) {
        let mut buffer = self.lock();
        if buffer.is_empty() {
            return;
        }
        match buffer.held.take() {
            Some(mut held) => {
                buffer.drain_into(&mut |line| held.push(line.to_owned()), activity);
                buffer.held = Some(held);
            }
            None => buffer.drain_into(&mut write_line, activity),
        }
    }

    /// Holds the lines flushed from now on until [`PluginLog::release`]: a
    /// `process-batch` that traps is made again call by call, and the calls before the
    /// trap would otherwise log twice.
    pub(super) fn hold(&self) {
        self.lock().held = Some(Vec::new());
    }

    /// Stops holding, and writes what was held to the host's log if `write`, else drops it.
    pub(super) fn release(&self, write: bool) {
        let held = self.take_held();
        if write {
            held.iter().for_each(|line| write_line(line));
        }
    }

    fn take_held(&self) -> Vec<String> {
        self.lock().held.take().unwrap_or_default()
    }

    #[cfg(test)]
    fn flush_to(&self, activity: Activity<'_>) -> String {
        let mut out = String::new();
        self.lock().drain_into(&mut |line| out.push_str(&format!("{line}\n")), activity);
        out
    }
}

impl Buffer {
    fn is_empty(&self) -> bool {
        self.lines.is_empty()
            && self.unfinished.iter().all(Vec::is_empty)
            && self.dropped_messages == 0
            && self.dropped_bytes == 0
    }

    /// Hands every line to `out`, the unfinished ones too, and a count of what was
    /// dropped; then resets the budget.
    fn drain_into(&mut self, out: &mut dyn FnMut(&str), activity: Activity<'_>) {
        for (stream, source) in [(0, Source::Stdout), (1, Source::Stderr)] {
            if !self.unfinished[stream].is_empty() {
                let line = String::from_utf8_lossy(&std::mem::take(&mut self.unfinished[stream])).into_owned();
                self.lines.push((source, line));
            }
        }
        self.write_lines(out, activity);
        self.lines.clear();
        self.used_bytes = 0;
        self.dropped_messages = 0;
        self.dropped_bytes = 0;
    }

    fn write_lines(&self, out: &mut dyn FnMut(&str), activity: Activity<'_>) {
        for (source, line) in &self.lines {
            if source.stream().is_some() && line.trim().is_empty() {
                continue; // Blank lines of stdout and stderr say nothing in the host's log.
            }
            out(&format!("plugin {} {activity} {}: {}", self.plugin, source.name(), escape_unprintable(line)));
        }
        if self.dropped_messages > 0 || self.dropped_bytes > 0 {
            out(&format!(
                "plugin {} {activity}: dropped {} log messages and {} bytes of stdout/stderr over log_bytes_per_call_max ({})",
                self.plugin, self.dropped_messages, self.dropped_bytes, self.budget_bytes
            ));
        }
    }
}

/// Writes one line of a plugin's output to the host's log.
fn write_line(line: &str) {
    tracing::info!(target: super::PLUGIN_OUTPUT_TARGET, "{line}");
}

/// A plugin name for a log prefix: short, and printable as is.
fn prefix_part(name: &str) -> String {
    escape_unprintable(&clip_chars(name, PREFIX_PART_CHARS_MAX))
}

/// At most `max` bytes of `text`, cut at a character boundary, marked when cut.
pub(super) fn clip_chars(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// `text` with control and other unprintable characters (terminal escapes, carriage
/// returns, bidirectional overrides...) escaped, so that a plugin cannot forge or
/// garble the host's log lines. Quotes, backslashes and tabs stay as they are.
pub(super) fn escape_unprintable(text: &str) -> String {
    if text.chars().all(printable) {
        return text.to_owned();
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        push_printable(&mut escaped, c);
    }
    escaped
}

/// `text` escaped as [`escape_unprintable`] does, and at most `max` bytes of the
/// escaped text, cut before the character (or escape) that would not fit and marked
/// when cut; for plugin-chosen text that the host prints and keeps (its name and
/// version). The scan stops at the limit, so a 16 MiB name costs no more than a short one.
pub(super) fn printable_clipped(text: &str, max: usize) -> String {
    let mut kept = String::new();
    for c in text.chars() {
        let before = kept.len();
        push_printable(&mut kept, c);
        if kept.len() > max {
            kept.truncate(before);
            return format!("{kept}… ({} bytes)", text.len());
        }
    }
    kept
}

/// Whether `c` is shown as it is in the host's log.
fn printable(c: char) -> bool {
    matches!(c, '"' | '\'' | '\\' | '\t') || c.escape_debug().len() == 1
}

/// Appends `c`, escaped unless it is [`printable`].
fn push_printable(out: &mut String, c: char) {
    if printable(c) {
        out.push(c);
    } else {
        out.extend(c.escape_debug());
    }
}

/// The plugin's stdout or stderr: a WASI output stream into its [`PluginLog`]. It
/// accepts every write (what is over the budget is dropped and counted, never an
/// error that would make the plugin's `println!` panic) and is always ready.
#[derive(Clone)]
pub(super) struct CapturedStream {
    log: PluginLog,
    source: Source,
}

impl CapturedStream {
    pub(super) fn stdout(log: &PluginLog) -> Self {
        Self { log: log.clone(), source: Source::Stdout }
    }

    pub(super) fn stderr(log: &PluginLog) -> Self {
        Self { log: log.clone(), source: Source::Stderr }
    }
}

impl IsTerminal for CapturedStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturedStream {
    async fn ready(&mut self) {}
}

impl OutputStream for CapturedStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.log.write(self.source, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT_BYTES)
    }
}

impl tokio::io::AsyncWrite for CapturedStream {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.log.write(self.source, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(stream: &mut CapturedStream, text: &str) {
        OutputStream::write(stream, Bytes::copy_from_slice(text.as_bytes())).unwrap();
    }

    #[test]
    fn lines_are_prefixed_in_order_and_unfinished_lines_are_kept() {
        let log = PluginLog::new("p.wasm", 1000);
        log.set_plugin("counter");
        let (mut out, mut err) = (CapturedStream::stdout(&log), CapturedStream::stderr(&log));
        write(&mut out, "hel");
        log.message("info", "between");
        write(&mut out, "lo\nwor");
        write(&mut err, "oops\x1b[2J\n");
        write(&mut out, "ld");
        assert_eq!(
            log.flush_to(Activity::Key("k1")),
            "plugin counter key=\"k1\" info: between\n\
             plugin counter key=\"k1\" stdout: hello\n\
             plugin counter key=\"k1\" stderr: oops\\u{1b}[2J\n\
             plugin counter key=\"k1\" stdout: world\n"
        );
        assert_eq!(log.flush_to(Activity::Key("k2")), "", "a flush starts afresh");
    }

    #[test]
    fn stdout_stderr_and_log_share_one_budget_and_the_excess_is_counted() {
        let log = PluginLog::new("p", 10);
        let mut out = CapturedStream::stdout(&log);
        write(&mut out, "abcdef\n"); // 7 bytes
        log.message("warn", "toolong"); // would cost 8: dropped
        log.message("warn", ""); // costs 1
        write(&mut out, "xyz\n"); // 2 bytes fit, 2 dropped
        log.message("warn", ""); // no room left
        assert_eq!(
            log.flush_to(Activity::Init),
            "plugin p init stdout: abcdef\n\
             plugin p init warn: \n\
             plugin p init stdout: xy\n\
             plugin p init: dropped 2 log messages and 2 bytes of stdout/stderr over log_bytes_per_call_max (10)\n"
        );
        write(&mut out, "012345678\n");
        assert_eq!(log.flush_to(Activity::Init), "plugin p init stdout: 012345678\n", "the budget is per call");
    }

    #[test]
    fn held_lines_wait_for_release() {
        let log = PluginLog::new("p", 100);
        log.hold();
        log.message("info", "one");
        log.flush(Activity::Key("a"));
        log.message("info", "two");
        log.flush(Activity::Key("b"));
        assert_eq!(log.take_held(), ["plugin p key=\"a\" info: one", "plugin p key=\"b\" info: two"]);
        // Released, the log writes as it flushes again.
        log.message("info", "three");
        assert_eq!(log.flush_to(Activity::Init), "plugin p init info: three\n");
        assert!(log.take_held().is_empty());
    }

    #[test]
    fn the_stream_never_refuses_a_write() {
        let log = PluginLog::new("p", 4);
        let mut out = CapturedStream::stdout(&log);
        for _ in 0..3 {
            assert_eq!(out.check_write().unwrap(), WRITE_PERMIT_BYTES);
            write(&mut out, &"z".repeat(WRITE_PERMIT_BYTES));
        }
        assert!(log.flush_to(Activity::Init).ends_with(&format!(
            "{} bytes of stdout/stderr over log_bytes_per_call_max (4)\n",
            3 * WRITE_PERMIT_BYTES - 4
        )));
    }

    #[test]
    fn stderr_tail_quotes_the_last_lines() {
        let log = PluginLog::new("p", 4096);
        let mut err = CapturedStream::stderr(&log);
        assert_eq!(log.stderr_tail(), None);
        write(&mut err, "\nthread '<unnamed>' panicked at src/lib.rs:3:5:\nboom\n");
        log.message("info", "not stderr");
        write(&mut err, "note: run with `RUST_BACKTRACE=1`");
        assert_eq!(
            log.stderr_tail().as_deref(),
            Some("thread '<unnamed>' panicked at src/lib.rs:3:5: | boom | note: run with `RUST_BACKTRACE=1`")
        );
    }

    #[test]
    fn unprintable_characters_are_escaped() {
        assert_eq!(escape_unprintable("a \"b\"\tc\\ é"), "a \"b\"\tc\\ é");
        assert_eq!(escape_unprintable("x\r\x1b[1m\u{202e}y"), "x\\r\\u{1b}[1m\\u{202e}y");
    }

    #[test]
    fn plugin_chosen_text_is_escaped_then_clipped() {
        assert_eq!(printable_clipped("counter", 16), "counter");
        assert_eq!(printable_clipped("a\r\nb", 16), "a\\r\\nb");
        // The escape that would cross the limit is left out whole.
        assert_eq!(printable_clipped("abc\x1b[2J", 8), "abc… (7 bytes)");
        let huge = "x".repeat(1 << 20);
        assert_eq!(printable_clipped(&huge, 4), "xxxx… (1048576 bytes)");
    }

    #[test]
    fn clip_cuts_at_a_char_boundary() {
        assert_eq!(clip_chars("abc", 3), "abc");
        assert_eq!(clip_chars("aé", 2), "a… (3 bytes)");
    }
}
