//! Gradient buckets: which parameters are averaged together, and when each all-reduce starts.
//!
//! Parameters are packed into buckets of about `bucket_cap_bytes` in reverse registration order
//! (roughly the order backward produces their gradients, as in PyTorch). A grad-ready hook on
//! every parameter marks it ready; when every parameter of the next bucket in order is ready,
//! the bucket's gradients go into its flat send buffer (kept from step to step; no copy for a
//! gradient that already views it, see [`BucketBuffers`]) and its all-reduce is queued on the
//! communication thread while backward goes on. Afterwards the gradients are views into the
//! averaged buffer. The first bucket is small (PyTorch's `first_bucket_bytes`, 1 MiB) so that
//! communication starts early in backward. Buckets start strictly in index order on every rank,
//! so the collectives of all ranks pair up. Each bucket carries one extra number per parameter, 1 where
//! the rank produced a gradient, so a parameter no rank used keeps `grad = None`.

use std::sync::Weak;
use std::time::{Duration, Instant};

// The bucket assignment is shared with the planner, which predicts the buckets' memory.
use ferrite_optim::ddp_buckets as assign_buckets;
use ferrite_tensor::Tensor;
use parking_lot::Mutex;

use super::bucket::BucketBuffers;
use super::error::{DistributedError, Result};
use super::process_group::{Comm, InFlight, Pending};

/// Where the time of the last synchronizing backward went, like the timings of PyTorch's DDP
/// logging data: read it to see whether communication hides behind backward on your machine.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimings {
    /// Gradient buckets exchanged.
    pub buckets: usize,
    /// Backward itself, from its start until it returned (the hooks' copying included).
    pub backward: Duration,
    /// The buckets' all-reduces on the communication thread, added up.
    pub communication: Duration,
    /// The part of [`communication`](Self::communication) that ran while backward was still
    /// computing (hidden behind it). An all-reduce started on the training thread counts from
    /// its start until it was seen finished (MPI advances it inside the grad-ready hooks).
    pub hidden: Duration,
    /// Time after backward until the last all-reduce finished (starting the buckets that were
    /// still waiting included).
    pub exposed_wait: Duration,
    /// Copying gradients into the bucket buffers (during backward or, for buckets started by
    /// `finish`, inside `exposed_wait`).
    pub flatten: Duration,
    /// Averaging the sums and writing them back into the gradients.
    pub write_back: Duration,
}

impl StepTimings {
    /// The share of communication hidden behind backward, 0 to 1 (1 without communication).
    pub fn hidden_share(&self) -> f64 {
        let c = self.communication.as_secs_f64();
        if c > 0.0 { (self.hidden.as_secs_f64() / c).clamp(0.0, 1.0) } else { 1.0 }
    }
}

/// A bucket's all-reduce in flight: queued on the communication thread (the default: on a quiet
/// 2-core machine it hid 80–96 % of the all-reduce behind backward at equal samples/s), or started
/// on the training thread with non-blocking MPI (`FERRITE_DDP_COMM_THREAD=0`; `MPI_Iallreduce`
/// advances only while both ranks are inside MPI, so it hid 1–7 %).
enum Started {
    Inline(InFlight),
    Thread(Pending<Result<BucketBuffers>>),
}

impl Started {
    fn progress(&mut self) {
        if let Started::Inline(f) = self {
            f.test();
        }
    }

    fn wait(self) -> Result<BucketBuffers> {
        match self {
            Started::Inline(f) => f.wait(),
            Started::Thread(p) => p.wait()?,
        }
    }
}

pub(crate) struct Bucket {
    /// Indices into the reducer's parameters, in the order backward tends to fill them.
    pub(crate) params: Vec<usize>,
}

struct StepState {
    active: bool,
    ready: Vec<bool>,
    remaining: Vec<usize>,
    next_launch: usize,
    /// Each bucket's buffers while no all-reduce holds them (kept across steps; the gradients
    /// view them between steps).
    buffers: Vec<Option<BucketBuffers>>,
    pending: Vec<Option<Started>>,
    error: Option<DistributedError>,
    started: Option<Instant>,
    flatten: Duration,
    timings: StepTimings,
}

pub(crate) struct Reducer {
    comm: Comm,
    pub(crate) names: Vec<String>,
    pub(crate) params: Vec<Tensor>,
    pub(crate) buckets: Vec<Bucket>,
    param_bucket: Vec<usize>,
    /// Queue buckets on the communication thread instead of starting them here.
    on_thread: bool,
    state: Mutex<StepState>,
}

