//! The launch shape of the normalisation and pooling kernels: contiguous operands addressed by
//! plain element indices (`at(k, i)` is element `i` of operand `k`, its storage offset
//! included), a few `u32` scalars (`sc(j)`, `scf(j)` as f32 bits), workgroups of 256 with two
//! shared arrays and a tree sum over both (`tree2`). A body indexes planes, channels or groups
//! itself, so one launcher serves batch, group and RMS norm and the pooling kernels.

use std::fmt::Write as _;

use super::runtime::{Operand, Runtime};
use super::wgsl;
use crate::error::{Result, TensorError};

/// One launch under construction: operands in binding order, then scalars.
pub(super) struct PlaneKernel<'a> {
    op: &'static str,
    key: String,
    ops: Vec<Operand<'a>>,
    scalars: Vec<u32>,
}

impl<'a> PlaneKernel<'a> {
    pub fn new(op: &'static str, key: impl Into<String>) -> PlaneKernel<'a> {
        PlaneKernel { op, key: key.into(), ops: Vec::new(), scalars: Vec::new() }
    }

    /// Add an operand; returns its index `k` for `ldf{k}`/`stf{k}`/`at(k, i)`.
    pub fn operand(&mut self, o: Operand<'a>) -> usize {
        self.ops.push(o);
        self.ops.len() - 1
    }

    /// Add an optional operand (`None` when absent).
    pub fn optional(&mut self, o: Option<Operand<'a>>) -> Option<usize> {
        o.map(|o| self.operand(o))
    }

    /// Append scalar words (`sc(j)` in order of addition).
    pub fn scalars(&mut self, words: &[u32]) {
        self.scalars.extend_from_slice(words);
    }

    /// Run `body` (statements of `main`, with `gid` the workgroup index and `lid` the invocation
    /// within it) over `groups` workgroups; `helpers` are module-level functions it calls. The
    /// cache key covers the operands' dtypes and which are written, so bodies may differ by them.
    pub fn run(self, rt: &Runtime, groups: usize, helpers: &str, body: &str) -> Result<()> {
        if groups == 0 {
            return Ok(());
        }
        if groups > (u32::MAX / 256) as usize {
            return Err(TensorError::invalid(
                self.op,
                format!("{groups} workgroups are more than a GPU kernel can index"),
            ));
        }
        let m = self.ops.len();
        let mut params: Vec<u32> = self.ops.iter().map(|o| o.t.storage_offset() as u32).collect();
        params.extend_from_slice(&self.scalars);
        let dtypes: Vec<_> = self.ops.iter().map(|o| o.t.dtype()).collect();
        let written: Vec<bool> = self.ops.iter().map(|o| o.access != super::runtime::Access::Read).collect();
        let key = format!("plane:{}:{}|{dtypes:?}|{written:?}", self.op, self.key);
        rt.launch(self.op, &key, &self.ops, false, &params, wgsl::groups_n(groups), |plan| {
            let mut s = wgsl::header(plan);
            s.push_str(&wgsl::operands(plan, &dtypes, &written));
            let _ = writeln!(s, "const M: u32 = {m}u;");
            s.push_str("fn at(k: u32, i: u32) -> u32 { return P[M + k] + i; }\n");
            s.push_str("fn sc(j: u32) -> u32 { return P[M + M + j]; }\n");
            s.push_str("fn scf(j: u32) -> f32 { return bitcast<f32>(sc(j)); }\n");
            s.push_str("var<workgroup> red: array<f32, 256>;\nvar<workgroup> red2: array<f32, 256>;\n");
            s.push_str(
                "fn tree2(lid: u32) { for (var h = 128u; h > 0u; h = h >> 1u) { if (lid < h) { red[lid] = red[lid] + red[lid + h]; red2[lid] = red2[lid] + red2[lid + h]; } workgroupBarrier(); } }\n",
            );
            s.push_str(helpers);
            s.push_str("@compute @workgroup_size(256)\nfn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {\n  let gid = wid.y * nwg.x + wid.x;\n");
            s.push_str(body);
            s.push_str("}\n");
            s
        })
    }
}

/// WGSL expression of optional operand `k`'s element `i` as f32, or `default` when absent.
pub(super) fn opt_ld(k: Option<usize>, i: &str, default: &str) -> String {
    match k {
        Some(k) => format!("ldf{k}(at({k}u, {i}))"),
        None => default.to_string(),
    }
}

/// Workgroups for a one-dimensional kernel over `n` items (256 per workgroup).
pub(super) fn groups_for(n: usize) -> usize {
    n.div_ceil(256)
}
