//! The memory planner on the `meta` device and the batch-size finder (see `docs/architecture.md`
//! in the repository, "The map of crates").
//!
//! Intentionally empty: no open issue asks for it yet. It exists so the workspace has the layout
//! of the design and the facade crate can re-export it once it is filled.
