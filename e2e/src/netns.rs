//! Test hosts in network namespaces, for cutting one node off the network (needs root,
//! iproute2 and iptables, as CI has; [`available`] tells a test whether to skip).
//!
//! [`NetLab::create`] makes a bridge `nb<tag>` in the root namespace with `10.<a>.<b>.1/24`
//! and, per host, a namespace `nn<tag>-<i>` joined to the bridge by a veth pair, its end
//! inside carrying `10.<a>.<b>.<10+i>/24`. The tests (in the root namespace) reach every
//! host through the bridge. [`NetLab::cut`] takes a host's bridge port down — it then
//! reaches nobody and nobody reaches it — and [`NetLab::heal`] brings it back. Everything
//! is removed on drop, including the one `FORWARD` accept rule for the bridge that the
//! host's firewall (Docker's `FORWARD DROP` policy with bridge netfilter) would otherwise
//! need.

pub struct NetLab {
    tag: String,
    subnet: String,
    hosts: usize,
    forward_rule: bool,
}

fn run(args: &[&str]) -> anyhow::Result<()> {
    crate::run(args).map(drop)
}

/// Whether `tool` can be run (it is on `PATH`).
fn have(tool: &str) -> bool {
    crate::have(tool, "--version")
}

/// What this machine lacks for a [`NetLab`] (root, iproute2's `ip`, `iptables`), if anything;
/// tests skip with this reason unless `NARAD_REQUIRE_NETNS=1` (as CI sets) makes it a failure.
pub fn missing_prerequisite() -> Option<String> {
    let missing: Vec<&str> = [
        (!crate::running_as_root()).then_some("root (network namespaces)"),
        (!have("ip")).then_some("ip (Debian package iproute2)"),
        (!have("iptables")).then_some("iptables (Debian package iptables)"),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!missing.is_empty()).then(|| format!("this machine lacks {}", missing.join(", ")))
}

/// Whether a test that needs a [`NetLab`] must run here: `false` (and the reason printed)
/// when the machine lacks a prerequisite and `NARAD_REQUIRE_NETNS=1` is not set; panics when
/// it lacks one and the variable is set.
pub fn available(test: &str) -> bool {
    crate::lab_available(test, missing_prerequisite(), "NARAD_REQUIRE_NETNS")
}

impl NetLab {
    /// Creates `hosts` namespaces on a fresh bridge. Names and the subnet derive from the
    /// process id, so concurrent test binaries do not collide.
    pub fn create(hosts: usize) -> anyhow::Result<NetLab> {
        let pid = std::process::id();
        let tag = format!("{}", pid % 100_000);
        let subnet = format!("10.{}.{}", 100 + (pid / 250) % 100, pid % 250);
        let mut lab = NetLab {
            tag,
            subnet,
            hosts: 0,
            forward_rule: false,
        };
        let br = lab.bridge();
        let _ = run(&["ip", "link", "del", &br]);
        run(&["ip", "link", "add", &br, "type", "bridge"])?;
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{}.1/24", lab.subnet),
            "dev",
            &br,
        ])?;
        run(&["ip", "link", "set", &br, "up"])?;
        run(&[
            "iptables", "-I", "FORWARD", "-i", &br, "-o", &br, "-j", "ACCEPT",
        ])?;
        lab.forward_rule = true;
        for i in 0..hosts {
            let ns = lab.ns(i);
            let (outer, inner) = (lab.veth(i), format!("{}i", lab.veth(i)));
            let _ = run(&["ip", "netns", "del", &ns]);
            run(&["ip", "netns", "add", &ns])?;
            lab.hosts = i + 1;
            run(&[
                "ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            run(&["ip", "link", "set", &inner, "netns", &ns])?;
            run(&["ip", "link", "set", &outer, "master", &br])?;
            run(&["ip", "link", "set", &outer, "up"])?;
            let ip = format!("{}/24", lab.ip(i));
            run(&[
                "ip", "netns", "exec", &ns, "ip", "addr", "add", &ip, "dev", &inner,
            ])?;
            run(&[
                "ip", "netns", "exec", &ns, "ip", "link", "set", &inner, "up",
            ])?;
            run(&["ip", "netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        }
        Ok(lab)
    }

    fn bridge(&self) -> String {
        format!("nb{}", self.tag)
    }
    fn veth(&self, i: usize) -> String {
        format!("nv{}-{i}", self.tag)
    }

    /// The namespace of host `i`.
    pub fn ns(&self, i: usize) -> String {
        format!("nn{}-{i}", self.tag)
    }

    /// The address of host `i`.
    pub fn ip(&self, i: usize) -> String {
        format!("{}.{}", self.subnet, 10 + i)
    }

    /// Cuts host `i` off: its bridge port goes down (no packet in or out).
    pub fn cut(&self, i: usize) -> anyhow::Result<()> {
        run(&["ip", "link", "set", &self.veth(i), "down"])
    }

    /// Reconnects host `i`.
    pub fn heal(&self, i: usize) -> anyhow::Result<()> {
        run(&["ip", "link", "set", &self.veth(i), "up"])
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for i in 0..self.hosts {
            let _ = run(&["ip", "link", "del", &self.veth(i)]);
            let _ = run(&["ip", "netns", "del", &self.ns(i)]);
        }
        let br = self.bridge();
        if self.forward_rule {
            let _ = run(&[
                "iptables", "-D", "FORWARD", "-i", &br, "-o", &br, "-j", "ACCEPT",
            ]);
        }
        let _ = run(&["ip", "link", "del", &br]);
    }
}
