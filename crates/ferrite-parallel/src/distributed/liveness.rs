//! Which peer died: how a rank that gave up waiting names the dead rank.
//!
//! MPI (without the fault-tolerance extensions) cannot tell a survivor that a peer is gone: a
//! collective with a dead member simply never finishes, and the deadline of [`super::Comm`] only
//! says "no answer". So every rank also keeps a tiny TCP listener whose only job is to exist
//! while the process does: when the process dies — even by SIGKILL — the kernel closes it, and a
//! connection attempt to its port is refused at once. When a collective misses its deadline the
//! rank tries every peer's listener (in parallel, under half a second in all) and learns which
//! ranks are gone ([`PeerState::Dead`]), which still answer (alive but late, or hung) and which it
//! could not reach. The listeners' addresses are exchanged once, when the process group starts.
//!
//! Peers on the same host (the same hostname) are reached at 127.0.0.1, others by their
//! hostname. Without a listener (no socket could be bound) a rank is reported as unknown, and
//! the error falls back to the plain deadline message.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The most a probe of all peers takes (the survivors must stop within the deadline + 1 s).
pub(crate) const PROBE_BUDGET: Duration = Duration::from_millis(500);

/// Bytes of one rank's endpoint in the exchange: port (2), hostname length (1), hostname.
pub(crate) const ENDPOINT_BYTES: usize = 3 + 255;

/// What a probe learned about one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerState {
    /// Its listener answered: the process is alive (late, or hung).
    Alive,
    /// Its port refused the connection: the process is gone.
    Dead,
    /// No answer in time, no address, or no listener: cannot tell.
    Unknown,
}

/// One rank's listener address as exchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub(crate) host: String,
    /// 0: that rank has no listener.
    pub(crate) port: u16,
}

/// This rank's listener (kept open for the life of the process) and every rank's endpoint.
pub(crate) struct Liveness {
    rank: usize,
    endpoints: Vec<Endpoint>,
}

/// Start this process's listener; its endpoint (port 0 when none could be bound).
pub(crate) fn listen() -> Endpoint {
    let host = hostname();
    let port = match TcpListener::bind(("0.0.0.0", 0)) {
        Ok(listener) => {
            let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
            // Accept and drop: a connection that is accepted is the whole answer. The thread
            // lives as long as the process (the listener must close only when the process dies).
            let spawned = std::thread::Builder::new().name("ferrite-liveness".into()).spawn(move || {
                for conn in listener.incoming() {
                    drop(conn);
                }
            });
            if spawned.is_ok() { port } else { 0 }
        }
        Err(_) => 0,
    };
    Endpoint { host, port }
}

impl Endpoint {
    /// The fixed-size form exchanged with the other ranks.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; ENDPOINT_BYTES];
        out[..2].copy_from_slice(&self.port.to_le_bytes());
        let mut end = self.host.len().min(255);
        while !self.host.is_char_boundary(end) {
            end -= 1;
        }
        out[2] = end as u8;
        out[3..3 + end].copy_from_slice(&self.host.as_bytes()[..end]);
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Endpoint {
        if bytes.len() < 3 {
            return Endpoint { host: String::new(), port: 0 };
        }
        let port = u16::from_le_bytes([bytes[0], bytes[1]]);
        let len = (bytes[2] as usize).min(bytes.len() - 3);
        Endpoint { host: String::from_utf8_lossy(&bytes[3..3 + len]).into_owned(), port }
    }
}

impl Liveness {
    /// From every rank's encoded endpoint, concatenated in rank order.
    pub(crate) fn new(rank: usize, all: &[u8]) -> Liveness {
        Liveness { rank, endpoints: all.chunks(ENDPOINT_BYTES).map(Endpoint::decode).collect() }
    }

