//! Pod addresses from the node's podCIDR, reserved in files so that they survive the agent.
//!
//! One file per address in use, named after the address and holding the pod's uid. A file
//! appears whole (written aside, then hard-linked into place, which fails if the name exists),
//! so two pods can never hold one address, and an agent killed at any point leaves either a
//! reservation or none. A search starts after the last address handed out, so an address just
//! released is the last one to be reused.

use std::fs;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// An IPv4 block such as a node's `spec.podCIDR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cidr {
    pub network: Ipv4Addr,
    pub prefix: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (ip, len) = s.split_once('/').ok_or_else(|| format!("{s:?} is not an IPv4 CIDR"))?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| format!("{s:?} is not an IPv4 CIDR"))?;
        let prefix: u8 = len.parse().ok().filter(|p| (8..=30).contains(p)).ok_or_else(|| format!("{s:?}: prefix must be 8..=30"))?;
        let mask = u32::MAX << (32 - u32::from(prefix));
        Ok(Cidr { network: Ipv4Addr::from(u32::from(ip) & mask), prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl Cidr {
    /// The bridge's own address: the first one after the network address.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 1)
    }

    /// The addresses pods may have: all but the network, gateway and broadcast addresses.
    fn pod_range(&self) -> std::ops::RangeInclusive<u32> {
        let base = u32::from(self.network);
        let size = 1u32 << (32 - u32::from(self.prefix));
        base + 2..=base + size - 2
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - u32::from(self.prefix));
        u32::from(ip) & mask == u32::from(self.network)
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum IpamError {
    #[error("no free pod address left in the node's podCIDR {cidr} ({count} addresses, all in use)")]
    Exhausted { cidr: Cidr, count: u32 },
    #[error("pod address reservations in {dir}: {source}")]
    Io { dir: PathBuf, source: io::Error },
}

/// The reservations of one node, under `dir`.
pub(crate) struct Ipam {
    dir: PathBuf,
    cidr: Cidr,
}

impl Ipam {
    pub fn open(dir: &Path, cidr: Cidr) -> Result<Ipam, IpamError> {
        fs::create_dir_all(dir).map_err(|source| IpamError::Io { dir: dir.to_path_buf(), source })?;
        Ok(Ipam { dir: dir.to_path_buf(), cidr })
    }

    fn io(&self, source: io::Error) -> IpamError {
        IpamError::Io { dir: self.dir.clone(), source }
    }

    /// Every reservation: (address, pod uid).
    pub fn reservations(&self) -> Vec<(Ipv4Addr, String)> {
        let Ok(entries) = fs::read_dir(&self.dir) else { return Vec::new() };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let ip: Ipv4Addr = e.file_name().to_str()?.parse().ok()?;
                let uid = fs::read_to_string(e.path()).ok()?;
                Some((ip, uid.trim().to_string()))
            })
            .collect()
    }

    /// The address reserved for `uid`, if any.
    pub fn address_of(&self, uid: &str) -> Option<Ipv4Addr> {
        self.reservations().into_iter().find(|(ip, u)| u == uid && self.cidr.contains(*ip)).map(|(ip, _)| ip)
    }

    /// The address of `uid`: the one it holds already, else the next free one.
    pub fn reserve(&self, uid: &str) -> Result<Ipv4Addr, IpamError> {
        if let Some(ip) = self.address_of(uid) {
            return Ok(ip);
        }
        let range = self.cidr.pod_range();
        let (first, count) = (*range.start(), range.end() - range.start() + 1);
        let last = fs::read_to_string(self.dir.join("last"))
            .ok()
            .and_then(|s| s.trim().parse::<Ipv4Addr>().ok())
            .map(u32::from)
            .filter(|ip| range.contains(ip));
        let start = last.map_or(0, |ip| ip - first + 1);
        let staged = self.dir.join(format!(".{uid}"));
        fs::write(&staged, uid).map_err(|e| self.io(e))?;
        let mut result = Err(IpamError::Exhausted { cidr: self.cidr, count });
        for i in 0..count {
            let ip = Ipv4Addr::from(first + (start + i) % count);
            match fs::hard_link(&staged, self.dir.join(ip.to_string())) {
                Ok(()) => {
                    // Only a hint for the next search: a lost write costs nothing but reuse order.
                    let _ = fs::write(self.dir.join("last"), ip.to_string());
                    result = Ok(ip);
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    result = Err(self.io(e));
                    break;
                }
            }
        }
        let _ = fs::remove_file(&staged);
        result
    }

    /// Frees every address `uid` holds. Idempotent.
    pub fn release(&self, uid: &str) {
        for (ip, u) in self.reservations() {
            if u == uid {
                let _ = fs::remove_file(self.dir.join(ip.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipam(cidr: &str) -> (tempfile::TempDir, Ipam) {
        let dir = tempfile::tempdir().expect("temp dir");
        let ipam = Ipam::open(dir.path(), cidr.parse().expect("valid cidr")).expect("opens");
        (dir, ipam)
    }

    #[test]
    fn pods_get_distinct_addresses_after_the_gateway_and_keep_them() {
        let (_d, ipam) = ipam("10.244.3.0/24");
        let a = ipam.reserve("uid-a").expect("address");
        let b = ipam.reserve("uid-b").expect("address");
        assert_eq!(a, Ipv4Addr::new(10, 244, 3, 2));
        assert_eq!(b, Ipv4Addr::new(10, 244, 3, 3));
        assert_eq!(ipam.reserve("uid-a").expect("address"), a, "asking again returns the same address");
    }

    #[test]
    fn reservations_survive_a_new_ipam_on_the_same_directory() {
        let (d, ipam) = ipam("10.244.3.0/24");
        let a = ipam.reserve("uid-a").expect("address");
        drop(ipam);
        let again = Ipam::open(d.path(), "10.244.3.0/24".parse().expect("valid")).expect("opens");
        assert_eq!(again.address_of("uid-a"), Some(a));
        assert_ne!(again.reserve("uid-b").expect("address"), a);
    }

    #[test]
    fn a_full_block_is_an_error_naming_it_and_a_release_frees_an_address_last_in_line() {
        let (_d, ipam) = ipam("10.0.0.0/29");
        let got: Vec<Ipv4Addr> = (0..5).map(|i| ipam.reserve(&format!("uid-{i}")).expect("address")).collect();
        let e = ipam.reserve("uid-late").expect_err("full");
        assert!(e.to_string().contains("10.0.0.0/29"), "{e}");
        ipam.release("uid-1");
        assert_eq!(ipam.reserve("uid-late").expect("freed"), got[1]);
        assert_eq!(ipam.address_of("uid-1"), None);
    }

    #[test]
    fn a_released_address_is_not_the_next_one_handed_out() {
        let (_d, ipam) = ipam("10.0.0.0/28");
        let a = ipam.reserve("uid-a").expect("address");
        ipam.release("uid-a");
        assert_ne!(ipam.reserve("uid-b").expect("address"), a);
    }
}
