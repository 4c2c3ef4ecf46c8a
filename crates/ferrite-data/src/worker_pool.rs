//! Background workers of a map-style loader, and putting their batches back in order.
//!
//! Workers take batch tasks from one shared queue (a slow sample does not hold up the others) and
//! send results back tagged with the batch number; the iterator holds finished batches until their
//! turn, so batches arrive in sampler order. Which worker loads which batch is therefore not fixed
//! — and does not need to be, because a batch's randomness is keyed to its position in the epoch,
//! not to a worker. The pool never has more than `prefetch` batches in flight or waiting.
//!
//! Shutdown (end of epoch, error, or the iterator dropped mid-epoch) raises a cancel flag that
//! workers check between samples, closes the task queue and joins every thread: an in-flight
//! `get` call is allowed to finish, nothing else is started.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::collate::Collate;
use crate::dataset::{Dataset, WorkerInfo, set_worker_info};
use crate::error::{DataError, Origin};
use crate::fetch::{Pipeline, Task};
use crate::seeding::EpochSeed;

/// How often a waiting iterator checks that its workers are alive and its timeout has not passed.
pub(crate) const LIVENESS_POLL: Duration = Duration::from_millis(50);

type BatchResult<B> = (usize, Result<B, DataError>);

pub(crate) struct WorkerPool<B> {
    tasks: Option<Sender<Task>>,
    results: Receiver<BatchResult<B>>,
    handles: Vec<JoinHandle<()>>,
    cancel: Arc<AtomicBool>,
    ready: BTreeMap<usize, Result<B, DataError>>,
}

impl<B: Send + 'static> WorkerPool<B> {
    pub fn spawn<D>(
        pipeline: Arc<Pipeline<D, impl Collate<D::Sample, Batch = B>>>,
        epoch: &EpochSeed,
        num_workers: usize,
    ) -> Result<WorkerPool<B>, DataError>
    where
        D: Dataset,
    {
        let (task_tx, task_rx) = crossbeam_channel::unbounded::<Task>();
        let (result_tx, result_rx) = crossbeam_channel::unbounded::<BatchResult<B>>();
        let cancel = Arc::new(AtomicBool::new(false));
        let mut pool = WorkerPool {
            tasks: Some(task_tx),
            results: result_rx,
            handles: Vec::with_capacity(num_workers),
            cancel,
            ready: BTreeMap::new(),
        };
        for id in 0..num_workers {
            let pipeline = Arc::clone(&pipeline);
            let epoch = epoch.clone();
            let tasks = task_rx.clone();
            let results = result_tx.clone();
            let cancel = Arc::clone(&pool.cancel);
            let info = WorkerInfo::new(id, num_workers, epoch.clone());
            let spawned = std::thread::Builder::new().name(format!("ferrite-data-worker-{id}")).spawn(move || {
                set_worker_info(Some(info));
                while let Ok(task) = tasks.recv() {
                    if cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    let batch = task.batch;
                    let Some(result) = pipeline.fetch(&epoch, task, Origin::Worker(id), &cancel) else { return };
                    if results.send((batch, result)).is_err() {
                        return;
                    }
                }
            });
            match spawned {
                Ok(h) => pool.handles.push(h),
                Err(source) => {
                    // `pool` is dropped here, which stops and joins the workers already started.
                    return Err(DataError::InvalidConfig(format!(
                        "could not start data-loader worker {id} of {num_workers}: {source}"
                    )));
                }
            }
        }
        Ok(pool)
    }

    pub fn submit(&self, task: Task) {
        if let Some(tx) = &self.tasks {
            // Fails only if every worker has exited; `wait_for` then reports it.
            let _ = tx.send(task);
        }
    }

    /// Block until batch `batch` is ready (batches finished earlier are kept for their turn).
    pub fn wait_for(&mut self, batch: usize, timeout: Option<Duration>) -> Result<B, DataError> {
        let start = Instant::now();
        loop {
            if let Some(r) = self.ready.remove(&batch) {
                return r;
            }
            let poll = match timeout {
                Some(t) => LIVENESS_POLL.min(t.saturating_sub(start.elapsed())).max(Duration::from_millis(1)),
                None => LIVENESS_POLL,
            };
            match self.results.recv_timeout(poll) {
                Ok((b, r)) => {
                    self.ready.insert(b, r);
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(t) = timeout
                        && start.elapsed() >= t
                    {
                        return Err(DataError::Timeout { batch, waited: start.elapsed() });
                    }
                    if let Some(worker) = self.handles.iter().position(|h| h.is_finished()) {
                        return Err(DataError::WorkerDied { worker, batch });
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let worker = self.handles.iter().position(|h| h.is_finished()).unwrap_or(0);
                    return Err(DataError::WorkerDied { worker, batch });
                }
            }
        }
    }

    /// Stop and join every worker. Idempotent.
    pub fn shutdown(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        self.tasks = None;
        for h in self.handles.drain(..) {
            // A worker thread cannot panic (user code runs under catch_unwind); if it somehow
            // did, there is nothing left to report to during shutdown.
            let _ = h.join();
        }
        self.ready.clear();
    }
}

impl<B> Drop for WorkerPool<B> {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        self.tasks = None;
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}
