//! The sandbox address pool: one IPv4 address per sandbox out of `--sandbox-cidr`. The
//! first address is the gateway (on the daemon's dummy link); sandboxes get the others,
//! up to the broadcast address (excluded).
//!
//! The pool itself keeps no file: each allocation is part of the sandbox's network
//! record (see `host`), so the records on disk are the allocations, and loading them at
//! start rebuilds the pool. Allocation is next-fit (a cursor moves on past each
//! allocation), so a released address is not handed out again before the rest of the
//! pool has been used: stale conntrack entries, neighbour caches or a proxy's idea of
//! who an address belongs to never meet a new sandbox at once.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::NetError;

/// Smallest and largest prefix lengths a pool may have: at most 2^20 sandboxes (link
/// names carry the offset in five hex digits), at least two.
pub const MIN_POOL_PREFIX: u8 = 12;
pub const MAX_POOL_PREFIX: u8 = 29;

#[derive(Debug, Clone)]
pub struct AddressPool {
    net: Ipv4Net,
    used: BTreeMap<u32, String>,
    cursor: u32,
}

impl AddressPool {
    pub fn new(net: Ipv4Net) -> Result<Self, NetError> {
        if !(MIN_POOL_PREFIX..=MAX_POOL_PREFIX).contains(&net.prefix_len()) || net.trunc() != net {
            return Err(NetError::BadPool {
                cidr: net,
                reason: format!(
                    "it must be a network address with a prefix length between /{MIN_POOL_PREFIX} \
                     and /{MAX_POOL_PREFIX}"
                ),
            });
        }
        Ok(Self {
            net,
            used: BTreeMap::new(),
            cursor: 2,
        })
    }

    pub fn net(&self) -> Ipv4Net {
        self.net
    }

    /// The gateway address: the pool's first.
    pub fn gateway(&self) -> Ipv4Addr {
        self.addr(1)
    }

    fn size(&self) -> u32 {
        1u32 << (32 - self.net.prefix_len())
    }

    fn addr(&self, offset: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.net.network()) + offset)
    }

    /// The offset of `addr` in the pool, when it is a sandbox address of it.
    pub fn offset(&self, addr: Ipv4Addr) -> Option<u32> {
        let offset = u32::from(addr).checked_sub(u32::from(self.net.network()))?;
        (2..self.size() - 1).contains(&offset).then_some(offset)
    }

    /// Takes a free address for `owner`.
    pub fn allocate(&mut self, owner: &str) -> Result<(Ipv4Addr, u32), NetError> {
        let (first, end) = (2, self.size() - 1);
        let span = end - first;
        for step in 0..span {
            let offset = first + (self.cursor - first + step) % span;
            if let std::collections::btree_map::Entry::Vacant(slot) = self.used.entry(offset) {
                slot.insert(owner.to_owned());
                self.cursor = first + (offset - first + 1) % span;
                return Ok((self.addr(offset), offset));
            }
        }
        Err(NetError::PoolExhausted {
            cidr: self.net,
            sandboxes: span as usize,
        })
    }

    /// Marks `addr` used by `owner` (records found at start). False when it is not a
    /// sandbox address of this pool or already taken by another owner.
    pub fn claim(&mut self, addr: Ipv4Addr, owner: &str) -> bool {
        let Some(offset) = self.offset(addr) else {
            return false;
        };
        match self.used.get(&offset) {
            Some(existing) => existing == owner,
            None => {
                self.used.insert(offset, owner.to_owned());
                true
            }
        }
    }

    pub fn release(&mut self, addr: Ipv4Addr) {
        if let Some(offset) = self.offset(addr) {
            self.used.remove(&offset);
        }
    }

    pub fn owner(&self, addr: Ipv4Addr) -> Option<&str> {
        self.offset(addr)
            .and_then(|o| self.used.get(&o))
            .map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }
}

