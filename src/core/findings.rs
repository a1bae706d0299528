//! One rule's verdict on one field: what `validate`, `bounds`, `egress` and the offline report
//! return, and what the CLI, the webhook and status print.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One rule's verdict on one field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// Stable rule id, e.g. `decode-dcp-needs-mla`.
    pub rule: &'static str,
    /// JSON path of the offending field, e.g. `spec.decode.parallelism.dcp`.
    pub field: String,
    pub message: String,
    pub fix: String,
}

impl Finding {
    pub(crate) fn error(rule: &'static str, field: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { severity: Severity::Error, rule, field: field.into(), message: message.into(), fix: fix.into() }
    }
    pub(crate) fn warning(rule: &'static str, field: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { severity: Severity::Warning, ..Self::error(rule, field, message, fix) }
    }
}

/// `<field path>: <message> (fix: <hint>)`: the one form the CLI, the webhook and status print.
impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} (fix: {})", self.field, self.message, self.fix)
    }
}
