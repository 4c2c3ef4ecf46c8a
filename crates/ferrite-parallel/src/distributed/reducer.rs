//! Gradient buckets: which parameters are averaged together, and when each all-reduce starts.
//!
//! Parameters are packed into buckets of about `bucket_cap_bytes` in reverse registration order
//! (roughly the order backward produces their gradients, as in PyTorch). A grad-ready hook on
//! every parameter marks it ready; when every parameter of the next bucket in order is ready,
//! the bucket is copied into one flat buffer and its all-reduce is queued on the communication
//! thread while backward goes on. Buckets start strictly in index order on every rank, so the
//! collectives of all ranks pair up. Each bucket carries one extra number per parameter, 1 where
//! the rank produced a gradient, so a parameter no rank used keeps `grad = None`.

use std::sync::Weak;

use ferrite_tensor::{DType, Tensor, no_grad};
use parking_lot::Mutex;

use super::error::{DistributedError, Result};
use super::process_group::{Comm, Pending};

pub(crate) struct Bucket {
    /// Indices into the reducer's parameters, in the order backward tends to fill them.
    pub(crate) params: Vec<usize>,
}

struct StepState {
    active: bool,
    ready: Vec<bool>,
    remaining: Vec<usize>,
    next_launch: usize,
    pending: Vec<Option<Pending<Vec<f32>>>>,
    error: Option<DistributedError>,
}

pub(crate) struct Reducer {
    comm: Comm,
    pub(crate) names: Vec<String>,
    pub(crate) params: Vec<Tensor>,
    pub(crate) buckets: Vec<Bucket>,
    param_bucket: Vec<usize>,
    state: Mutex<StepState>,
}

impl Reducer {
    pub(crate) fn new(comm: Comm, named: Vec<(String, Tensor)>, bucket_cap_bytes: usize) -> Reducer {
        let (names, params): (Vec<String>, Vec<Tensor>) = named.into_iter().unzip();
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut param_bucket = vec![0; params.len()];
        let mut current: Vec<usize> = Vec::new();
        let mut bytes = 0usize;
        for i in (0..params.len()).rev() {
            let b = params[i].numel() * 4;
            if !current.is_empty() && bytes + b > bucket_cap_bytes {
                buckets.push(Bucket { params: std::mem::take(&mut current) });
                bytes = 0;
            }
            current.push(i);
            bytes += b;
        }
        if !current.is_empty() {
            buckets.push(Bucket { params: current });
        }
        for (bi, b) in buckets.iter().enumerate() {
            for &p in &b.params {
                param_bucket[p] = bi;
            }
        }
        let n = params.len();
        let nb = buckets.len();
        Reducer {
            comm,
            names,
            params,
            buckets,
            param_bucket,
            state: Mutex::new(StepState {
                active: false,
                ready: vec![false; n],
                remaining: vec![0; nb],
                next_launch: 0,
                pending: (0..nb).map(|_| None).collect(),
                error: None,
            }),
        }
    }

    /// Install the grad-ready hooks (they hold the reducer weakly: no cycle through the params).
    pub(crate) fn install_hooks(self: &std::sync::Arc<Self>) {
        for (i, p) in self.params.iter().enumerate() {
            let weak: Weak<Reducer> = std::sync::Arc::downgrade(self);
            p.set_grad_ready_hook(Some(std::sync::Arc::new(move || {
                if let Some(r) = weak.upgrade() {
                    r.mark_ready(i);
                }
            })));
        }
    }

    pub(crate) fn remove_hooks(&self) {
        for p in &self.params {
            p.set_grad_ready_hook(None);
        }
    }

    /// Arm the hooks for one synchronizing backward pass.
    pub(crate) fn begin(&self) {
        let mut s = self.state.lock();
        s.active = true;
        s.ready.iter_mut().for_each(|r| *r = false);
        for (bi, b) in self.buckets.iter().enumerate() {
            s.remaining[bi] = b.params.len();
        }
        s.next_launch = 0;
        s.error = None;
    }

    fn mark_ready(&self, param: usize) {
        let mut s = self.state.lock();
        if !s.active || s.ready[param] {
            return;
        }
        s.ready[param] = true;
        s.remaining[self.param_bucket[param]] -= 1;
        while s.next_launch < self.buckets.len() && s.remaining[s.next_launch] == 0 {
            let bi = s.next_launch;
            self.launch(&mut s, bi);
        }
    }