    /// Try every other rank's listener at once; each rank's state, this rank's own `Alive`.
    /// Returns within [`PROBE_BUDGET`] (a peer that has not answered by then is `Unknown`).
    pub(crate) fn probe(&self) -> Vec<PeerState> {
        let deadline = Instant::now() + PROBE_BUDGET;
        let me = self.endpoints.get(self.rank).map(|e| e.host.clone()).unwrap_or_default();
        let (tx, rx) = mpsc::channel();
        let mut states = vec![PeerState::Unknown; self.endpoints.len()];
        let mut waiting = 0;
        for (rank, endpoint) in self.endpoints.iter().enumerate() {
            if rank == self.rank {
                states[rank] = PeerState::Alive;
                continue;
            }
            if endpoint.port == 0 {
                continue;
            }
            let (tx, endpoint, local) = (tx.clone(), endpoint.clone(), endpoint.host == me);
            // Name resolution and connecting may block: each on its own thread, and a thread
            // still blocked after the budget is left behind (its answer is not waited for).
            let spawned = std::thread::Builder::new()
                .name("ferrite-probe".into())
                .spawn(move || {
                    let _ = tx.send((rank, probe_one(&endpoint, local, deadline)));
                });
            if spawned.is_ok() {
                waiting += 1;
            }
        }
        drop(tx);
        while waiting > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((rank, state)) => {
                    states[rank] = state;
                    waiting -= 1;
                }
                Err(_) => break,
            }
        }
        states
    }
}

fn probe_one(endpoint: &Endpoint, local: bool, deadline: Instant) -> PeerState {
    let addrs: Vec<SocketAddr> = if local {
        vec![SocketAddr::from(([127, 0, 0, 1], endpoint.port))]
    } else {
        match (endpoint.host.as_str(), endpoint.port).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(_) => return PeerState::Unknown,
        }
    };
    let mut state = PeerState::Unknown;
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(_) => return PeerState::Alive,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => state = PeerState::Dead,
            Err(_) => {}
        }
    }
    state
}

/// This machine's name (Linux: the kernel's; elsewhere `$HOSTNAME`), or empty.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Ranks in `states` that are [`PeerState::Dead`].
pub(crate) fn dead_ranks(states: &[PeerState]) -> Vec<usize> {
    states.iter().enumerate().filter(|(_, s)| **s == PeerState::Dead).map(|(r, _)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_round_trip_through_their_fixed_size_form() {
        let e = Endpoint { host: "node-7.cluster".into(), port: 40123 };
        let bytes = e.encode();
        assert_eq!(bytes.len(), ENDPOINT_BYTES);
        assert_eq!(Endpoint::decode(&bytes), e);
        let long = Endpoint { host: "é".repeat(200), port: 1 };
        let back = Endpoint::decode(&long.encode());
        assert!(back.host.len() <= 255 && long.host.starts_with(&back.host), "cut on a char boundary");
        assert_eq!(Endpoint::decode(&[1]), Endpoint { host: String::new(), port: 0 });
    }

    /// A live listener answers, a closed port is refused (as a SIGKILLed rank's is), and a rank
    /// without a listener is unknown; the probe keeps to its budget.
    #[test]
    fn a_probe_tells_a_live_peer_from_a_dead_one() {
        let me = listen();
        assert_ne!(me.port, 0, "a listener on this machine");
        let alive = listen();
        let dead = {
            let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
            let port = l.local_addr().unwrap().port();
            drop(l);
            Endpoint { host: me.host.clone(), port }
        };
        let none = Endpoint { host: me.host.clone(), port: 0 };
        let all: Vec<u8> = [&me, &alive, &dead, &none].iter().flat_map(|e| e.encode()).collect();
        let start = Instant::now();
        let states = Liveness::new(0, &all).probe();
        assert!(start.elapsed() <= PROBE_BUDGET + Duration::from_millis(100), "{:?}", start.elapsed());
        assert_eq!(states, vec![PeerState::Alive, PeerState::Alive, PeerState::Dead, PeerState::Unknown]);
        assert_eq!(dead_ranks(&states), vec![2]);
    }
}
