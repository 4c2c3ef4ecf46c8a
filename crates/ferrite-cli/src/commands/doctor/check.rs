//! One line of a doctor report: what was checked, what was found, and a verdict with the fix.

use serde::Serialize;

/// How a finding affects ferrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// As it should be.
    Ok,
    /// Worth knowing, nothing is wrong: something this build or setup does not have, or
    /// something ferrite adjusted, with how to change it.
    Note,
    /// ferrite works, but slower, with less, or differently from what the user may expect.
    Warning,
    /// ferrite will fail (e.g. every allocation fails with an invalid `FERRITE_ALLOC_CONF`).
    Error,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Note => "note",
            Verdict::Warning => "warning",
            Verdict::Error => "error",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// `ferrite`, `system`, `container`, `devices`, `datasets`, `environment`.
    pub section: &'static str,
    pub name: String,
    pub verdict: Verdict,
    pub found: String,
    /// What to do, for notes, warnings and errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    pub fn ok(section: &'static str, name: impl Into<String>, found: impl Into<String>) -> Check {
        Check { section, name: name.into(), verdict: Verdict::Ok, found: found.into(), fix: None }
    }

    pub fn note(
        section: &'static str,
        name: impl Into<String>,
        found: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check { section, name: name.into(), verdict: Verdict::Note, found: found.into(), fix: Some(fix.into()) }
    }

    pub fn warning(
        section: &'static str,
        name: impl Into<String>,
        found: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check { section, name: name.into(), verdict: Verdict::Warning, found: found.into(), fix: Some(fix.into()) }
    }

    pub fn error(
        section: &'static str,
        name: impl Into<String>,
        found: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check { section, name: name.into(), verdict: Verdict::Error, found: found.into(), fix: Some(fix.into()) }
    }
}
