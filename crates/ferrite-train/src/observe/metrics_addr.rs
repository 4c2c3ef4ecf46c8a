//! The two addresses a user types: where `ferrite train --metrics-addr` listens, and which run
//! `ferrite monitor` attaches to.
//!
//! Why a parser of our own instead of `SocketAddr::from_str`: users write `localhost:9400`,
//! `:9400` (Prometheus exporters' "every interface") or paste the scrape URL
//! `http://127.0.0.1:9400/metrics`; each of those either means something or deserves a sentence
//! saying what to write instead, which the standard parser's "invalid socket address syntax" does
//! not. Host names are resolved later, by the socket layer, so `localhost` works everywhere.

use std::fmt;
use std::net::Ipv6Addr;

use super::ObserveError;

/// The path ferrite serves its metrics on.
pub const METRICS_PATH: &str = "/metrics";

/// Where to listen: `HOST:PORT`. Port 0 asks the kernel for a free port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    /// An IPv4/IPv6 address or a host name, without brackets.
    pub host: String,
    pub port: u16,
}

impl ListenAddr {
    /// `host:port` as `bind` takes it (IPv6 in brackets).
    pub fn socket_string(&self) -> String {
        join_host_port(&self.host, self.port)
    }

    /// The host as written inside an address (IPv6 in brackets).
    pub fn host_in_address(&self) -> String {
        if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.socket_string())
    }
}

/// A metrics endpoint to read: `http://host:port/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    /// Starts with `/`.
    pub path: String,
}

impl Target {
    pub fn url(&self) -> String {
        format!("http://{}{}", join_host_port(&self.host, self.port), self.path)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url())
    }
}

/// Parse `--metrics-addr`: `127.0.0.1:9400`, `localhost:9400`, `[::1]:9400`, `:9400` (every
/// interface, as `0.0.0.0:9400`), `127.0.0.1:0` (any free port).
pub fn parse_listen_addr(text: &str) -> Result<ListenAddr, ObserveError> {
    let bad = |reason: String| ObserveError::InvalidAddress { what: "--metrics-addr", value: text.to_string(), reason };
    let s = text.trim();
    if s.is_empty() {
        return Err(bad("it is empty; give HOST:PORT such as 127.0.0.1:9400".into()));
    }
    if s.contains("://") || s.contains('/') {
        return Err(bad(format!(
            "give HOST:PORT without a scheme or path, such as 127.0.0.1:9400 (metrics are always served on {METRICS_PATH})"
        )));
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(format!(
            "a port alone is ambiguous; write 127.0.0.1:{s} (this machine only) or :{s} (every interface)"
        )));
    }
    let (host, port) = split_host_port(s).map_err(bad)?;
    let host = if host.is_empty() { "0.0.0.0".to_string() } else { host };
    Ok(ListenAddr { host, port })
}

/// Parse `ferrite monitor`'s argument: `HOST:PORT`, a bare `PORT` (this machine), `:PORT`, or a
/// URL `http://HOST:PORT[/path]` (the path defaults to `/metrics`).
pub fn parse_target(text: &str) -> Result<Target, ObserveError> {
    let bad =
        |reason: String| ObserveError::InvalidAddress { what: "metrics address", value: text.to_string(), reason };
    let s = text.trim();
    if s.is_empty() {
        return Err(bad("it is empty; give HOST:PORT such as 127.0.0.1:9400".into()));
    }
    let rest = if let Some(scheme_end) = s.find("://") {
        let scheme = &s[..scheme_end];
        if scheme.eq_ignore_ascii_case("http") {
            &s[scheme_end + 3..]
        } else {
            return Err(bad(format!("ferrite serves metrics over plain HTTP; use http://, not {scheme}://")));
        }
    } else {
        s
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, METRICS_PATH),
    };
    if path.chars().any(|c| c.is_whitespace() || c.is_control() || c == '#') {
        return Err(bad("the path has spaces or control characters".into()));
    }
    let (host, port) = if authority.bytes().all(|b| b.is_ascii_digit()) && !authority.is_empty() {
        ("127.0.0.1".to_string(), parse_port(authority).map_err(bad)?)
    } else {
        let (host, port) = split_host_port(authority).map_err(bad)?;
        (if host.is_empty() || host == "0.0.0.0" { "127.0.0.1".to_string() } else { host }, port)
    };
    // A bare `0` as well as `HOST:0` (fuzzing found the bare form accepted).
    if port == 0 {
        return Err(bad("port 0 is not a port a run listens on; use the port `ferrite train` printed".into()));
    }
    Ok(Target { host, port, path: path.to_string() })
}

/// `host:port` with IPv6 hosts in brackets.
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// Split `HOST:PORT` / `[V6]:PORT` / `:PORT`; the host may be empty.
fn split_host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(inner) = s.strip_prefix('[') {
        let Some((v6, after)) = inner.split_once(']') else {
            return Err("an IPv6 address opened with `[` is not closed with `]`".into());
        };
        if v6.parse::<Ipv6Addr>().is_err() {
            return Err(format!("`{v6}` is not an IPv6 address"));
        }
        let Some(port) = after.strip_prefix(':') else {
            return Err("no port after the IPv6 address; write [ADDRESS]:PORT such as [::1]:9400".into());
        };
        (v6.to_string(), port)
    } else {
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err("no port; write HOST:PORT such as 127.0.0.1:9400".into());
        };
        if host.contains(':') {
            return Err("write an IPv6 address in brackets, such as [::1]:9400".into());
        }
        check_host(host)?;
        (host.to_string(), port)
    };
    Ok((host, parse_port(port)?))
}

