//! Trace replay (below).
