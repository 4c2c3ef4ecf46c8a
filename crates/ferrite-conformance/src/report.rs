//! What a conformance check found: one result per case, each passed (with its largest |difference|
//! from PyTorch) or failed (with why), grouped by suite.

use std::path::PathBuf;

use serde::Serialize;

/// A family of reference cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Suite {
    /// `ops/manifest.json`: elementwise ops, reductions, views, matmul, linear, layer norm,
    /// softmax, cross-entropy, embedding, attention, LSTM — forward and every input gradient.
    Ops,
    /// The `conv*` cases of `models/`.
    Convolution,
    /// The batch/group/RMS norm and pooling cases of `models/`.
    NormPool,
    /// The loss cases of `models/`.
    Losses,
    /// RNN, GRU and LSTM layers of `models/` (packed sequences included).
    Recurrent,
    /// `train/manifest.json`: SGD, Adam and AdamW trajectories (with accumulation).
    Optimizers,
    /// `train/grad_scaler.json`: the dynamic loss scale over a sequence of overflows.
    GradScaler,
    /// A case of `models/manifest.json` whose op none of the suites runs: always a failure (added
    /// when every `models/` suite ran), so a new kind of fixture case cannot pass unnoticed.
    Unrun,
}

impl Suite {
    pub const ALL: &'static [Suite] = &[
        Suite::Ops,
        Suite::Convolution,
        Suite::NormPool,
        Suite::Losses,
        Suite::Recurrent,
        Suite::Optimizers,
        Suite::GradScaler,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Suite::Ops => "ops",
            Suite::Convolution => "convolution",
            Suite::NormPool => "norm/pool",
            Suite::Losses => "losses",
            Suite::Recurrent => "recurrent",
            Suite::Optimizers => "optimizers",
            Suite::GradScaler => "grad_scaler",
            Suite::Unrun => "unrun",
        }
    }
}

/// How one case went.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Outcome {
    /// Every compared tensor was within the case's tolerance; the largest |difference| seen.
    Passed { max_abs_diff: f64 },
    /// The first tensor out of tolerance (its worst element), or the error the device gave.
    Failed { reason: String },
}

/// One case of one suite.
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub suite: Suite,
    pub name: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl CaseResult {
    pub fn passed(&self) -> bool {
        matches!(self.outcome, Outcome::Passed { .. })
    }
}

/// Every case of a check on one device.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub device: String,
    pub fixtures: PathBuf,
    pub cases: Vec<CaseResult>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.cases.iter().filter(|c| c.passed()).count()
    }

    pub fn failed(&self) -> impl Iterator<Item = &CaseResult> {
        self.cases.iter().filter(|c| !c.passed())
    }

    pub fn all_passed(&self) -> bool {
        self.cases.iter().all(CaseResult::passed)
    }

    /// One line per case (`ok` with the largest difference, or `FAILED: why`) and a summary line.
    pub fn text(&self) -> String {
        let mut s = String::new();
        for c in &self.cases {
            let verdict = match &c.outcome {
                Outcome::Passed { max_abs_diff } => format!("ok (max |diff| {max_abs_diff:.2e})"),
                Outcome::Failed { reason } => format!("FAILED: {reason}"),
            };
            s.push_str(&format!("{:<8} {:<12} {:<28} {verdict}\n", self.device, c.suite.name(), c.name));
        }
        let failed = self.cases.len() - self.passed();
        s.push_str(&format!(
            "{}: {} passed, {failed} failed, against PyTorch's results in {}\n",
            self.device,
            self.passed(),
            self.fixtures.display()
        ));
        s
    }
}
