//! Data parallelism across devices (see `DESIGN.md`, "ferrite-parallel").
//!
//! Intentionally empty: no open issue asks for it yet. It exists so the workspace has the layout
//! of the design and the facade crate can re-export it once it is filled.
