//! A soft-assert collector. Validation tables (every `400` of topic create, …) record each
//! wrong answer and fail once at the end, so one run shows every deviation from the SPEC.

use crate::http::Resp;

pub struct Checks {
    what: String,
    total: usize,
    failures: Vec<String>,
}

impl Checks {
    pub fn new(what: impl Into<String>) -> Self {
        Checks {
            what: what.into(),
            total: 0,
            failures: Vec::new(),
        }
    }

    /// Records a failure with `msg` unless `ok`.
    pub fn check(&mut self, ok: bool, msg: impl FnOnce() -> String) -> bool {
        self.total += 1;
        if !ok {
            self.failures.push(msg());
        }
        ok
    }

    /// Expects exactly `want` as the status.
    pub fn status(&mut self, label: &str, r: &Resp, want: u16) -> bool {
        self.check(r.status == want, || {
            format!("{label}: want {want}, got {}", r.describe())
        })
    }

    /// Expects the error status `want` with the uniform JSON error body; returns its message.
    pub fn error(&mut self, label: &str, r: &Resp, want: u16) -> Option<String> {
        match r.error_problem(want) {
            None => {
                self.total += 1;
                r.error_message()
            }
            Some(p) => {
                self.check(false, || format!("{label}: {p}"));
                None
            }
        }
    }

    /// Panics listing every recorded failure.
    pub fn finish(self) {
        if !self.failures.is_empty() {
            panic!(
                "{}: {} of {} checks failed:\n  - {}",
                self.what,
                self.failures.len(),
                self.total,
                self.failures.join("\n  - ")
            );
        }
    }
}
