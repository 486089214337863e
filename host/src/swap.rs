//! The check a new plugin version passes before a hot swap: migrating a sample of the
//! stored values written under another state schema. It runs on a thread of its own
//! (`groupstate-swap-check`) within `migration_check_ms_max`, so a slow migration does
//! not stall the batches; the pipeline takes the sample and polls the verdict at batch
//! boundaries. The values are migrated to be checked only: after the swap each old
//! value is migrated again when its key is first touched, since the running version
//! may have changed it meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crate::clock::Clock;

/// One stored value of the sample.
#[derive(Debug, Clone)]
pub(crate) struct SampledValue {
    /// The key.
    pub key: String,
    /// The state schema that wrote the value.
    pub schema_version: u32,
    /// The value.
    pub value: Vec<u8>,
    /// With a 0.2 plugin, the variable and the part of it the value is (0.1 has one
    /// value per key).
    pub entry: Option<(String, crate::keyed::StatePart)>,
}

impl SampledValue {
    /// What the value is, for a refusal: `key "k"`, or `variable "v" of key "k"`.
    fn what(&self) -> String {
        match &self.entry {
            None => format!("key {:?}", self.key),
            Some((variable, part)) => {
                let part = match part {
                    crate::keyed::StatePart::Value => "the value",
                    crate::keyed::StatePart::ListElement => "a list element",
                    crate::keyed::StatePart::MapKey => "a map key",
                    crate::keyed::StatePart::MapValue => "a map value",
                };
                format!("{part} of variable {variable:?} of key {:?}", self.key)
            }
        }
    }
}

/// Why a check refused its candidate, if it did.
pub(crate) type Verdict = Result<(), String>;

/// Converts one stored value for the candidate `C`.
pub(crate) type Migrate<C> = fn(&mut C, &SampledValue) -> Result<Vec<u8>, String>;

/// A check under way on its own thread. Dropping it stops the check after the
/// migration in progress (at most `call_cpu_ms_max`) and joins the thread.
pub(crate) struct SwapCheck<C> {
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<(C, Verdict)>>,
    /// The candidate's label, for the logs and the plugin status.
    pub label: String,
    /// Where the candidate came from.
    pub origin: String,
}

impl<C> std::fmt::Debug for SwapCheck<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwapCheck").field("label", &self.label).finish_non_exhaustive()
    }
}

/// How the candidate is to be checked.
pub(crate) struct CheckPlan {
    /// The stored values it must migrate.
    pub sample: Vec<SampledValue>,
    /// `migration_check_ms_max`.
    pub budget_ms: u64,
    /// Measures the budget (the pipeline's clock: a manual clock never runs out).
    pub clock: Arc<dyn Clock>,
}

impl<C: Send + 'static> SwapCheck<C> {
    /// Starts checking `candidate` on a new thread.
    pub(crate) fn start(
        candidate: C,
        migrate: Migrate<C>,
        plan: CheckPlan,
        label: String,
        origin: String,
    ) -> std::io::Result<Self> {
        let cancel = Arc::new(AtomicBool::new(false));
        let thread_cancel = cancel.clone();
        let thread = std::thread::Builder::new()
            .name("groupstate-swap-check".into())
            .spawn(move || run(candidate, migrate, plan, &thread_cancel))?;
        Ok(Self { cancel, thread: Some(thread), label, origin })
    }

    /// Whether the check has come to a verdict.
    pub(crate) fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the verdict; the candidate is `None` if the check panicked.
    pub(crate) fn finish(mut self) -> (Option<C>, Verdict) {
        let Some(thread) = self.thread.take() else {
            return (None, Err("the migration check was already finished".into()));
        };
        match thread.join() {
            Ok((candidate, verdict)) => (Some(candidate), verdict),
            Err(_) => (None, Err("the migration check panicked".into())),
        }
    }
}

impl<C> Drop for SwapCheck<C> {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A panic in the check has nothing left to report once the pipeline stops.
            let _ = thread.join();
        }
    }
}

/// Migrates the sample in order; the first value that fails, or the budget running
/// out, refuses the candidate.
fn run<C>(mut candidate: C, migrate: Migrate<C>, plan: CheckPlan, cancel: &AtomicBool) -> (C, Verdict) {
    let started_ns = plan.clock.monotonic_ns();
    let total = plan.sample.len();
    for (done, sampled) in plan.sample.iter().enumerate() {
        if cancel.load(Ordering::Relaxed) {
            return (candidate, Err("the pipeline stopped during the migration check".into()));
        }
        if let Err(e) = migrate(&mut candidate, sampled) {
            let why =
                format!("cannot read {} stored under state schema {}: {e}", sampled.what(), sampled.schema_version);
            return (candidate, Err(why));
        }
        let elapsed_ms = plan.clock.monotonic_ns().saturating_sub(started_ns) / 1_000_000;
        if elapsed_ms > plan.budget_ms {
            let why = format!(
                "migrating {} of {total} sampled values took {elapsed_ms} ms, over migration_check_ms_max ({} ms); \
                 every old value is migrated when its key is first touched, so a migration this slow would stall \
                 the batches: make migrate-state faster or raise the limit",
                done + 1,
                plan.budget_ms
            );
            return (candidate, Err(why));
        }
    }
    (candidate, Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn plan(values: &[(&str, &[u8])], budget_ms: u64, clock: Arc<dyn Clock>) -> CheckPlan {
        let sample = values
            .iter()
            .map(|(key, value)| SampledValue {
                key: (*key).into(),
                schema_version: 1,
                value: value.to_vec(),
                entry: None,
            })
            .collect();
        CheckPlan { sample, budget_ms, clock }
    }

    /// A candidate that doubles each byte, refuses an empty value, and moves the
    /// clock on by 10 ms per migration.
    fn doubler(clock: &ManualClock, value: &[u8]) -> Result<Vec<u8>, String> {
        clock.advance_ms(10);
        if value.is_empty() { Err("empty".into()) } else { Ok(value.iter().map(|b| b * 2).collect()) }
    }

    fn verdict(values: &[(&str, &[u8])], budget_ms: u64) -> Verdict {
        let clock = ManualClock::new(0);
        let migrate: Migrate<ManualClock> = |clock, sampled| doubler(clock, &sampled.value);
        let check =
            SwapCheck::start(clock.clone(), migrate, plan(values, budget_ms, Arc::new(clock)), "c".into(), "t".into())
                .expect("spawn");
        let (candidate, verdict) = check.finish();
        assert!(candidate.is_some());
        verdict
    }

    #[test]
    fn the_first_failure_or_the_budget_refuses_the_candidate() {
        assert_eq!(verdict(&[("a", &[1]), ("b", &[2])], 1000), Ok(()));
        let failed = verdict(&[("a", &[1]), ("b", &[])], 1000).unwrap_err();
        assert!(failed.contains("cannot read key \"b\" stored under state schema 1: empty"), "{failed}");
        let slow = verdict(&[("a", &[1]), ("b", &[2]), ("c", &[3])], 15).unwrap_err();
        assert!(
            slow.contains("migrating 2 of 3 sampled values took 20 ms, over migration_check_ms_max (15 ms)"),
            "{slow}"
        );
    }
}
