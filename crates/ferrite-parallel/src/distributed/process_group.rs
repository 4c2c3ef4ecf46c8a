//! The MPI world of this process, driven from one communication thread.
//!
//! MPI is initialized once per process (with `MPI_THREAD_MULTIPLE`, at least `SERIALIZED`); after
//! that the communication thread calls MPI, one collective at a time in the order jobs were
//! queued, so every rank issues the same collectives in the same order. The one exception, when
//! `FERRITE_DDP_COMM_THREAD=0` asks for it, is a step's gradient buckets started with non-blocking
//! MPI on the training thread ([`Comm::start_all_reduce`]) while the communication thread is idle
//! (no hand-off, but it overlaps less: `MPI_Iallreduce` advances only inside MPI calls). The training thread
//! queues jobs and waits for their replies with a deadline ([`Comm::timeout`]): a peer that died
//! becomes a [`DistributedError::PeerDied`] naming it (the liveness probe of [`super::liveness`]
//! tells a dead peer from a hung one), one that hangs a [`DistributedError::Timeout`], instead of
//! a hang; the blocked thread is left behind (the process must then exit; MPI_Finalize is
//! skipped, as it would wait for the dead peer too).

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferrite_io::{FaultPoint, fault_point};
use mpi::Threading;
use mpi::collective::{SystemOperation, UnsafeUserOperation};
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Root};

use super::bucket::BucketBuffers;
use super::comm_dtype::{self, CommDtype};
use super::error::{DistributedError, Result};
use super::liveness::{self, ENDPOINT_BYTES, Liveness};

/// Bytes of one rank's status message in [`Comm::all_gather_status`].
const STATUS_BYTES: usize = 512;

/// Default deadline of one collective; `FERRITE_DDP_TIMEOUT_S` overrides it.
pub const DEFAULT_TIMEOUT_S: u64 = 30;

/// This process's place in an MPI job: rank, world size, and the communication thread.
///
/// Create one per process with [`ProcessGroup::init`] (under `mpirun -np N`, or alone as a world
/// of one) and keep it alive until training ends; dropping it finalizes MPI.
pub struct ProcessGroup {
    comm: Comm,
    thread: Option<JoinHandle<()>>,
    stopped: Receiver<()>,
    universe: ManuallyDrop<Universe>,
}

/// A cheap handle for queueing collectives (what wrappers and hooks keep).
#[derive(Clone)]
pub struct Comm {
    rank: usize,
    size: usize,
    jobs: Sender<Job>,
    timeout: Duration,
    broken: Arc<AtomicBool>,
    /// Every rank's liveness listener, exchanged when the group starts.
    liveness: Arc<OnceLock<Liveness>>,
    /// Nanoseconds the communication thread has spent inside collectives (see
    /// [`Comm::busy_time`]).
    busy: Arc<AtomicU64>,
}

enum Job {
    AllReduceSumF32 {
        data: Vec<f32>,
        reply: Sender<Vec<f32>>,
    },
    AllReduceBucket {
        buffers: BucketBuffers,
        reply: Sender<Result<BucketBuffers>>,
    },
    AllGatherF64 {
        data: Vec<f64>,
        reply: Sender<Vec<f64>>,
    },
    AllGatherF32 {
        data: Vec<f32>,
        reply: Sender<Vec<f32>>,
    },
    ReduceScatterF32 {
        data: Vec<f32>,
        reply: Sender<Vec<f32>>,
    },
    /// f32 values in and out, bf16 on the wire (see `comm_dtype`).
    AllGatherBf16 {
        data: Vec<f32>,
        reply: Sender<Vec<f32>>,
    },
    ReduceScatterBf16 {
        data: Vec<f32>,
        reply: Sender<Vec<f32>>,
    },
    AllGatherBytes {
        data: Vec<u8>,
        reply: Sender<Vec<u8>>,
    },
    BroadcastF64 {
        data: Vec<f64>,
        reply: Sender<Vec<f64>>,
    },
    BroadcastBytes {
        data: Vec<u8>,
        reply: Sender<Vec<u8>>,
    },
    Shutdown,
}