/// Checks that `pool` overlaps none of the host's routes and addresses (`routes` as
/// destination/prefix, the default route excluded; `addresses` the host's own), except
/// the routes `ours` says are this daemon's (left by an earlier run).
pub fn check_overlap(
    pool: Ipv4Net,
    routes: &[(Ipv4Net, bool)],
    addresses: &[Ipv4Addr],
) -> Result<(), NetError> {
    for (route, ours) in routes {
        if *ours || route.prefix_len() == 0 {
            continue;
        }
        if route.contains(&pool.network()) || pool.contains(&route.network()) {
            return Err(NetError::PoolOverlaps {
                cidr: pool,
                with: format!("the host route to {route}"),
            });
        }
    }
    if let Some(addr) = addresses.iter().find(|a| pool.contains(*a)) {
        return Err(NetError::PoolOverlaps {
            cidr: pool,
            with: format!("the host address {addr}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(cidr: &str) -> AddressPool {
        AddressPool::new(cidr.parse().unwrap()).unwrap()
    }

    #[test]
    fn gateway_first_then_sandboxes_next_fit() {
        let mut p = pool("10.77.0.0/29");
        assert_eq!(p.gateway(), "10.77.0.1".parse::<Ipv4Addr>().unwrap());
        let got: Vec<_> = (0..5)
            .map(|i| p.allocate(&format!("s{i}")).unwrap().0.to_string())
            .collect();
        assert_eq!(
            got,
            [
                "10.77.0.2",
                "10.77.0.3",
                "10.77.0.4",
                "10.77.0.5",
                "10.77.0.6"
            ]
        );
        assert!(matches!(
            p.allocate("x"),
            Err(NetError::PoolExhausted { sandboxes: 5, .. })
        ));
        p.release("10.77.0.3".parse().unwrap());
        assert_eq!(p.allocate("y").unwrap().0.to_string(), "10.77.0.3");
        assert_eq!(p.owner("10.77.0.3".parse().unwrap()), Some("y"));
    }

    #[test]
    fn released_addresses_wait_for_the_rest_of_the_pool() {
        let mut p = pool("10.77.0.0/24");
        let (a, _) = p.allocate("a").unwrap();
        p.release(a);
        let (b, _) = p.allocate("b").unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn claims_rebuild_the_pool() {
        let mut p = pool("10.77.0.0/24");
        assert!(p.claim("10.77.0.9".parse().unwrap(), "a"));
        assert!(p.claim("10.77.0.9".parse().unwrap(), "a"));
        assert!(!p.claim("10.77.0.9".parse().unwrap(), "b"));
        assert!(!p.claim("10.77.0.1".parse().unwrap(), "b"), "the gateway");
        assert!(!p.claim("10.77.0.255".parse().unwrap(), "b"), "broadcast");
        assert!(!p.claim("10.78.0.9".parse().unwrap(), "b"), "outside");
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn bad_pools_are_refused() {
        for bad in ["10.77.0.0/30", "10.0.0.0/8", "10.77.0.1/16"] {
            let net: Ipv4Net = bad.parse().unwrap();
            assert!(AddressPool::new(net).is_err(), "{bad}");
        }
    }

    #[test]
    fn overlap_with_host_routes_and_addresses() {
        let p: Ipv4Net = "10.77.0.0/16".parse().unwrap();
        let r = |s: &str, ours| (s.parse::<Ipv4Net>().unwrap(), ours);
        check_overlap(p, &[r("0.0.0.0/0", false), r("192.0.2.0/24", false)], &[]).unwrap();
        check_overlap(p, &[r("10.77.0.5/32", true)], &[]).unwrap();
        for route in ["10.0.0.0/8", "10.77.3.0/24", "10.77.0.5/32"] {
            let err = check_overlap(p, &[r(route, false)], &[]).unwrap_err();
            assert!(err.to_string().contains(route), "{err}");
        }
        assert!(check_overlap(p, &[], &["10.77.9.9".parse().unwrap()]).is_err());
    }
}
