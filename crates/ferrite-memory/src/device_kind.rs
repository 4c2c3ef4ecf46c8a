//! The kinds of device (`cpu`, `sim`, `meta`, `gpu`, `cuda`) as a plain enum. A leaf of its own because
//! the out-of-memory report (`oom.rs`) records the kind of the device that ran out, and the
//! device names (`device.rs`) return errors that carry that report: with the enum in
//! `device.rs`, the device, the error and the report imported each other.

/// Which backend a device's memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    Cpu,
    Sim,
    Meta,
    Gpu,
    Cuda,
}