impl ProcessGroup {
    /// Initialize MPI and start the communication thread.
    pub fn init() -> Result<ProcessGroup> {
        let Some((universe, provided)) = mpi::initialize_with_threading(Threading::Multiple) else {
            return Err(DistributedError::AlreadyInitialized);
        };
        if provided < Threading::Serialized {
            return Err(DistributedError::ThreadSupport { provided: format!("{provided:?}") });
        }
        let world = universe.world();
        let rank = world.rank() as usize;
        let size = world.size() as usize;
        let timeout_s = std::env::var("FERRITE_DDP_TIMEOUT_S")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|s| *s > 0)
            .unwrap_or(DEFAULT_TIMEOUT_S);
        let (jobs, rx) = mpsc::channel::<Job>();
        let (stopped_tx, stopped) = mpsc::channel::<()>();
        let busy = Arc::new(AtomicU64::new(0));
        let busy_thread = busy.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ferrite-mpi-rank{rank}"))
            .spawn(move || {
                comm_thread(rx, &busy_thread);
                let _ = stopped_tx.send(());
            })
            .map_err(|e| DistributedError::CommunicationStopped { rank, detail: format!("cannot start it: {e}") })?;
        let comm = Comm {
            rank,
            size,
            jobs,
            timeout: Duration::from_secs(timeout_s),
            broken: Arc::default(),
            liveness: Arc::default(),
            busy,
        };
        let group = ProcessGroup { comm, thread: Some(thread), stopped, universe: ManuallyDrop::new(universe) };
        // Every rank's liveness listener, so that a rank that later waits in vain can name a dead
        // peer. The first collective: a rank that cannot join it fails here, by the deadline.
        let listener = liveness::listen();
        let mine = listener.endpoint.encode();
        debug_assert_eq!(mine.len(), ENDPOINT_BYTES);
        let all = group.comm.queue("start-up exchange", |reply| Job::AllGatherBytes { data: mine, reply })?.wait()?;
        let _ = group.comm.liveness.set(Liveness::new(rank, &listener, &all));
        Ok(group)
    }

    pub fn rank(&self) -> usize {
        self.comm.rank
    }

    pub fn world_size(&self) -> usize {
        self.comm.size
    }

    /// A handle for queueing collectives on this group.
    pub fn comm(&self) -> Comm {
        self.comm.clone()
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.comm.is_broken() || self.comm.jobs.send(Job::Shutdown).is_err() {
            // A collective never finished: MPI_Finalize would wait for the dead peer as well.
            return;
        }
        if self.stopped.recv_timeout(self.comm.timeout).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
            // SAFETY: dropped exactly once, here, after the communication thread (the only other
            // MPI caller) has returned; dropping the Universe calls MPI_Finalize.
            unsafe { ManuallyDrop::drop(&mut self.universe) };
        }
    }
}