    fn launch(&self, s: &mut StepState, bi: usize) {
        s.next_launch = bi + 1;
        if s.error.is_some() {
            // Keep pairing with the other ranks even after a local error: send zeros.
            let n: usize = self.buckets[bi].params.iter().map(|&p| self.params[p].numel() + 1).sum();
            s.pending[bi] = self.comm.all_reduce_sum(vec![0.0; n]).ok();
            return;
        }
        match self.flatten(bi).and_then(|flat| self.comm.all_reduce_sum(flat)) {
            Ok(p) => s.pending[bi] = Some(p),
            Err(e) => {
                s.error = Some(e);
                let n: usize = self.buckets[bi].params.iter().map(|&p| self.params[p].numel() + 1).sum();
                s.pending[bi] = self.comm.all_reduce_sum(vec![0.0; n]).ok();
            }
        }
    }

    /// The bucket's gradients as one f32 buffer, then one "used" flag per parameter.
    fn flatten(&self, bi: usize) -> Result<Vec<f32>> {
        let _g = no_grad();
        let b = &self.buckets[bi];
        let n: usize = b.params.iter().map(|&p| self.params[p].numel()).sum();
        let mut flat = Vec::with_capacity(n + b.params.len());
        let mut used = Vec::with_capacity(b.params.len());
        for &p in &b.params {
            let param = &self.params[p];
            match param.grad() {
                Some(g) => {
                    if g.dtype() == DType::F32 {
                        flat.extend_from_slice(&g.to_vec::<f32>()?);
                    } else {
                        flat.extend(g.to_vec_f64()?.into_iter().map(|v| v as f32));
                    }
                    used.push(1.0);
                }
                None => {
                    flat.extend(std::iter::repeat_n(0.0f32, param.numel()));
                    used.push(0.0);
                }
            }
        }
        flat.extend(used);
        Ok(flat)
    }

    /// After backward: start the buckets still waiting (parameters without a gradient), wait for
    /// every bucket, and write the averaged gradients back. `allow_unused = false` turns a
    /// parameter whose hook never fired into [`DistributedError::UnusedParameters`] (the buckets
    /// are still exchanged, so the other ranks are not left waiting).
    pub(crate) fn finish(&self, allow_unused: bool) -> Result<()> {
        let unused: Vec<String> = {
            let mut s = self.state.lock();
            let unused = self.names.iter().zip(&s.ready).filter(|(_, r)| !**r).map(|(n, _)| n.clone()).collect();
            while s.next_launch < self.buckets.len() {
                let bi = s.next_launch;
                self.launch(&mut s, bi);
            }
            s.active = false;
            unused
        };
        let (pending, error) = {
            let mut s = self.state.lock();
            (s.pending.iter_mut().map(Option::take).collect::<Vec<_>>(), s.error.take())
        };
        let mut results = Vec::with_capacity(pending.len());
        for p in pending {
            match p {
                Some(p) => results.push(p.wait()?),
                None => {
                    return Err(DistributedError::CommunicationStopped {
                        rank: self.comm.rank(),
                        detail: "a bucket could not be queued".into(),
                    });
                }
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
        if !allow_unused && !unused.is_empty() {
            return Err(DistributedError::UnusedParameters { rank: self.comm.rank(), names: unused });
        }
        self.write_back(&results)
    }

    /// Abandon the step after a local error: start what is left and wait, so peers finish theirs.
    pub(crate) fn drain(&self) {
        let pending = {
            let mut s = self.state.lock();
            if s.active {
                if s.error.is_none() {
                    s.error = Some(DistributedError::AlreadyFailed { rank: self.comm.rank() });
                }
                while s.next_launch < self.buckets.len() {
                    let bi = s.next_launch;
                    self.launch(&mut s, bi);
                }
            }
            s.active = false;
            s.error = None;
            s.pending.iter_mut().map(Option::take).collect::<Vec<_>>()
        };
        for p in pending.into_iter().flatten() {
            if p.wait().is_err() {
                return;
            }
        }
    }

    fn write_back(&self, results: &[Vec<f32>]) -> Result<()> {
        let _g = no_grad();
        let world = self.comm.world_size() as f32;
        for (bi, b) in self.buckets.iter().enumerate() {
            let flat = &results[bi];
            let n: usize = b.params.iter().map(|&p| self.params[p].numel()).sum();
            let mut off = 0;
            for (k, &p) in b.params.iter().enumerate() {
                let param = &self.params[p];
                let numel = param.numel();
                let used_by = flat[n + k];
                if used_by > 0.0 {
                    let avg: Vec<f32> = flat[off..off + numel].iter().map(|v| v / world).collect();
                    let t = Tensor::from_vec(avg, param.shape(), param.device())?;
                    match param.grad() {
                        Some(g) => g.copy_(&t)?,
                        None => {
                            let g = param.detach().zeros_like()?;
                            g.copy_(&t)?;
                            param.set_grad(Some(g))?;
                        }
                    }
                }
                off += numel;
            }
        }
        Ok(())
    }
}
