//! Helpers shared by the integration tests: the fixtures' LR-schedule and optimizer cases.
//! (The `train/` trajectories run in ferrite-conformance's check, on every device.)

use serde_json::Value;

/// The fixture folder's `models/schedules.json`, parsed, or `None` after ferrite-test-support's
/// skip-or-fail rule when the fixtures are absent.
pub fn models_schedules() -> Option<Value> {
    let f = ferrite_test_support::reference_or_skip("models/schedules.json")?.join("models").join("schedules.json");
    let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display())))
}