fn comm_thread(rx: Receiver<Job>, busy: &AtomicU64) {
    // MPI_COMM_WORLD; only this thread calls MPI after initialization.
    let world = SimpleCommunicator::world();
    let root = world.process_at_rank(0);
    // SAFETY: `bf16_sum` reads and writes `len` u16 values, and it is only used below with
    // `u16` buffers (MPI_UNSIGNED_SHORT).
    let bf16_sum = unsafe { UnsafeUserOperation::commutative(comm_dtype::bf16_sum) };
    while let Ok(job) = rx.recv() {
        let started = Instant::now();
        if matches!(job, Job::Shutdown) {
            break;
        }
        match job {
            Job::AllReduceSumF32 { data, reply } => {
                let mut out = vec![0f32; data.len()];
                world.all_reduce_into(&data[..], &mut out[..], SystemOperation::sum());
                let _ = reply.send(out);
            }
            Job::AllReduceBucket { mut buffers, reply } => {
                let Some((send, recv, n)) = buffers.raw() else {
                    let _ = reply.send(Err(not_host(world.rank() as usize)));
                    continue;
                };
                buffers.started = Some(Instant::now());
                // SAFETY: `raw` gives two distinct host allocations of `n` contiguous f32, kept
                // alive by `buffers`, which this thread owns until it replies. Nothing else
                // touches them meanwhile: the reducer hands a bucket over only after filling it
                // and reads its views again only after this reply (the gradients that view the
                // send side are only read, by MPI, while the bucket is in flight).
                let (send, recv) =
                    unsafe { (std::slice::from_raw_parts(send, n), std::slice::from_raw_parts_mut(recv, n)) };
                // Testing hook (FERRITE_FAULT_INJECT=at:allreduce): die as the bucket goes out,
                // the peers already inside the all-reduce.
                fault_point(FaultPoint::AllReduce);
                world.all_reduce_into(send, recv, SystemOperation::sum());
                buffers.finished = Some(Instant::now());
                let _ = reply.send(Ok(buffers));
            }
            Job::AllGatherF64 { data, reply } => {
                let mut out = vec![0f64; data.len() * world.size() as usize];
                world.all_gather_into(&data[..], &mut out[..]);
                let _ = reply.send(out);
            }
            Job::AllGatherF32 { data, reply } => {
                let mut out = vec![0f32; data.len() * world.size() as usize];
                world.all_gather_into(&data[..], &mut out[..]);
                let _ = reply.send(out);
            }
            Job::ReduceScatterF32 { data, reply } => {
                // `Comm::reduce_scatter_sum_f32` checked that the length divides by the world size.
                let mut out = vec![0f32; data.len() / world.size() as usize];
                world.reduce_scatter_block_into(&data[..], &mut out[..], SystemOperation::sum());
                let _ = reply.send(out);
            }
            Job::AllGatherBf16 { data, reply } => {
                let send = comm_dtype::pack(&data);
                let mut out = vec![0u16; send.len() * world.size() as usize];
                world.all_gather_into(&send[..], &mut out[..]);
                let _ = reply.send(comm_dtype::unpack(&out));
            }
            Job::ReduceScatterBf16 { data, reply } => {
                // `Comm::reduce_scatter_sum` checked that the length divides by the world size.
                let send = comm_dtype::pack(&data);
                let mut out = vec![0u16; send.len() / world.size() as usize];
                world.reduce_scatter_block_into(&send[..], &mut out[..], &bf16_sum);
                let _ = reply.send(comm_dtype::unpack(&out));
            }
            Job::AllGatherBytes { data, reply } => {
                let mut out = vec![0u8; data.len() * world.size() as usize];
                world.all_gather_into(&data[..], &mut out[..]);
                let _ = reply.send(out);
            }
            Job::BroadcastF64 { mut data, reply } => {
                // Testing hook (FERRITE_FAULT_INJECT=at:broadcast).
                fault_point(FaultPoint::Broadcast);
                let mut len = data.len() as u64;
                root.broadcast_into(&mut len);
                data.resize(len as usize, 0.0);
                root.broadcast_into(&mut data[..]);
                let _ = reply.send(data);
            }
            Job::BroadcastBytes { mut data, reply } => {
                // Testing hook (FERRITE_FAULT_INJECT=at:broadcast).
                fault_point(FaultPoint::Broadcast);
                let mut len = data.len() as u64;
                root.broadcast_into(&mut len);
                data.resize(len as usize, 0);
                root.broadcast_into(&mut data[..]);
                let _ = reply.send(data);
            }
            Job::Shutdown => break,
        }
        busy.fetch_add(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

fn not_host(rank: usize) -> DistributedError {
    DistributedError::CommunicationStopped { rank, detail: "a gradient bucket is not in host memory".into() }
}

/// A collective queued on the communication thread; [`wait`](Pending::wait) for its result.
pub struct Pending<T> {
    rx: Receiver<T>,
    comm: Comm,
    op: &'static str,
}

impl<T> Pending<T> {
    /// The result, or a typed error once the group's deadline passes.
    pub fn wait(self) -> Result<T> {
        match self.rx.recv_timeout(self.comm.timeout) {
            Ok(v) => Ok(v),
            Err(RecvTimeoutError::Timeout) => Err(self.comm.lost(self.op)),
            Err(RecvTimeoutError::Disconnected) => {
                self.comm.broken.store(true, Ordering::SeqCst);
                Err(DistributedError::CommunicationStopped {
                    rank: self.comm.rank,
                    detail: format!("it ended during {}", self.op),
                })
            }
        }
    }
}

/// How long [`InFlight::wait`] polls MPI without pausing before it sleeps between polls: an
/// all-reduce that is on time finishes at full speed; one waiting for a late peer stops taking
/// the core that peer may need.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_millis(2);

/// An all-reduce started with `MPI_Iallreduce` on the calling thread ([`Comm::start_all_reduce`]):
/// no hand-off to the communication thread and no thread spinning beside backward; MPI advances
/// it when [`test`](Self::test) or [`wait`](Self::wait) is called.
pub(crate) struct InFlight {
    request: ffi::MPI_Request,
    /// Read and written by MPI until the request completes: never touched, moved out or freed
    /// before that (the tensors' memory stays put when the handles move).
    buffers: Option<BucketBuffers>,
    comm: Comm,
}

// SAFETY: an MPI request handle may be completed from any thread under MPI_THREAD_SERIALIZED or
// MULTIPLE (ProcessGroup::init requires one of them); the reducer keeps every InFlight behind
// its mutex, so no two threads call MPI on it at once.
unsafe impl Send for InFlight {}

fn request_is_null(r: ffi::MPI_Request) -> bool {
    // SAFETY: reading an immutable constant that mpi-sys exports.
    r == unsafe { ffi::RSMPI_REQUEST_NULL }
}

impl InFlight {
    /// Let MPI advance the all-reduce; whether it has finished.
    pub(crate) fn test(&mut self) -> bool {
        if request_is_null(self.request) {
            return true;
        }
        let mut flag: std::os::raw::c_int = 0;
        // SAFETY: `request` is an active request started by MPI_Iallreduce; MPI_Test sets it to
        // MPI_REQUEST_NULL once complete, and the status is ignored.
        unsafe { ffi::MPI_Test(&mut self.request, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        if flag != 0
            && let Some(b) = self.buffers.as_mut()
        {
            b.finished = Some(Instant::now());
        }
        flag != 0
    }

    /// The buffers once the all-reduce has finished, or a [`DistributedError::Timeout`] after the
    /// group's deadline (the buffers are then left to MPI and the group is marked broken).
    pub(crate) fn wait(mut self) -> Result<BucketBuffers> {
        let start = Instant::now();
        while !self.test() {
            let waited = start.elapsed();
            if waited > self.comm.timeout {
                return Err(self.comm.lost("all-reduce"));
            }
            if waited > SPIN_BEFORE_SLEEP {
                std::thread::sleep(Duration::from_micros(100));
            } else {
                std::hint::spin_loop();
            }
        }
        self.buffers.take().ok_or_else(|| DistributedError::CommunicationStopped {
            rank: self.comm.rank,
            detail: "an all-reduce lost its buffers".into(),
        })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !request_is_null(self.request) {
            // MPI may still write into the buffers: leak them rather than free memory in use.
            self.comm.broken.store(true, Ordering::SeqCst);
            std::mem::forget(self.buffers.take());
        }
    }
}

/// One rank's answer in [`Comm::all_gather_status`]: `None` when healthy, else its message.
pub type RankStatus = Option<String>;

impl Comm {
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.size
    }

    /// How long one collective may take before the peers are declared lost.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A collective `op` missed the deadline: the group is broken from now on, and the error names
    /// the peers whose process is gone ([`DistributedError::PeerDied`]), found by probing every
    /// peer's liveness listener, else says that no one answered in time. The peers still alive are
    /// told that this rank leaves. At most 0.65 s in all (see [`super::liveness`]).
    fn lost(&self, op: &'static str) -> DistributedError {
        self.broken.store(true, Ordering::SeqCst);
        let waited_s = self.timeout.as_secs();
        let dead = match self.liveness.get() {
            Some(l) => {
                let states = l.probe();
                // This rank stops now: say so, so that a slower survivor does not name it.
                l.announce_departure(&states);
                liveness::dead_ranks(&states)
            }
            None => Vec::new(),
        };
        if dead.is_empty() {
            DistributedError::Timeout { rank: self.rank, op, waited_s }
        } else {
            DistributedError::PeerDied { rank: self.rank, dead, op, waited_s }
        }
    }

    /// How long the communication thread has spent inside collectives since the group started
    /// (queued jobs only; a bucket started on the training thread with non-blocking MPI is not
    /// counted). The difference over a step, against the time the training thread waited for
    /// replies, is how much communication was hidden behind computation.
    pub fn busy_time(&self) -> Duration {
        Duration::from_nanos(self.busy.load(Ordering::Relaxed))
    }

    /// Whether a collective timed out or the thread stopped (no further collective is safe).
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    fn queue<T>(&self, op: &'static str, make: impl FnOnce(Sender<T>) -> Job) -> Result<Pending<T>> {
        if self.is_broken() {
            return Err(DistributedError::CommunicationStopped {
                rank: self.rank,
                detail: "an earlier collective did not finish".into(),
            });
        }
        let (tx, rx) = mpsc::channel();
        self.jobs.send(make(tx)).map_err(|_| DistributedError::CommunicationStopped {
            rank: self.rank,
            detail: format!("it ended before {op}"),
        })?;
        Ok(Pending { rx, comm: self.clone(), op })
    }

    /// Element-wise sum over ranks, started now, finished by [`Pending::wait`].
    pub fn all_reduce_sum(&self, data: Vec<f32>) -> Result<Pending<Vec<f32>>> {
        self.queue("all-reduce", |reply| Job::AllReduceSumF32 { data, reply })
    }

    /// Element-wise sum over ranks of a bucket's send side into its receive side, started now;
    /// [`Pending::wait`] hands the buckets back for the next step.
    pub(crate) fn all_reduce_bucket(&self, buffers: BucketBuffers) -> Result<Pending<Result<BucketBuffers>>> {
        self.queue("all-reduce", |reply| Job::AllReduceBucket { buffers, reply })
    }

    /// Start an element-wise sum over ranks of a bucket's send side into its receive side with
    /// `MPI_Iallreduce` on the calling thread. Only for a step's gradient buckets: the
    /// communication thread must be idle (every collective queued on it waited for), and every
    /// rank must start the same all-reduces in the same order.
    pub(crate) fn start_all_reduce(&self, mut buffers: BucketBuffers) -> Result<InFlight> {
        if self.is_broken() {
            return Err(DistributedError::CommunicationStopped {
                rank: self.rank,
                detail: "an earlier collective did not finish".into(),
            });
        }
        let (send, recv, n) = buffers.raw().ok_or_else(|| not_host(self.rank))?;
        let count = i32::try_from(n).map_err(|_| DistributedError::CommunicationStopped {
            rank: self.rank,
            detail: format!("a bucket of {n} values is over MPI's count limit; lower bucket_cap_mb"),
        })?;
        buffers.started = Some(Instant::now());
        buffers.finished = None;
        let world = SimpleCommunicator::world();
        // SAFETY: reading an immutable constant that mpi-sys exports.
        let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `send` and `recv` are two distinct host allocations of `count` f32 each, owned
        // by `buffers`, which the returned InFlight keeps alive and untouched until MPI completes
        // the request (or leaks if it never does); the datatype, operation and communicator
        // handles are valid for the life of MPI.
        unsafe {
            ffi::MPI_Iallreduce(
                send.cast(),
                recv.cast(),
                count,
                f32::equivalent_datatype().as_raw(),
                SystemOperation::sum().as_raw(),
                world.as_raw(),
                &mut request,
            )
        };
        // Testing hook (FERRITE_FAULT_INJECT=at:allreduce): die with the all-reduce started.
        fault_point(FaultPoint::AllReduce);
        Ok(InFlight { request, buffers: Some(buffers), comm: self.clone() })
    }

    /// Every rank's `data` (same length on every rank), concatenated in rank order.
    pub fn all_gather_f64(&self, data: Vec<f64>) -> Result<Vec<f64>> {
        self.queue("all-gather", |reply| Job::AllGatherF64 { data, reply })?.wait()
    }

    /// Every rank's `data` (same length on every rank), concatenated in rank order.
    pub fn all_gather_f32(&self, data: Vec<f32>) -> Result<Vec<f32>> {
        self.queue("all-gather", |reply| Job::AllGatherF32 { data, reply })?.wait()
    }

    /// [`all_gather_f32`](Self::all_gather_f32) started now (queued on the communication thread
    /// behind earlier collectives) and finished by [`Pending::wait`]: ZeRO-3's prefetch.
    pub fn start_all_gather_f32(&self, data: Vec<f32>) -> Result<Pending<Vec<f32>>> {
        self.queue("all-gather", |reply| Job::AllGatherF32 { data, reply })
    }

    /// [`start_all_gather_f32`](Self::start_all_gather_f32) with the values carried as `dtype`
    /// (bf16: rounded before they leave; what arrives is exact in f32).
    pub fn start_all_gather(&self, data: Vec<f32>, dtype: CommDtype) -> Result<Pending<Vec<f32>>> {
        match dtype {
            CommDtype::F32 => self.start_all_gather_f32(data),
            CommDtype::Bf16 => self.queue("all-gather", |reply| Job::AllGatherBf16 { data, reply }),
        }
    }

    /// [`reduce_scatter_sum_f32`](Self::reduce_scatter_sum_f32) with the values carried and
    /// summed as `dtype` (bf16: every partial sum rounded to bf16, as NCCL sums bf16).
    pub fn reduce_scatter_sum(&self, data: Vec<f32>, dtype: CommDtype) -> Result<Pending<Vec<f32>>> {
        match dtype {
            CommDtype::F32 => self.reduce_scatter_sum_f32(data),
            CommDtype::Bf16 => {
                self.check_divides(data.len())?;
                self.queue("reduce-scatter", |reply| Job::ReduceScatterBf16 { data, reply })
            }
        }
    }

    fn check_divides(&self, len: usize) -> Result<()> {
        if !len.is_multiple_of(self.size) {
            return Err(DistributedError::CommunicationStopped {
                rank: self.rank,
                detail: format!(
                    "a reduce-scatter of {len} values does not divide into {} equal blocks (a bug in the caller)",
                    self.size
                ),
            });
        }
        Ok(())
    }

    /// `MPI_Reduce_scatter_block` with a sum: `data` is `world_size` equal blocks; rank `r`
    /// receives the element-wise sum over ranks of every rank's block `r`. Started now, finished
    /// by [`Pending::wait`] (several queued back to back run in order on the communication thread).
    pub fn reduce_scatter_sum_f32(&self, data: Vec<f32>) -> Result<Pending<Vec<f32>>> {
        self.check_divides(data.len())?;
        self.queue("reduce-scatter", |reply| Job::ReduceScatterF32 { data, reply })
    }

    /// Rank 0's `data` on every rank (other ranks' input is ignored).
    pub fn broadcast_f64(&self, data: Vec<f64>) -> Result<Vec<f64>> {
        self.queue("broadcast", |reply| Job::BroadcastF64 { data, reply })?.wait()
    }

    /// Rank 0's bytes on every rank.
    pub fn broadcast_bytes(&self, data: Vec<u8>) -> Result<Vec<u8>> {
        self.queue("broadcast", |reply| Job::BroadcastBytes { data, reply })?.wait()
    }

    /// Every rank's status, in rank order: how ranks agree that all of them are healthy, or
    /// learn which one failed and why (messages are cut to 511 bytes).
    pub fn all_gather_status(&self, mine: Option<&str>) -> Result<Vec<RankStatus>> {
        let mut data = vec![0u8; STATUS_BYTES];
        if let Some(msg) = mine {
            data[0] = 1;
            let mut end = msg.len().min(STATUS_BYTES - 1);
            while !msg.is_char_boundary(end) {
                end -= 1;
            }
            data[1..1 + end].copy_from_slice(&msg.as_bytes()[..end]);
        }
        let all = self.queue("status exchange", |reply| Job::AllGatherBytes { data, reply })?.wait()?;
        Ok(all
            .chunks(STATUS_BYTES)
            .map(|c| {
                (c[0] != 0).then(|| {
                    let text = &c[1..];
                    let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
                    String::from_utf8_lossy(&text[..end]).into_owned()
                })
            })
            .collect())
    }

    /// The first failed rank in `statuses`, as an error.
    pub fn first_failure(statuses: &[RankStatus]) -> Option<DistributedError> {
        statuses.iter().enumerate().find_map(|(rank, s)| {
            s.as_ref().map(|message| DistributedError::PeerFailed { rank, message: message.clone() })
        })
    }
}
