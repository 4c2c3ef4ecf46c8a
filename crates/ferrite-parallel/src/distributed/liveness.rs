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
//! A survivor that gives up exits too, and its port then refuses connections like a dead rank's:
//! a slower survivor probing a moment later would name it as dead. So before stopping, a rank
//! that gave up tells every peer still answering that it leaves (`left R`, acknowledged by the
//! peer's listener before the rank goes on to exit); a refused port whose rank said so is
//! [`PeerState::Left`], not dead.
//!
//! Peers on the same host (the same hostname) are reached at 127.0.0.1, others by their
//! hostname. Without a listener (no socket could be bound) a rank is reported as unknown, and
//! the error falls back to the plain deadline message.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The most a probe of all peers takes (the survivors must stop within the deadline + 1 s).
pub(crate) const PROBE_BUDGET: Duration = Duration::from_millis(400);

/// The most telling the peers that this rank leaves takes.
pub(crate) const DEPARTURE_BUDGET: Duration = Duration::from_millis(250);

/// How long the listener waits for a connection's message (a probe sends none and closes).
const READ_WAIT: Duration = Duration::from_millis(100);

/// Bytes of one rank's endpoint in the exchange: port (2), hostname length (1), hostname.
pub(crate) const ENDPOINT_BYTES: usize = 3 + 255;

/// What a probe learned about one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerState {
    /// Its listener answered: the process is alive (late, or hung).
    Alive,
    /// Its port refused the connection: the process is gone.
    Dead,
    /// Its port refused the connection, but it said it was leaving (it gave up on a dead peer).
    Left,
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
    /// Ranks that said they leave (recorded by this rank's listener).
    departed: Arc<Mutex<BTreeSet<usize>>>,
}

/// This process's listener, started by [`listen`].
pub(crate) struct Listener {
    pub(crate) endpoint: Endpoint,
    departed: Arc<Mutex<BTreeSet<usize>>>,
}

/// Start this process's listener (its endpoint has port 0 when none could be bound).
pub(crate) fn listen() -> Listener {
    let host = hostname();
    let departed: Arc<Mutex<BTreeSet<usize>>> = Arc::default();
    let port = match TcpListener::bind(("0.0.0.0", 0)) {
        Ok(listener) => {
            let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
            // A connection that is accepted is the whole answer to a probe; a peer that leaves
            // sends `left R` and waits for the acknowledgement. The thread lives as long as the
            // process (the listener must close only when the process ends).
            let record = departed.clone();
            let spawned = std::thread::Builder::new().name("ferrite-liveness".into()).spawn(move || {
                for conn in listener.incoming().flatten() {
                    receive(conn, &record);
                }
            });
            if spawned.is_ok() { port } else { 0 }
        }
        Err(_) => 0,
    };
    Listener { endpoint: Endpoint { host, port }, departed }
}

