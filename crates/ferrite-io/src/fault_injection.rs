//! A testing hook: kill this process with SIGKILL at a chosen point, on purpose.
//!
//! Why it exists: the claims "a rank that dies is detected by the others, named, within the
//! collective deadline" and "a checkpoint is never left unreadable" are only worth something if a
//! test kills a rank where it hurts — inside a broadcast, in the middle of a step's all-reduce,
//! while a checkpoint is being written, during evaluation — and watches what the survivors do.
//! A crash cannot be staged from outside at such a precise moment, so the code names its own
//! dangerous points and, when asked through the environment, dies at one of them.
//!
//! `FERRITE_FAULT_INJECT=rank:1,at:allreduce,after:3` makes MPI rank 1 (read from
//! `OMPI_COMM_WORLD_RANK`, `PMIX_RANK` or `PMI_RANK`; rank 0 outside `mpirun`) raise SIGKILL on
//! itself the 4th time it reaches an all-reduce (3 passes are let through). `rank` may be left out
//! (every process), and so may `after` (0: the first time). Points: `broadcast` (a broadcast, e.g.
//! rank 0's weights), `allreduce` (a gradient bucket's all-reduce, started and unfinished),
//! `save` (a file written atomically — a training checkpoint — fully written to its temporary
//! file but not yet renamed into place) and `eval` (after an evaluation batch). Just before dying
//! the process prints one line on stderr saying so, with the time, so a harness can measure how
//! long the survivors took to notice.
//!
//! Not for users: nothing is ever killed unless the variable is set. The variable is read once
//! (a `OnceLock`); an unset variable costs one atomic load per point. A malformed value is
//! reported on stderr once and ignored. The harness is `crates/ferrite-cli/tests/fault_injection.rs`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that arms the hook.
pub const FAULT_INJECT_ENV: &str = "FERRITE_FAULT_INJECT";

/// A place where a process can be made to die (see the module docs for what each means).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// A broadcast from rank 0 (the initial weights of `--distributed`).
    Broadcast,
    /// A gradient bucket's all-reduce, after it started.
    AllReduce,
    /// A file written atomically (a checkpoint), written but not yet renamed into place.
    Save,
    /// After one batch of an evaluation.
    Eval,
}

impl FaultPoint {
    /// The point's name in `FERRITE_FAULT_INJECT`.
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::Broadcast => "broadcast",
            FaultPoint::AllReduce => "allreduce",
            FaultPoint::Save => "save",
            FaultPoint::Eval => "eval",
        }
    }

    const ALL: [FaultPoint; 4] = [FaultPoint::Broadcast, FaultPoint::AllReduce, FaultPoint::Save, FaultPoint::Eval];
}

/// A parsed `FERRITE_FAULT_INJECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultPlan {
    /// The rank that dies (`None`: any process).
    pub rank: Option<usize>,
    pub at: FaultPoint,
    /// Passes through `at` let through before the one that kills.
    pub after: u64,
}

impl FaultPlan {
    /// Parses `rank:R,at:POINT,after:N` (`rank` and `after` optional, any order); the error says
    /// what is wrong, for the one warning line.
    pub fn parse(text: &str) -> Result<FaultPlan, String> {
        let (mut rank, mut at, mut after) = (None, None, 0u64);
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once(':').ok_or_else(|| format!("`{part}` is not KEY:VALUE"))?;
            let value = value.trim();
            match key.trim() {
                "rank" => rank = Some(value.parse().map_err(|_| format!("rank `{value}` is not a rank number"))?),
                "after" => after = value.parse().map_err(|_| format!("after `{value}` is not a count"))?,
                "at" => {
                    at =
                        Some(FaultPoint::ALL.into_iter().find(|p| p.name() == value).ok_or_else(|| {
                            format!("unknown point `{value}` (one of broadcast, allreduce, save, eval)")
                        })?)
                }
                other => return Err(format!("unknown key `{other}` (rank, at, after)")),
            }
        }
        let at = at.ok_or("no `at:POINT`")?;
        Ok(FaultPlan { rank, at, after })
    }
}