impl Reducer {
    pub(crate) fn new(
        comm: Comm,
        named: Vec<(String, Tensor)>,
        first_bucket_bytes: usize,
        bucket_cap_bytes: usize,
    ) -> Result<Reducer> {
        let (names, params): (Vec<String>, Vec<Tensor>) = named.into_iter().unzip();
        let numels: Vec<usize> = params.iter().map(Tensor::numel).collect();
        let buckets: Vec<Bucket> = assign_buckets(&numels, first_bucket_bytes, bucket_cap_bytes)
            .into_iter()
            .map(|params| Bucket { params })
            .collect();
        let mut param_bucket = vec![0; params.len()];
        for (bi, b) in buckets.iter().enumerate() {
            for &p in &b.params {
                param_bucket[p] = bi;
            }
        }
        let n = params.len();
        let nb = buckets.len();
        let buffers = buckets
            .iter()
            .map(|b| BucketBuffers::new(&b.params.iter().map(|&p| &params[p]).collect::<Vec<_>>()).map(Some))
            .collect::<Result<Vec<_>>>()?;
        Ok(Reducer {
            comm,
            names,
            params,
            param_bucket,
            on_thread: !std::env::var("FERRITE_DDP_COMM_THREAD").is_ok_and(|v| v.trim() == "0"),
            state: Mutex::new(StepState {
                active: false,
                ready: vec![false; n],
                remaining: vec![0; nb],
                next_launch: 0,
                buffers,
                pending: (0..nb).map(|_| None).collect(),
                error: None,
                started: None,
                flatten: Duration::ZERO,
                timings: StepTimings::default(),
            }),
            buckets,
        })
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

    /// The timings of the last synchronizing backward.
    pub(crate) fn timings(&self) -> StepTimings {
        self.state.lock().timings
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
        s.flatten = Duration::ZERO;
        s.started = Some(Instant::now());
    }

    fn mark_ready(&self, param: usize) {
        let mut s = self.state.lock();
        if !s.active || s.ready[param] {
            return;
        }
        s.ready[param] = true;
        s.remaining[self.param_bucket[param]] -= 1;
        // Let MPI advance the buckets already started (it only progresses inside MPI calls).
        s.pending.iter_mut().flatten().for_each(Started::progress);
        while s.next_launch < self.buckets.len() && s.remaining[s.next_launch] == 0 {
            let bi = s.next_launch;
            self.launch(&mut s, bi);
        }
    }

    /// The parameters of bucket `bi`, in bucket order.
    fn bucket_params(&self, bi: usize) -> Vec<&Tensor> {
        self.buckets[bi].params.iter().map(|&p| &self.params[p]).collect()
    }

    fn launch(&self, s: &mut StepState, bi: usize) {
        s.next_launch = bi + 1;
        let t = Instant::now();
        let Some(mut buffers) = s.buffers[bi].take() else {
            // Lost with an all-reduce that never finished: the group is broken, and `finish`
            // reports that this bucket could not be queued.
            s.pending[bi] = None;
            return;
        };
        if s.error.is_none()
            && let Err(e) = buffers.fill(&self.bucket_params(bi))
        {
            s.error = Some(e);
        }
        if s.error.is_some() {
            // Keep pairing with the other ranks even after a local error: send zeros.
            if let Err(e) = buffers.fill_zeros() {
                s.error.get_or_insert(e);
            }
        }
        s.flatten += t.elapsed();
        s.pending[bi] = if self.on_thread {
            self.comm.all_reduce_bucket(buffers).ok().map(Started::Thread)
        } else {
            self.comm.start_all_reduce(buffers).ok().map(Started::Inline)
        };
    }

    /// After backward: start the buckets still waiting (parameters without a gradient), wait for
    /// every bucket, and write the averaged gradients back. `allow_unused = false` turns a
    /// parameter whose hook never fired into [`DistributedError::UnusedParameters`] (the buckets
    /// are still exchanged, so the other ranks are not left waiting).
    pub(crate) fn finish(&self, allow_unused: bool) -> Result<()> {
        let backward_end = Instant::now();
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
        let waited = Instant::now();
        let outcome = if let Some(e) = error {
            Err(e)
        } else if !allow_unused && !unused.is_empty() {
            Err(DistributedError::UnusedParameters { rank: self.comm.rank(), names: unused })
        } else {
            self.write_back(&mut results)
        };
        let mut s = self.state.lock();
        let started = s.started.unwrap_or(backward_end);
        let mut t = StepTimings {
            buckets: results.len(),
            backward: backward_end.saturating_duration_since(started),
            exposed_wait: waited.saturating_duration_since(backward_end),
            flatten: s.flatten,
            write_back: waited.elapsed(),
            ..StepTimings::default()
        };
        for (bi, r) in results.into_iter().enumerate() {
            if let (Some(a), Some(b)) = (r.started, r.finished) {
                t.communication += b.saturating_duration_since(a);
                t.hidden += backward_end.min(b).saturating_duration_since(a);
            }
            s.buffers[bi] = Some(r);
        }
        s.timings = t;
        outcome
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
        for (bi, p) in pending.into_iter().enumerate() {
            let Some(p) = p else { continue };
            match p.wait() {
                Ok(r) => self.state.lock().buffers[bi] = Some(r),
                Err(_) => return,
            }
        }
    }

    /// Average the sums and hand them to the parameters some rank used: as views into the
    /// buckets where the gradients can be (see [`BucketBuffers::write_back`]), else by a copy.
    fn write_back(&self, results: &mut [BucketBuffers]) -> Result<()> {
        let scale = 1.0 / self.comm.world_size() as f32;
        for (bi, r) in results.iter_mut().enumerate() {
            r.write_back(&self.bucket_params(bi), scale)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::StepTimings;

    #[test]
    fn hidden_share_is_the_part_of_communication_during_backward() {
        let ms = Duration::from_millis;
        let t = StepTimings { communication: ms(4), hidden: ms(1), ..StepTimings::default() };
        assert!((t.hidden_share() - 0.25).abs() < 1e-9);
        assert_eq!(StepTimings::default().hidden_share(), 1.0, "no communication: nothing exposed");
        let t = StepTimings { communication: ms(2), hidden: ms(3), ..StepTimings::default() };
        assert_eq!(t.hidden_share(), 1.0);
    }
}