/// One accepted connection: a probe (nothing sent) or a departure notice, acknowledged.
fn receive(mut conn: TcpStream, departed: &Mutex<BTreeSet<usize>>) {
    let _ = conn.set_read_timeout(Some(READ_WAIT));
    let mut buf = [0u8; 32];
    let mut len = 0;
    while len < buf.len() {
        match conn.read(&mut buf[len..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => len += n,
        }
        if buf[..len].contains(&b'\n') {
            break;
        }
    }
    let text = String::from_utf8_lossy(&buf[..len]);
    if let Some(rank) = text.strip_prefix("left ").and_then(|r| r.trim().parse::<usize>().ok()) {
        departed.lock().insert(rank);
        let _ = conn.write_all(b"k");
    }
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
    /// From this rank's listener and every rank's encoded endpoint, concatenated in rank order.
    pub(crate) fn new(rank: usize, listener: &Listener, all: &[u8]) -> Liveness {
        Liveness {
            rank,
            endpoints: all.chunks(ENDPOINT_BYTES).map(Endpoint::decode).collect(),
            departed: listener.departed.clone(),
        }
    }

    /// Tell every peer in `states` that is not dead that this rank leaves, and wait (at most
    /// [`DEPARTURE_BUDGET`]) for their listeners to acknowledge, so that none of them takes this
    /// rank for a dead one once it has exited.
    pub(crate) fn announce_departure(&self, states: &[PeerState]) {
        let deadline = Instant::now() + DEPARTURE_BUDGET;
        let me = self.endpoints.get(self.rank).map(|e| e.host.clone()).unwrap_or_default();
        let (tx, rx) = mpsc::channel();
        let mut waiting = 0;
        for (rank, endpoint) in self.endpoints.iter().enumerate() {
            let dead = matches!(states.get(rank), Some(PeerState::Dead | PeerState::Left));
            if rank == self.rank || dead || endpoint.port == 0 {
                continue;
            }
            let (tx, endpoint, local, mine) = (tx.clone(), endpoint.clone(), endpoint.host == me, self.rank);
            let spawned = std::thread::Builder::new().name("ferrite-departure".into()).spawn(move || {
                let _ = tx.send(tell_departure(&endpoint, local, mine, deadline));
            });
            if spawned.is_ok() {
                waiting += 1;
            }
        }
        drop(tx);
        while waiting > 0 && rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).is_ok() {
            waiting -= 1;
        }
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
            let spawned = std::thread::Builder::new().name("ferrite-probe".into()).spawn(move || {
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
        // Read after the probe: a peer that left acknowledged its notice before its port closed.
        let departed = self.departed.lock();
        for (rank, s) in states.iter_mut().enumerate() {
            if *s == PeerState::Dead && departed.contains(&rank) {
                *s = PeerState::Left;
            }
        }
        states
    }
}

/// The addresses of `endpoint` (127.0.0.1 when it is on this host).
fn addresses(endpoint: &Endpoint, local: bool) -> Vec<SocketAddr> {
    if local {
        return vec![SocketAddr::from(([127, 0, 0, 1], endpoint.port))];
    }
    (endpoint.host.as_str(), endpoint.port).to_socket_addrs().map(|a| a.collect()).unwrap_or_default()
}

/// Send `left RANK` to `endpoint`'s listener and wait for its acknowledgement; whether it came.
fn tell_departure(endpoint: &Endpoint, local: bool, rank: usize, deadline: Instant) -> bool {
    for addr in addresses(endpoint, local) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let Ok(mut conn) = TcpStream::connect_timeout(&addr, left) else { continue };
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let _ = conn.set_read_timeout(Some(left));
        let mut ack = [0u8; 1];
        if conn.write_all(format!("left {rank}\n").as_bytes()).is_ok() && conn.read_exact(&mut ack).is_ok() {
            return ack[0] == b'k';
        }
    }
    false
}

fn probe_one(endpoint: &Endpoint, local: bool, deadline: Instant) -> PeerState {
    let mut state = PeerState::Unknown;
    for addr in addresses(endpoint, local) {
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
        let listener = listen();
        let me = listener.endpoint.clone();
        assert_ne!(me.port, 0, "a listener on this machine");
        let alive = listen().endpoint;
        let dead = {
            let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
            let port = l.local_addr().unwrap().port();
            drop(l);
            Endpoint { host: me.host.clone(), port }
        };
        let none = Endpoint { host: me.host.clone(), port: 0 };
        let all: Vec<u8> = [&me, &alive, &dead, &none].iter().flat_map(|e| e.encode()).collect();
        let start = Instant::now();
        let states = Liveness::new(0, &listener, &all).probe();
        assert!(start.elapsed() <= PROBE_BUDGET + Duration::from_millis(100), "{:?}", start.elapsed());
        assert_eq!(states, vec![PeerState::Alive, PeerState::Alive, PeerState::Dead, PeerState::Unknown]);
        assert_eq!(dead_ranks(&states), vec![2]);
    }

    /// A survivor that gave up and exited is not taken for a dead rank by a slower one: it said
    /// it leaves, and the slower one's listener acknowledged that before the port closed.
    #[test]
    fn a_peer_that_said_it_leaves_is_not_dead() {
        let (slow, quick) = (listen(), listen());
        let dead = {
            let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
            let port = l.local_addr().unwrap().port();
            drop(l);
            Endpoint { host: slow.endpoint.host.clone(), port }
        };
        let all: Vec<u8> = [&slow.endpoint, &quick.endpoint, &dead].iter().flat_map(|e| e.encode()).collect();
        let quick_view = Liveness::new(1, &quick, &all);
        let seen = quick_view.probe();
        assert_eq!(seen, vec![PeerState::Alive, PeerState::Alive, PeerState::Dead]);
        let start = Instant::now();
        quick_view.announce_departure(&seen);
        assert!(start.elapsed() <= DEPARTURE_BUDGET + Duration::from_millis(100), "{:?}", start.elapsed());
        // The quick rank's port closes (as when its process exits): refused, but it left.
        let quick_port = quick.endpoint.port;
        let gone = Endpoint { host: slow.endpoint.host.clone(), port: free_port_other_than(quick_port) };
        let all_after: Vec<u8> = [&slow.endpoint, &gone, &dead].iter().flat_map(|e| e.encode()).collect();
        let states = Liveness::new(0, &slow, &all_after).probe();
        assert_eq!(states, vec![PeerState::Alive, PeerState::Left, PeerState::Dead]);
        assert_eq!(dead_ranks(&states), vec![2]);
    }

    /// A port nothing listens on (the listener of a `listen()` cannot be closed from a test).
    fn free_port_other_than(port: u16) -> u16 {
        loop {
            let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
            let p = l.local_addr().unwrap().port();
            if p != port {
                return p;
            }
        }
    }
}
