//! The devices a device-parameterised suite runs on, and the one loop that runs a suite's body on
//! each of them.
//!
//! Why here and not in ferrite-memory: choosing devices for tests is a test concern, and a
//! production crate should not carry it. Why one loop: every parity suite used to repeat
//! `for dev in devices_under_test()`, and a failure deep inside named the device only if the
//! suite remembered to put it in every message. [`for_each_device`] runs the body on every
//! device, then fails once, naming each device that failed and why — the way burn's
//! backend-generic suite instantiates one body per backend.

use std::panic::{AssertUnwindSafe, catch_unwind};

use ferrite_memory::{Device, MemoryError};

/// Environment variable choosing the devices the conformance suites run on (`cpu,gpu:0`).
pub const TEST_DEVICES_ENV: &str = "FERRITE_TEST_DEVICES";

/// The devices a device-parameterised test suite runs on: those listed in
/// `$FERRITE_TEST_DEVICES` (comma-separated), else `cpu` and every GPU adapter of this machine.
/// One place decides, so every suite runs on the same devices and can print them.
pub fn devices_under_test() -> Result<Vec<Device>, MemoryError> {
    match std::env::var(TEST_DEVICES_ENV) {
        Ok(list) if !list.trim().is_empty() => list.split(',').map(|d| d.trim().parse::<Device>()).collect(),
        _ => Ok(std::iter::once(Device::Cpu).chain(gpu_adapters()).collect()),
    }
}

/// `gpu:i` for every GPU adapter of this machine.
fn gpu_adapters() -> Vec<Device> {
    ferrite_memory::gpu::list_adapters().into_iter().map(|a| Device::Gpu { index: a.index }).collect()
}

/// [`devices_under_test`], or a panic naming the environment variable when its list is malformed.
pub fn devices() -> Vec<Device> {
    devices_under_test().unwrap_or_else(|e| panic!("{TEST_DEVICES_ENV}: {e}"))
}

/// Runs `body` on every device under test (see [`for_each_device_where`]).
pub fn for_each_device(body: impl FnMut(&Device)) {
    for_each_device_where(|_| true, body);
}

/// Runs `body` on every device under test that `keep` accepts, in order, each run separately:
/// a panic on one device is caught, the other devices still run, and the loop then panics with
/// one line per failed device (`gpu:0: element 3 is ...`). Prints the devices it runs on.
pub fn for_each_device_where(keep: impl Fn(&Device) -> bool, mut body: impl FnMut(&Device)) {
    let devices: Vec<Device> = devices().into_iter().filter(|d| keep(d)).collect();
    let names: Vec<String> = devices.iter().map(Device::to_string).collect();
    println!("devices under test: {}", names.join(", "));
    let mut failures = Vec::new();
    for dev in &devices {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| body(dev))) {
            failures.push(format!("{dev}: {}", panic_message(payload.as_ref())));
        }
    }
    assert!(
        failures.is_empty(),
        "failed on {} of {} devices under test:\n  {}",
        failures.len(),
        devices.len(),
        failures.join("\n  ")
    );
}

/// The text of a panic (`panic!("...")` carries a `String` or a `&str`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_names_every_device_that_failed_and_runs_the_others() {
        let mut ran = Vec::new();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            for_each_device_where(
                |d| matches!(d, Device::Cpu),
                |d| {
                    ran.push(d.to_string());
                    panic!("element 3 is 1, PyTorch gives 2");
                },
            )
        }));
        let payload = outcome.expect_err("the loop fails when the body fails");
        let msg = panic_message(payload.as_ref());
        assert!(msg.contains("cpu: element 3 is 1, PyTorch gives 2"), "{msg}");
        assert_eq!(ran, ["cpu"]);
    }

    #[test]
    fn a_passing_body_runs_once_per_device() {
        let mut n = 0;
        for_each_device_where(|d| matches!(d, Device::Cpu), |_| n += 1);
        assert_eq!(n, 1);
    }
}