struct Armed {
    plan: FaultPlan,
    /// This process's rank as the launcher set it.
    rank: usize,
    passes: AtomicU64,
}

static ARMED: OnceLock<Option<Armed>> = OnceLock::new();

fn armed() -> Option<&'static Armed> {
    ARMED
        .get_or_init(|| {
            let text = std::env::var(FAULT_INJECT_ENV).ok()?;
            match FaultPlan::parse(&text) {
                Ok(plan) => Some(Armed { plan, rank: launcher_rank(), passes: AtomicU64::new(0) }),
                Err(why) => {
                    eprintln!(
                        "ferrite: {FAULT_INJECT_ENV}={text} ignored: {why}; expected e.g. rank:1,at:allreduce,after:3"
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// This process's rank from the variables MPI launchers set (Open MPI, PMIx, MPICH); 0 without.
fn launcher_rank() -> usize {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .find_map(|k| std::env::var(k).ok().and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// Whether `FERRITE_FAULT_INJECT` armed a fault in this process (for messages; never needed to
/// call [`fault_point`]).
pub fn fault_injection_armed() -> bool {
    armed().is_some_and(|a| a.plan.rank.is_none_or(|r| r == a.rank))
}

/// Marks a point where a fault may be injected: returns at once unless `FERRITE_FAULT_INJECT`
/// names this point and this rank and the pass count is reached, in which case the process
/// kills itself with SIGKILL (no unwinding, no destructors, no flushing: as the OOM killer would).
pub fn fault_point(point: FaultPoint) {
    let Some(a) = armed() else { return };
    if a.plan.at != point || a.plan.rank.is_some_and(|r| r != a.rank) {
        return;
    }
    let pass = a.passes.fetch_add(1, Ordering::SeqCst);
    if pass != a.plan.after {
        return;
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    eprintln!(
        "ferrite: {FAULT_INJECT_ENV}: rank {} kills itself with SIGKILL at {} #{} (unix time {now:.3})",
        a.rank,
        point.name(),
        pass + 1
    );
    kill_self();
}

#[cfg(unix)]
fn kill_self() {
    // SAFETY: getpid has no preconditions; kill with this process's own id and SIGKILL ends the
    // process at once (it does not return); no memory is touched.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    // Not reached; should the signal somehow be delayed, do not run on past the point.
    std::process::abort();
}

#[cfg(not(unix))]
fn kill_self() {
    std::process::abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_spec_parses_in_any_order() {
        let p = FaultPlan::parse("rank:1,at:allreduce,after:3").unwrap();
        assert_eq!(p, FaultPlan { rank: Some(1), at: FaultPoint::AllReduce, after: 3 });
        let q = FaultPlan::parse(" after:0 , at:save ").unwrap();
        assert_eq!(q, FaultPlan { rank: None, at: FaultPoint::Save, after: 0 });
        for point in FaultPoint::ALL {
            assert_eq!(FaultPlan::parse(&format!("at:{}", point.name())).unwrap().at, point);
        }
    }

    #[test]
    fn a_malformed_spec_says_what_is_wrong() {
        for (text, says) in [
            ("rank:1", "no `at:POINT`"),
            ("rank:x,at:eval", "rank `x`"),
            ("at:everywhere", "unknown point `everywhere`"),
            ("at:eval,when:now", "unknown key `when`"),
            ("at:eval,after:-1", "after `-1`"),
            ("ateval", "not KEY:VALUE"),
        ] {
            let e = FaultPlan::parse(text).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn an_unarmed_point_returns() {
        // The test process has no FERRITE_FAULT_INJECT (the harness sets it only on the
        // processes it launches): every point is a no-op.
        if std::env::var_os(FAULT_INJECT_ENV).is_none() {
            for point in FaultPoint::ALL {
                fault_point(point);
            }
            assert!(!fault_injection_armed());
        }
    }
}
