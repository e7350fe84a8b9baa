//! Where remote child links may send (SPEC §5.5): a link POSTs messages,
//! with credentials, to a URL a topic owner chose, so the broker must not become a way to
//! reach what only it can reach.
//!
//! - **Never**: link-local addresses (`169.254.0.0/16`, `fe80::/10`: every cloud's instance
//!   metadata service lives there), the other metadata addresses (`100.100.100.200`,
//!   `fd00:ec2::254`), unspecified, broadcast and multicast addresses, the same embedded in
//!   IPv4-mapped or NAT64 IPv6 addresses, and the metadata host names. Checked on the URL at
//!   attach (`400`) and again on every address a host name resolves to before connecting
//!   (a name that resolves only to such addresses fails the request), so DNS cannot be used
//!   to get around it.
//! - **`remotes.allowed_hosts`** (`NARAD_REMOTES_ALLOWED_HOSTS`, comma-separated): when set,
//!   a link's host must match an entry, for every caller, admins included (`403` at attach;
//!   an existing link to a host no longer listed stops sending, with the reason in its
//!   `last_error`). An entry is a host name (`queue.example.com`, exact, case-insensitive),
//!   a suffix pattern (`*.example.com`: any name below it, not the name itself), an IP
//!   address or a CIDR range (which match URLs written with an IP address), or `*` (any
//!   host). When it is not set, only admins may attach remote children.
//!
//! The broker enforces it (`narad::children`); the operator checks `spec.remotes.allowedHosts`
//! with the same parser, so an entry it accepts never stops a broker at start.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Host names of instance metadata services.
const METADATA_NAMES: [&str; 5] = [
    "metadata",
    "metadata.google.internal",
    "metadata.goog",
    "instance-data",
    "instance-data.ec2.internal",
];

/// One `remotes.allowed_hosts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Any,
    Name(String),
    /// `*.example.com` → `.example.com`.
    Suffix(String),
    Net(IpNet),
}

/// The remote-host policy of this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostPolicy {
    allowed: Vec<Entry>,
}

/// Why a host is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostRefused {
    /// Never reachable from a link (`400`).
    #[error("remote.url host {host} is {why}: remote children may never send there")]
    Forbidden { host: String, why: &'static str },
    /// Not in `remotes.allowed_hosts` (`403`).
    #[error("remote.url host {0} is not in this node's remotes.allowed_hosts")]
    NotAllowed(String),
}

impl HostPolicy {
    /// Parses `remotes.allowed_hosts` entries (empty ones are skipped).
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<HostPolicy, String> {
        let mut allowed = Vec::new();
        for raw in entries {
            let e = raw.trim().to_ascii_lowercase();
            if e.is_empty() {
                continue;
            }
            let entry = if e == "*" {
                Entry::Any
            } else if let Some(rest) = e.strip_prefix("*.") {
                let rest = rest.strip_suffix('.').unwrap_or(rest);
                if !is_host_name(rest) {
                    return Err(format!(
                        "remotes.allowed_hosts: {raw:?} is not *.<host name>"
                    ));
                }
                Entry::Suffix(format!(".{rest}"))
            } else if let Ok(net) = e.parse::<IpNet>() {
                Entry::Net(net.trunc())
            } else if let Ok(ip) = unbracket(&e).parse::<IpAddr>() {
                Entry::Net(IpNet::from(ip))
            } else if is_host_name(e.strip_suffix('.').unwrap_or(&e)) {
                Entry::Name(e.strip_suffix('.').unwrap_or(&e).to_string())
            } else {
                return Err(format!(
                    "remotes.allowed_hosts: {raw:?} is not a host name, *.<host name>, an IP address, a CIDR range or *"
                ));
            };
            allowed.push(entry);
        }
        Ok(HostPolicy { allowed })
    }

    /// Whether `remotes.allowed_hosts` is set (otherwise only admins attach remote children).
    pub fn is_configured(&self) -> bool {
        !self.allowed.is_empty()
    }

    /// Whether a link may send to `host` (the URL's host: a name, an IPv4 address or a
    /// bracketed IPv6 address).
    pub fn check(&self, host: &str) -> Result<(), HostRefused> {
        let h = unbracket(host.trim_end_matches('.')).to_ascii_lowercase();
        let ip = h.parse::<IpAddr>().ok();
        if let Some(why) = ip.and_then(forbidden_ip) {
            return Err(HostRefused::Forbidden {
                host: host.to_string(),
                why,
            });
        }
        if ip.is_none() && METADATA_NAMES.contains(&h.as_str()) {
            return Err(HostRefused::Forbidden {
                host: host.to_string(),
                why: "an instance metadata service",
            });
        }
        if !self.is_configured() {
            return Ok(());
        }
        let listed = self.allowed.iter().any(|e| match (e, ip) {
            (Entry::Any, _) => true,
            (Entry::Net(net), Some(ip)) => net.contains(&ip),
            (Entry::Name(n), None) => *n == h,
            (Entry::Suffix(s), None) => h.ends_with(s.as_str()),
            _ => false,
        });
        if listed {
            Ok(())
        } else {
            Err(HostRefused::NotAllowed(host.to_string()))
        }
    }
}

fn unbracket(h: &str) -> &str {
    h.strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(h)
}