fn parse_port(p: &str) -> Result<u16, String> {
    if p.is_empty() {
        return Err("the port is missing after `:`".into());
    }
    if !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("the port `{p}` is not a number from 0 to 65535"));
    }
    p.parse::<u16>().map_err(|_| format!("the port {p} is larger than 65535"))
}

/// Host names and IPv4 addresses: letters, digits, `-`, `.` and `_`.
fn check_host(host: &str) -> Result<(), String> {
    if let Some(c) = host.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))) {
        return Err(format!("the host `{host}` has the character {c:?}, which no host name or IP address has"));
    }
    if host.len() > 253 {
        return Err(format!("the host name is {} characters long; DNS names have at most 253", host.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn listen_err(s: &str) -> String {
        parse_listen_addr(s).unwrap_err().to_string()
    }

    #[test]
    fn listen_addresses_users_write() {
        let a = parse_listen_addr("127.0.0.1:9400").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 9400));
        assert_eq!(parse_listen_addr(":9400").unwrap().socket_string(), "0.0.0.0:9400");
        assert_eq!(parse_listen_addr("[::1]:0").unwrap().socket_string(), "[::1]:0");
        assert_eq!(parse_listen_addr(" localhost:9400 ").unwrap().host, "localhost");
    }

    #[test]
    fn listen_address_mistakes_say_what_to_write() {
        assert!(listen_err("9400").contains("127.0.0.1:9400"), "{}", listen_err("9400"));
        assert!(listen_err("http://127.0.0.1:9400/metrics").contains("without a scheme"));
        assert!(listen_err("127.0.0.1").contains("no port"));
        assert!(listen_err("127.0.0.1:").contains("missing"));
        assert!(listen_err("127.0.0.1:http").contains("not a number"));
        assert!(listen_err("127.0.0.1:70000").contains("larger than 65535"));
        assert!(listen_err("::1:9400").contains("brackets"));
        assert!(listen_err("[::1:9400").contains("not closed"));
        assert!(listen_err("[nope]:9400").contains("not an IPv6"));
        assert!(listen_err("my host:9400").contains("character"));
        assert!(listen_err("").contains("empty"));
    }

    #[test]
    fn monitor_targets() {
        assert_eq!(parse_target("127.0.0.1:9400").unwrap().url(), "http://127.0.0.1:9400/metrics");
        assert_eq!(parse_target("9400").unwrap().url(), "http://127.0.0.1:9400/metrics");
        assert_eq!(parse_target(":9400").unwrap().url(), "http://127.0.0.1:9400/metrics");
        assert_eq!(parse_target("http://node7:9400/m").unwrap().url(), "http://node7:9400/m");
        assert_eq!(parse_target("HTTP://[::1]:9400").unwrap().url(), "http://[::1]:9400/metrics");
        let e = parse_target("https://node7:9400").unwrap_err().to_string();
        assert!(e.contains("plain HTTP"), "{e}");
        assert!(parse_target("node7:0").unwrap_err().to_string().contains("port 0"));
        // Found by fuzzing: a bare `0` was a target on port 0 that did not print back to itself.
        for bare in ["0", "00", "http://0/metrics"] {
            assert!(parse_target(bare).unwrap_err().to_string().contains("port 0"), "{bare}");
        }
        assert!(parse_target("node7").unwrap_err().to_string().contains("no port"));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC{0,40}") {
            let _ = parse_listen_addr(&s);
            let _ = parse_target(&s);
        }

        #[test]
        fn parsers_never_panic_on_address_like_text(s in "(http://)?\\[?[0-9a-z:.\\[\\]]{0,20}(:[0-9]{0,7})?(/[a-z]{0,5})?") {
            if let Ok(a) = parse_listen_addr(&s) {
                prop_assert_eq!(parse_listen_addr(&a.socket_string()).unwrap(), a);
            }
            if let Ok(t) = parse_target(&s) {
                prop_assert_eq!(parse_target(&t.url()).unwrap(), t);
            }
        }

        #[test]
        fn printed_addresses_parse_back(a in any::<[u8; 4]>(), v6 in any::<[u16; 8]>(), port in any::<u16>()) {
            let v4 = std::net::Ipv4Addr::from(a).to_string();
            let v6 = Ipv6Addr::from(v6).to_string();
            for host in [v4, v6] {
                let l = ListenAddr { host: host.clone(), port };
                prop_assert_eq!(parse_listen_addr(&l.socket_string()).unwrap(), l.clone());
                let std_addr: std::net::SocketAddr = l.socket_string().parse().unwrap();
                prop_assert_eq!(std_addr.port(), port);
            }
        }
    }
}