fn is_host_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// Why no link may ever reach `ip`, if so.
pub fn forbidden_ip(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return forbidden_v4(v4);
            }
            let s = v6.segments();
            if v6.is_unspecified() {
                Some("the unspecified address")
            } else if s[0] & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else if v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
                Some("an instance metadata service")
            } else {
                None
            }
        }
    }
}

fn forbidden_v4(v4: Ipv4Addr) -> Option<&'static str> {
    if v4.is_link_local() {
        Some("a link-local address (instance metadata services live there)")
    } else if v4.octets()[0] == 0 {
        Some("the unspecified network")
    } else if v4.is_broadcast() {
        Some("the broadcast address")
    } else if v4.is_multicast() {
        Some("a multicast address")
    } else if v4 == Ipv4Addr::new(100, 100, 100, 200) {
        Some("an instance metadata service")
    } else {
        None
    }
}

/// The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`)
/// or NAT64 (`64:ff9b::a.b.c.d`) IPv6 address.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    let mapped = s[..5] == [0; 5] && s[5] == 0xffff;
    let compatible = s[..6] == [0; 6] && !(s[6] == 0 && s[7] <= 1);
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (mapped || compatible || nat64).then_some(tail)
}

/// What a host name resolved to, less the addresses no link may reach; an error naming the
/// reason when nothing is left.
pub fn reachable(
    host: &str,
    addrs: impl IntoIterator<Item = std::net::SocketAddr>,
) -> std::io::Result<Vec<std::net::SocketAddr>> {
    let mut why = None;
    let ok: Vec<_> = addrs
        .into_iter()
        .filter(|a| match forbidden_ip(a.ip()) {
            Some(w) => {
                why = Some((a.ip(), w));
                false
            }
            None => true,
        })
        .collect();
    match (ok.is_empty(), why) {
        (true, Some((ip, w))) => Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{host} resolves to {ip}, {w}: remote children may never send there"),
        )),
        _ => Ok(ok),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden(p: &HostPolicy, h: &str) -> bool {
        matches!(p.check(h), Err(HostRefused::Forbidden { .. }))
    }

    #[test]
    fn metadata_and_link_local_are_never_allowed() {
        let open = HostPolicy::parse(["*"]).unwrap();
        for h in [
            "169.254.169.254",
            "169.254.0.1",
            "[fe80::1]",
            "[::ffff:169.254.169.254]",
            "[::ffff:a9fe:a9fe]",
            "[64:ff9b::169.254.169.254]",
            "[fd00:ec2::254]",
            "100.100.100.200",
            "0.0.0.0",
            "[::]",
            "255.255.255.255",
            "224.0.0.1",
            "metadata.google.internal",
            "METADATA.google.internal.",
            "instance-data",
        ] {
            assert!(forbidden(&open, h), "{h}");
            assert!(forbidden(&HostPolicy::default(), h), "{h}");
        }
        for h in [
            "127.0.0.1",
            "[::1]",
            "10.1.2.3",
            "queue.example.com",
            "[2001:db8::1]",
        ] {
            assert_eq!(open.check(h), Ok(()), "{h}");
            assert_eq!(HostPolicy::default().check(h), Ok(()), "{h}");
        }
    }

    #[test]
    fn a_configured_list_admits_only_its_hosts() {
        let p = HostPolicy::parse([
            "queue.example.com",
            "*.corp.example",
            "10.0.0.0/8",
            "192.168.1.7",
            "[2001:db8::1]",
            " ",
        ])
        .unwrap();
        assert!(p.is_configured());
        for h in [
            "queue.example.com",
            "QUEUE.example.com.",
            "a.corp.example",
            "b.a.corp.example",
            "10.200.0.1",
            "192.168.1.7",
            "[2001:db8::1]",
        ] {
            assert_eq!(p.check(h), Ok(()), "{h}");
        }
        for h in [
            "example.com",
            "queue.example.com.evil",
            "corp.example",
            "xcorp.example",
            "11.0.0.1",
            "192.168.1.8",
            "127.0.0.1",
            "localhost",
            "[2001:db8::2]",
        ] {
            assert_eq!(
                p.check(h),
                Err(HostRefused::NotAllowed(h.to_string())),
                "{h}"
            );
        }
        // A CIDR entry does not admit a host name (names are matched by name).
        assert!(HostPolicy::parse(["127.0.0.0/8"])
            .unwrap()
            .check("localhost")
            .is_err());
    }

    #[test]
    fn bad_entries_are_refused() {
        for e in ["*.", "a b", "http://x", "*.*.x", "10.0.0.0/33", "x..y"] {
            assert!(HostPolicy::parse([e]).is_err(), "{e}");
        }
        assert!(!HostPolicy::parse(["", " "]).unwrap().is_configured());
    }

    #[test]
    fn resolved_addresses_lose_the_forbidden_ones() {
        let a = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        let got = reachable("x", [a("169.254.169.254:80"), a("10.0.0.1:80")]).unwrap();
        assert_eq!(got, [a("10.0.0.1:80")]);
        let e = reachable("rebind.example", [a("169.254.169.254:80")]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(e
            .to_string()
            .contains("rebind.example resolves to 169.254.169.254"));
        assert!(reachable("none", []).unwrap().is_empty());
    }
}
