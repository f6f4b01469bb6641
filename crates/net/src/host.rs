//! [`HostNetwork`]: one daemon's sandbox networks — the records, the pool, the links and
//! namespaces, and the nftables table — kept in step.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::error::{netlink, state};
use crate::netlink::Netlink;
use crate::nft::{self, SandboxElements, Table, TableSpec};
use crate::policy::{EffectivePolicy, NetworkPolicy};
use crate::pool::{self, AddressPool};
use crate::sys::{self, Nft};
use crate::{NetConfig, NetError};

/// `NSFS_MAGIC` from <linux/magic.h>: the filesystem of namespace files.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// What the daemon keeps on disk per sandbox network (`<state>/net/sandboxes/<id>.json`):
/// the allocation and the policy. Written before anything is created in the kernel, so
/// recovery can always find and remove what a crashed daemon made.
///
/// Replaced atomically (temp file, rename). A policy change is also fsynced before the
/// rename; the first write at attach is not (an fsync costs 1–7 ms here, a third of a
/// network's whole set-up): a daemon crash keeps it anyway (page cache), and a host crash
/// takes the running sandbox's namespace and link with it, so a lost record loses
/// nothing. A paused sandbox — the one case where the record must outlive a reboot — has
/// it on disk, because pause syncs the state filesystem (`syncfs`) before it reports the
/// sandbox paused.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NetRecord {
    id: String,
    addr: Ipv4Addr,
    policy: NetworkPolicy,
}

/// A sandbox's network as the runtime sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxNet {
    pub id: String,
    /// The sandbox's address (on `eth0` inside; source of its traffic).
    pub addr: Ipv4Addr,
    /// The gateway the sandbox routes through (the DNS server and egress proxy's address).
    pub gateway: Ipv4Addr,
    /// Host-side veth.
    pub veth: String,
    /// Bind mount pinning the sandbox's network namespace.
    pub netns_path: PathBuf,
}

/// What [`HostNetwork::reconcile`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Sandbox networks (records) of sandboxes not in the known set.
    pub removed: Vec<String>,
    /// Links with berth's prefix no record accounts for.
    pub stray_links: Vec<String>,
    /// Namespace pins no record accounts for.
    pub stray_netns: Vec<String>,
}

struct Attached {
    record: NetRecord,
    offset: u32,
    elements: SandboxElements,
    effective: Arc<EffectivePolicy>,
}

struct Inner {
    pool: AddressPool,
    sandboxes: HashMap<String, Attached>,
    by_addr: BTreeMap<Ipv4Addr, String>,
    nft: Nft,
}

/// A detached sandbox's link and namespace pin, to remove in the background.
struct Demolition {
    id: String,
    addr: Ipv4Addr,
    veth: String,
    pin: PathBuf,
    /// nft command removing the connection-count entry (may fail: already gone).
    conn_entry: String,
}

/// How long a detached sandbox's conntrack entries (and its address) may wait for the
/// next conntrack sweep, so that sandboxes ending close together share one. A sweep
/// walks the kernel's whole conntrack hash table (262,144 buckets on the 2-CPU test
/// host: ~8 ms of CPU) whatever the number of addresses it is for. Done per sandbox, it
/// was the largest CPU cost of a kill; with 500 ms here it still was one sweep per kill
/// for an agent killing a sandbox and creating the next a second later, and it landed
/// inside that next create and its first command. Nothing can use the entries
/// meanwhile: the sandbox's link is gone, and its address is not handed out again
/// before the sweep (an attach that finds the pool empty asks for one at once).
const SWEEP_DELAY: Duration = Duration::from_secs(5);

/// How often [`Demolisher::settle`] asks for a sweep again while it waits (a sandbox
/// detached after its last ask is only in the next sweep).
const SETTLE_ASK: Duration = Duration::from_millis(500);

/// At most this many detached sandboxes wait for one sweep (a burst of kills).
const SWEEP_BATCH: usize = 256;

/// What the demolisher thread is asked to do.
enum DemolisherJob {
    /// Remove this detached sandbox's link and pin now; its conntrack entries and address
    /// at the next sweep.
    Demolish(Demolition),
    /// Sweep now (someone waits in [`Demolisher::settle`]).
    Sweep,
}

/// Removes detached sandboxes' links and namespace pins off the caller's path: deleting
/// a veth and unmounting a pin each wait for an RCU grace period (tens of milliseconds on
/// a busy host). The sandbox is cut off before (its elements are gone from the table);
/// its conntrack entries go in a sweep shared by the sandboxes detached within
/// [`SWEEP_DELAY`] of each other, and its address returns to the pool only after that.
struct Demolisher {
    queue: Option<Sender<DemolisherJob>>,
    thread: Option<JoinHandle<()>>,
    pending: Arc<(Mutex<usize>, Condvar)>,
}

impl Demolisher {
    fn start(inner: Arc<Mutex<Inner>>) -> Self {
        let (queue, jobs) = mpsc::channel::<DemolisherJob>();
        let pending = Arc::new((Mutex::new(0usize), Condvar::new()));
        let done = pending.clone();
        let thread = std::thread::Builder::new()
            .name("berth-net-demolisher".into())
            .spawn(move || {
                // Detached sandboxes whose links are gone, waiting for the sweep, and
                // when the first of them came.
                let mut unswept: Vec<Demolition> = Vec::new();
                let mut since = Instant::now();
                loop {
                    if !unswept.is_empty()
                        && (since.elapsed() >= SWEEP_DELAY || unswept.len() >= SWEEP_BATCH)
                    {
                        sweep(&inner, &done, &mut unswept);
                    }
                    let job = if unswept.is_empty() {
                        jobs.recv().map_err(|_| RecvTimeoutError::Disconnected)
                    } else {
                        jobs.recv_timeout(SWEEP_DELAY.saturating_sub(since.elapsed()))
                    };
                    match job {
                        Ok(DemolisherJob::Demolish(job)) => {
                            unlink(&job);
                            if unswept.is_empty() {
                                since = Instant::now();
                            }
                            unswept.push(job);
                        }
                        Ok(DemolisherJob::Sweep) | Err(RecvTimeoutError::Timeout) => {
                            sweep(&inner, &done, &mut unswept)
                        }
                        Err(RecvTimeoutError::Disconnected) => {
                            sweep(&inner, &done, &mut unswept);
                            break;
                        }
                    }
                }
            })
            .expect("spawn the demolisher thread");
        Self {
            queue: Some(queue),
            thread: Some(thread),
            pending,
        }
    }

    fn push(&self, job: Demolition) {
        let (count, _) = &*self.pending;
        *count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        let sent = self
            .queue
            .as_ref()
            .map(|q| q.send(DemolisherJob::Demolish(job)));
        if let Some(Err(mpsc::SendError(DemolisherJob::Demolish(job)))) = sent {
            // The thread is gone (it panicked): do it here.
            demolish(&job);
            *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        }
    }

    /// Waits until every detached sandbox's link, pin and conntrack entries are gone and
    /// its address is back in the pool, asking for the sweep at once.
    fn settle(&self) {
        let (count, changed) = &*self.pending;
        let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 {
            // Asked again each round: a sandbox detached after the last ask waits for it.
            if let Some(queue) = &self.queue {
                let _ = queue.send(DemolisherJob::Sweep);
            }
            n = changed
                .wait_timeout(n, SETTLE_ASK)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// One conntrack pass for every sandbox in `unswept`, then their connection-count
/// elements, and their addresses back to the pool.
fn sweep(inner: &Mutex<Inner>, done: &(Mutex<usize>, Condvar), unswept: &mut Vec<Demolition>) {
    if unswept.is_empty() {
        return;
    }
    let addrs: BTreeSet<Ipv4Addr> = unswept.iter().map(|job| job.addr).collect();
    // The walk holds no lock of ours (nor a sleeping one of the kernel's), so it can
    // yield to everything else: it ran beside creates and their first commands.
    let idle = sys::IdlePriority::enter();
    if let Err(err) = Netlink::netfilter().and_then(|mut nl| nl.flush_conntrack_from_any(&addrs)) {
        tracing::warn!(sandboxes = addrs.len(), %err, "flushing conntrack entries");
    }
    drop(idle);
    let mut inner = lock(inner);
    for job in unswept.iter() {
        let _ = inner.nft.run(&job.conn_entry);
        inner.pool.release(job.addr);
    }
    drop(inner);
    let (count, changed) = done;
    *count.lock().unwrap_or_else(|e| e.into_inner()) -= unswept.len();
    changed.notify_all();
    unswept.clear();
}

impl Drop for Demolisher {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The host side of one daemon's sandbox networking (see the crate docs).
pub struct HostNetwork {
    config: NetConfig,
    tag: String,
    table: Table,
    dir: PathBuf,
    inner: Arc<Mutex<Inner>>,
    demolisher: Demolisher,
}

/// The daemon's tag: `b` and five hex digits of a hash of its state dir; prefixes its
/// links and names its table, so two daemons never touch each other's objects.
pub fn daemon_tag(state_dir: &Path) -> String {
    let canonical = fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    // FNV-1a: stable across builds and platforms (unlike std's hasher).
    let mut hash: u32 = 0x811c_9dc5;
    for byte in canonical.as_os_str().as_encoded_bytes() {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("b{:05x}", hash & 0xf_ffff)
}

/// The elements sandbox `addr` on `veth` gets under `effective`.
pub(crate) fn sandbox_elements(
    veth: &str,
    addr: Ipv4Addr,
    effective: &EffectivePolicy,
) -> SandboxElements {
    SandboxElements {
        veth: veth.to_owned(),
        addr,
        allowed: Ipv4Net::aggregate(&effective.policy.allowed_nets().collect()),
        denied: Ipv4Net::aggregate(&effective.policy.denied_nets()),
        proxied: effective.proxied(),
        no_egress: effective.no_egress(),
    }
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(|e| e.into_inner())
}

fn write_sysctl(path: &str, value: &str) -> Result<(), NetError> {
    fs::write(path, value).map_err(|source| NetError::Sysctl {
        path: PathBuf::from(path),
        source,
    })
}

/// Replaces `path` by `bytes` atomically: a temp file, fsync when `durable`, rename.
fn write_atomic(path: &Path, bytes: &[u8], durable: bool) -> Result<(), NetError> {
    let tmp = path.with_extension("json.tmp");
    let write = || -> io::Result<()> {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        fs::rename(&tmp, path)
    };
    write().map_err(state(path))
}

impl HostNetwork {
    /// Sets up the daemon's side: checks the pool against the host's routes and
    /// addresses, makes the gateway link, enables IPv4 forwarding, loads the records of
    /// an earlier run and installs the table with their elements (one transaction). Call
    /// [`HostNetwork::reconcile`] once the runtime knows which sandboxes are alive.
    pub fn start(config: NetConfig) -> Result<Self, NetError> {
        let mut pool = AddressPool::new(config.sandbox_cidr)?;
        let tag = daemon_tag(&config.state_dir);
        let dir = config.state_dir.join("net");
        // Addresses, policies and namespace pins: root's alone.
        for sub in ["sandboxes", "netns"] {
            std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
                .create(dir.join(sub))
                .map_err(state(dir.join(sub)))?;
        }
        let mut nl = Netlink::route().map_err(netlink("open rtnetlink"))?;
        let links = nl.links().map_err(netlink("list links"))?;
        let ours: BTreeSet<i32> = links
            .iter()
            .filter(|l| l.name.starts_with(&tag))
            .map(|l| l.index)
            .collect();
        let routes: Vec<(Ipv4Net, bool)> = nl
            .routes()
            .map_err(netlink("list routes"))?
            .into_iter()
            .filter_map(|r| {
                let net = Ipv4Net::new(r.dst, r.prefix_len).ok()?;
                Some((net, r.oif.is_some_and(|i| ours.contains(&i))))
            })
            .collect();
        let host_addrs: Vec<Ipv4Addr> = nl
            .addresses()
            .map_err(netlink("list addresses"))?
            .into_iter()
            .filter(|(index, _)| !ours.contains(index))
            .map(|(_, addr)| addr)
            .collect();
        pool::check_overlap(config.sandbox_cidr, &routes, &host_addrs)?;
        let gateway = pool.gateway();
        let gateway_link = format!("{tag}gw");
        let gw_index = match nl
            .index(&gateway_link)
            .map_err(netlink("find gateway link"))?
        {
            Some(index) => index,
            None => {
                // A veth pair with both ends here stands in for a dummy link (kernels
                // without the dummy driver are common in VMs); only `<tag>gw` is used.
                let (mac, peer_mac) = ([0x02, 0, 0, 0, 0, 1], [0x02, 0, 0, 0, 0, 2]);
                nl.add_veth(&gateway_link, mac, &format!("{tag}gp"), peer_mac, None)
                    .map_err(netlink(format!("create {gateway_link}")))?;
                nl.index(&gateway_link)
                    .map_err(netlink("find gateway link"))?
                    .ok_or_else(|| NetError::Netlink {
                        op: format!("create {gateway_link}"),
                        source: io::Error::from(io::ErrorKind::NotFound),
                    })?
            }
        };
        let _ = fs::write(
            format!("/proc/sys/net/ipv6/conf/{gateway_link}/disable_ipv6"),
            "1",
        );
        nl.add_address(gw_index, gateway, 32)
            .map_err(netlink(format!("add {gateway} to {gateway_link}")))?;
        nl.set_up(gw_index)
            .map_err(netlink(format!("set {gateway_link} up")))?;
        if fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .map_err(state("/proc/sys/net/ipv4/ip_forward"))?
            .trim()
            != "1"
        {
            tracing::info!("enabling IPv4 forwarding for sandbox egress");
            write_sysctl("/proc/sys/net/ipv4/ip_forward", "1")?;
        }

        let mut always_denied = crate::policy::builtin_denied();
        always_denied.push(config.sandbox_cidr);
        always_denied.extend(host_addrs.iter().map(|a| Ipv4Net::from(*a)));
        let spec = TableSpec {
            name: format!("berth_{}", &tag[1..]),
            veth_prefix: format!("{tag}v"),
            pool: config.sandbox_cidr,
            gateway,
            ports: config.ports,
            limits: config.limits,
            always_denied: Ipv4Net::aggregate(&always_denied),
            ceiling_direct: Ipv4Net::aggregate(&config.ceiling.direct_nets()),
            ceiling_denied: Ipv4Net::aggregate(&config.ceiling.deny_nets),
        };
        let table = nft::table(&spec);
        let inner = Arc::new(Mutex::new(Inner {
            pool: AddressPool::new(config.sandbox_cidr)?,
            sandboxes: HashMap::new(),
            by_addr: BTreeMap::new(),
            nft: Nft::new().map_err(|e| NetError::Nftables {
                op: "create context".into(),
                message: e.to_string(),
            })?,
        }));
        let network = Self {
            tag,
            table,
            dir,
            demolisher: Demolisher::start(inner.clone()),
            inner,
            config,
        };
        let mut attached = HashMap::new();
        for record in network.read_records()? {
            if !pool.claim(record.addr, &record.id) {
                tracing::warn!(sandbox = %record.id, addr = %record.addr, "network record outside the pool or clashing; removing it");
                let _ = fs::remove_file(network.record_path(&record.id));
                continue;
            }
            let entry = network.attached(record);
            attached.insert(entry.record.id.clone(), entry);
        }
        let elements: Vec<SandboxElements> =
            attached.values().map(|a| a.elements.clone()).collect();
        let script = network.table.render(&elements);
        {
            let mut inner = lock(&network.inner);
            inner
                .nft
                .run(&script)
                .map_err(|message| NetError::Nftables {
                    op: format!("install table {}", network.table.spec.name),
                    message,
                })?;
            inner.by_addr = attached
                .values()
                .map(|a| (a.record.addr, a.record.id.clone()))
                .collect();
            inner.sandboxes = attached;
            inner.pool = pool;
        }
        Ok(network)
    }

    fn attached(&self, record: NetRecord) -> Attached {
        let pool = AddressPool::new(self.config.sandbox_cidr).expect("pool checked at start");
        let offset = pool
            .offset(record.addr)
            .expect("address claimed in the pool");
        let effective = Arc::new(self.effective(&record.policy));
        let elements = sandbox_elements(&self.veth_name(offset), record.addr, &effective);
        Attached {
            record,
            offset,
            elements,
            effective,
        }
    }

    fn effective(&self, policy: &NetworkPolicy) -> EffectivePolicy {
        self.config
            .ceiling
            .apply(policy, &self.table.spec.always_denied)
    }

    fn read_records(&self) -> Result<Vec<NetRecord>, NetError> {
        let dir = self.dir.join("sandboxes");
        let mut records = Vec::new();
        for entry in fs::read_dir(&dir).map_err(state(&dir))? {
            let path = entry.map_err(state(&dir))?.path();
            if path.extension().is_none_or(|e| e != "json") {
                // A temp file of a write that never finished.
                let _ = fs::remove_file(&path);
                continue;
            }
            let bytes = fs::read(&path).map_err(state(&path))?;
            match serde_json::from_slice::<NetRecord>(&bytes) {
                Ok(record) => records.push(record),
                Err(source) => {
                    tracing::warn!(path = %path.display(), %source, "unreadable network record; removing it");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        Ok(records)
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join("sandboxes").join(format!("{id}.json"))
    }

    fn write_record(&self, record: &NetRecord, durable: bool) -> Result<(), NetError> {
        let bytes = serde_json::to_vec_pretty(record).expect("a record serialises");
        write_atomic(&self.record_path(&record.id), &bytes, durable)
    }

    fn veth_name(&self, offset: u32) -> String {
        format!("{}v{offset:x}", self.tag)
    }

    fn macs(&self, offset: u32) -> ([u8; 6], [u8; 6]) {
        let tag = u32::from_str_radix(&self.tag[1..], 16).unwrap_or(0);
        let tail = [(offset >> 16) as u8, (offset >> 8) as u8, offset as u8];
        let host = [
            0x02,
            (tag >> 12) as u8,
            (tag >> 4) as u8,
            tail[0],
            tail[1],
            tail[2],
        ];
        let sandbox = [
            0x06,
            (tag >> 12) as u8,
            (tag >> 4) as u8,
            tail[0],
            tail[1],
            tail[2],
        ];
        (host, sandbox)
    }

    /// Where sandbox `id`'s network namespace is pinned.
    pub fn netns_path(&self, id: &str) -> PathBuf {
        self.dir.join("netns").join(id)
    }

    pub fn gateway(&self) -> Ipv4Addr {
        self.table.spec.gateway
    }

    /// What this daemon denies to every sandbox besides the built-in ranges: its pool
    /// and the host's own addresses.
    pub fn always_denied(&self) -> &[Ipv4Net] {
        &self.table.spec.always_denied
    }

    pub fn config(&self) -> &NetConfig {
        &self.config
    }

    /// The nftables table (family `inet`) holding every rule of this daemon.
    pub fn table_name(&self) -> &str {
        &self.table.spec.name
    }

    /// Prefix of every link this daemon creates (veths: prefix + `v` + offset; the
    /// gateway: prefix + `gw`).
    pub fn link_prefix(&self) -> &str {
        &self.tag
    }

    fn info(&self, id: &str, a: &Attached) -> SandboxNet {
        SandboxNet {
            id: id.to_owned(),
            addr: a.record.addr,
            gateway: self.gateway(),
            veth: a.elements.veth.clone(),
            netns_path: self.netns_path(id),
        }
    }

    /// Gives sandbox `id` a network under `policy`: an address, a network namespace
    /// pinned at [`HostNetwork::netns_path`] (lo and eth0 up, default route via the
    /// gateway), the veth, host route and neighbour entries, and its elements in the
    /// table. On failure nothing of it is left.
    pub fn attach(&self, id: &str, policy: &NetworkPolicy) -> Result<SandboxNet, NetError> {
        policy.validate()?;
        if self.netns_path(id).exists() {
            // An earlier network of this id is still being removed.
            self.demolisher.settle();
        }
        let allocated = {
            let mut inner = lock(&self.inner);
            if inner.sandboxes.contains_key(id) {
                return Err(NetError::AlreadyAttached(id.to_owned()));
            }
            inner.pool.allocate(id)
        };
        let (addr, offset) = match allocated {
            Err(NetError::PoolExhausted { .. }) => {
                // Addresses of detached sandboxes come back once their links are gone.
                self.demolisher.settle();
                lock(&self.inner).pool.allocate(id)?
            }
            other => other?,
        };
        let record = NetRecord {
            id: id.to_owned(),
            addr,
            policy: policy.clone(),
        };
        let result = self
            .write_record(&record, false)
            .and_then(|()| self.build(id, addr, offset))
            .and_then(|()| {
                let entry = self.attached(record);
                let mut inner = lock(&self.inner);
                let script = self.table.add_sandbox(&entry.elements);
                inner
                    .nft
                    .run(&script)
                    .map_err(|message| NetError::Nftables {
                        op: format!("add sandbox {id}"),
                        message,
                    })?;
                let info = self.info(id, &entry);
                inner.by_addr.insert(addr, id.to_owned());
                inner.sandboxes.insert(id.to_owned(), entry);
                Ok(info)
            });
        if result.is_err() {
            demolish(&self.demolition(id, addr, offset));
            let _ = fs::remove_file(self.record_path(id));
            lock(&self.inner).pool.release(addr);
        }
        result
    }

    /// Makes sure sandbox `id`'s namespace and link exist (after a reboot only its record
    /// is left): rebuilt with the same address when missing. Resume calls this.
    pub fn ensure(&self, id: &str) -> Result<SandboxNet, NetError> {
        let (info, offset) = {
            let inner = lock(&self.inner);
            let a = inner
                .sandboxes
                .get(id)
                .ok_or_else(|| NetError::UnknownSandbox(id.to_owned()))?;
            (self.info(id, a), a.offset)
        };
        let mut nl = Netlink::route().map_err(netlink("open rtnetlink"))?;
        let linked = nl
            .index(&info.veth)
            .map_err(netlink(format!("find {}", info.veth)))?
            .is_some();
        if linked && is_nsfs(&info.netns_path) {
            return Ok(info);
        }
        demolish(&self.demolition(id, info.addr, offset));
        self.build(id, info.addr, offset)?;
        Ok(info)
    }

    /// Creates the namespace, the veth and the routes of sandbox `id`.
    fn build(&self, id: &str, addr: Ipv4Addr, offset: u32) -> Result<(), NetError> {
        let pin = self.netns_path(id);
        let veth = self.veth_name(offset);
        let (host_mac, sandbox_mac) = self.macs(offset);
        let gateway = self.gateway();
        fs::File::options()
            .write(true)
            .create_new(true)
            .open(&pin)
            .map_err(|source| NetError::Namespace {
                op: "create pin file",
                path: pin.clone(),
                source,
            })?;
        let host_ns: OwnedFd = fs::File::open("/proc/thread-self/ns/net")
            .map_err(|source| NetError::Namespace {
                op: "open the host namespace",
                path: PathBuf::from("/proc/thread-self/ns/net"),
                source,
            })?
            .into();
        // unshare(CLONE_NEWNET) moves only the calling thread; a throwaway thread makes
        // the namespace, pins it and configures it from inside, then ends.
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    inside_new_netns(&pin, &veth, host_mac, sandbox_mac, addr, gateway, &host_ns)
                })
                .join()
                .map_err(|_| NetError::ThreadPanicked {
                    what: "network namespace setup",
                })?
        })?;
        let mut nl = Netlink::route().map_err(netlink("open rtnetlink"))?;
        let index = nl
            .index(&veth)
            .map_err(netlink(format!("find {veth}")))?
            .ok_or_else(|| NetError::Netlink {
                op: format!("find {veth}"),
                source: io::Error::from(io::ErrorKind::NotFound),
            })?;
        let _ = fs::write(format!("/proc/sys/net/ipv6/conf/{veth}/disable_ipv6"), "1");
        nl.set_up(index)
            .map_err(netlink(format!("set {veth} up")))?;
        nl.add_neighbour(index, addr, sandbox_mac)
            .map_err(netlink(format!("neighbour {addr} on {veth}")))?;
        nl.add_route(addr, 32, index, None, Some(gateway))
            .map_err(netlink(format!("route {addr} via {veth}")))?;
        Ok(())
    }

    fn demolition(&self, id: &str, addr: Ipv4Addr, offset: u32) -> Demolition {
        Demolition {
            id: id.to_owned(),
            addr,
            veth: self.veth_name(offset),
            pin: self.netns_path(id),
            conn_entry: self.table.remove_conn_entry(addr),
        }
    }

    /// Waits until the links and namespace pins of detached sandboxes are gone (and
    /// their addresses back in the pool).
    pub fn settle(&self) {
        self.demolisher.settle();
    }

    /// Opens sandbox `id`'s network namespace (for `setns`, or for CRIU).
    pub fn open_netns(&self, id: &str) -> Result<OwnedFd, NetError> {
        let path = self.netns_path(id);
        fs::File::open(&path)
            .map(OwnedFd::from)
            .map_err(|source| NetError::Namespace {
                op: "open",
                path,
                source,
            })
    }

    /// Replaces sandbox `id`'s policy while it runs: one transaction swapping its
    /// elements, then its conntrack entries are flushed so connections to destinations
    /// the new policy denies are cut (their next packet meets the new rules as a new
    /// connection and is refused; allowed ones just go on through NAT's new entry).
    pub fn set_policy(&self, id: &str, policy: &NetworkPolicy) -> Result<(), NetError> {
        policy.validate()?;
        let addr = {
            let mut inner = lock(&self.inner);
            let (record, old) = {
                let a = inner
                    .sandboxes
                    .get(id)
                    .ok_or_else(|| NetError::UnknownSandbox(id.to_owned()))?;
                let mut record = a.record.clone();
                record.policy = policy.clone();
                (record, a.elements.clone())
            };
            self.write_record(&record, true)?;
            let entry = self.attached(record);
            let script = self.table.update_sandbox(&old, &entry.elements);
            inner
                .nft
                .run(&script)
                .map_err(|message| NetError::Nftables {
                    op: format!("update sandbox {id}"),
                    message,
                })?;
            let addr = entry.record.addr;
            inner.sandboxes.insert(id.to_owned(), entry);
            addr
        };
        Netlink::netfilter()
            .and_then(|mut nl| nl.flush_conntrack_from(addr))
            .map_err(netlink(format!("flush conntrack of {addr}")))?;
        Ok(())
    }

    /// Removes everything of sandbox `id`'s network: its elements and record at once (it
    /// is cut off), its link, namespace pin and conntrack entries shortly after, in the
    /// background ([`HostNetwork::settle`] waits for that), then its address.
    pub fn detach(&self, id: &str) -> Result<(), NetError> {
        let entry = {
            let mut inner = lock(&self.inner);
            let entry = inner
                .sandboxes
                .remove(id)
                .ok_or_else(|| NetError::UnknownSandbox(id.to_owned()))?;
            inner.by_addr.remove(&entry.record.addr);
            let script = self.table.remove_sandbox(&entry.elements);
            if let Err(message) = inner.nft.run(&script) {
                // Keep the record: recovery's table rebuild drops the elements.
                tracing::warn!(sandbox = %id, %message, "removing a sandbox's nftables elements");
            }
            entry
        };
        let path = self.record_path(id);
        fs::remove_file(&path).map_err(state(&path))?;
        self.demolisher
            .push(self.demolition(id, entry.record.addr, entry.offset));
        Ok(())
    }

    /// Sandbox `id`'s network, if it has one.
    pub fn sandbox(&self, id: &str) -> Option<SandboxNet> {
        let inner = lock(&self.inner);
        inner.sandboxes.get(id).map(|a| self.info(id, a))
    }

    /// Sandbox `id`'s stored policy.
    pub fn policy(&self, id: &str) -> Option<NetworkPolicy> {
        let inner = lock(&self.inner);
        inner.sandboxes.get(id).map(|a| a.record.policy.clone())
    }

    /// Which sandbox a connection from `addr` comes from, and its effective policy: for
    /// the egress proxy and the DNS server, which see sandboxes by source address.
    pub fn lookup(&self, addr: Ipv4Addr) -> Option<(String, Arc<EffectivePolicy>)> {
        let inner = lock(&self.inner);
        let id = inner.by_addr.get(&addr)?;
        let a = inner.sandboxes.get(id)?;
        Some((id.clone(), a.effective.clone()))
    }

    /// Ids of every sandbox with a network.
    pub fn ids(&self) -> Vec<String> {
        lock(&self.inner).sandboxes.keys().cloned().collect()
    }

    /// Removes the networks of sandboxes not in `known`, and every link and namespace pin
    /// of this daemon no record accounts for (left by a crash between steps).
    pub fn reconcile(&self, known: &BTreeSet<String>) -> Result<ReconcileReport, NetError> {
        let mut report = ReconcileReport::default();
        for id in self.ids() {
            if !known.contains(&id) {
                self.detach(&id)?;
                report.removed.push(id);
            }
        }
        self.settle();
        let (veths, ids): (BTreeSet<String>, BTreeSet<String>) = {
            let inner = lock(&self.inner);
            (
                inner
                    .sandboxes
                    .values()
                    .map(|a| a.elements.veth.clone())
                    .collect(),
                inner.sandboxes.keys().cloned().collect(),
            )
        };
        let mut nl = Netlink::route().map_err(netlink("open rtnetlink"))?;
        let prefix = format!("{}v", self.tag);
        let mut stray_addrs = BTreeSet::new();
        for link in nl.links().map_err(netlink("list links"))? {
            if link.name.starts_with(&prefix) && !veths.contains(&link.name) {
                nl.delete_link(&link.name)
                    .map_err(netlink(format!("delete {}", link.name)))?;
                // The name carries the pool offset, so the address is known.
                let addr = u32::from_str_radix(&link.name[prefix.len()..], 16)
                    .ok()
                    .map(|offset| {
                        Ipv4Addr::from(u32::from(self.config.sandbox_cidr.network()) + offset)
                    });
                stray_addrs.extend(addr.filter(|a| self.config.sandbox_cidr.contains(a)));
                report.stray_links.push(link.name);
            }
        }
        // One conntrack pass for all of them (each pass walks the whole table).
        let _ = Netlink::netfilter().and_then(|mut nl| nl.flush_conntrack_from_any(&stray_addrs));
        let netns_dir = self.dir.join("netns");
        for entry in fs::read_dir(&netns_dir).map_err(state(&netns_dir))? {
            let entry = entry.map_err(state(&netns_dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !ids.contains(&name) {
                let path = entry.path();
                sys::unmount(&path).map_err(|source| NetError::Namespace {
                    op: "unpin",
                    path: path.clone(),
                    source,
                })?;
                fs::remove_file(&path).map_err(state(&path))?;
                report.stray_netns.push(name);
            }
        }
        Ok(report)
    }

    /// Conntrack entries whose original source is `addr` (tests, diagnostics).
    pub fn conntrack_entries(&self, addr: Ipv4Addr) -> Result<usize, NetError> {
        Netlink::netfilter()
            .and_then(|mut nl| nl.conntrack_count_from(addr))
            .map_err(netlink(format!("count conntrack entries of {addr}")))
    }

    /// The elements of the table's sets and maps, as nft lists them (tests, diagnostics).
    pub fn list_table(&self) -> Result<String, NetError> {
        let mut inner = lock(&self.inner);
        inner
            .nft
            .run(&format!("list table inet {}", self.table.spec.name))
            .map_err(|message| NetError::Nftables {
                op: "list table".into(),
                message,
            })
    }

    /// Removes the whole table, the gateway link and every sandbox network (the daemon
    /// goes away for good; tests). Nothing works afterwards.
    pub fn destroy(&self) -> Result<(), NetError> {
        for id in self.ids() {
            self.detach(&id)?;
        }
        self.reconcile(&BTreeSet::new())?;
        let mut inner = lock(&self.inner);
        inner
            .nft
            .run(&format!("delete table inet {}", self.table.spec.name))
            .map_err(|message| NetError::Nftables {
                op: "delete table".into(),
                message,
            })?;
        let gateway_link = format!("{}gw", self.tag);
        Netlink::route()
            .and_then(|mut nl| nl.delete_link(&gateway_link))
            .map_err(netlink(format!("delete {gateway_link}")))
    }
}

fn is_nsfs(path: &Path) -> bool {
    // SAFETY: statfs into a zeroed buffer with a valid NUL-terminated path.
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c_path.as_ptr(), &mut st) == 0 && st.f_type == NSFS_MAGIC
    }
}

/// In a fresh thread: a new network namespace, pinned at `pin`, configured from inside:
/// IPv6 off, unprivileged low ports and ping, a veth pair with `eth0` here and `veth` in
/// `host_ns`, lo and eth0 up, `addr/32`, a permanent neighbour entry for the gateway and
/// `default via gateway onlink`.
fn inside_new_netns(
    pin: &Path,
    veth: &str,
    host_mac: [u8; 6],
    sandbox_mac: [u8; 6],
    addr: Ipv4Addr,
    gateway: Ipv4Addr,
    host_ns: &OwnedFd,
) -> Result<(), NetError> {
    let ns_err = |op| {
        let pin = pin.to_path_buf();
        move |source| NetError::Namespace {
            op,
            path: pin,
            source,
        }
    };
    sys::unshare_net().map_err(ns_err("unshare"))?;
    sys::bind_mount(Path::new("/proc/thread-self/ns/net"), pin).map_err(ns_err("pin"))?;
    // /proc/sys/net is the opening thread's namespace's.
    for (path, value) in [
        ("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1"),
        ("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1"),
        ("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0"),
        // Host gids: the sandbox's ids are mapped to berth's range far above 2^30.
        ("/proc/sys/net/ipv4/ping_group_range", "0 2147483647"),
    ] {
        write_sysctl(path, value)?;
    }
    let mut nl = Netlink::route().map_err(netlink("open rtnetlink in the sandbox namespace"))?;
    nl.add_veth("eth0", sandbox_mac, veth, host_mac, Some(host_ns.as_fd()))
        .map_err(netlink(format!("create veth {veth}")))?;
    for name in ["lo", "eth0"] {
        let index = nl
            .index(name)
            .map_err(netlink(format!("find {name}")))?
            .ok_or_else(|| NetError::Netlink {
                op: format!("find {name}"),
                source: io::Error::from(io::ErrorKind::NotFound),
            })?;
        if name == "eth0" {
            nl.add_address(index, addr, 32)
                .map_err(netlink(format!("add {addr} to eth0")))?;
        }
        nl.set_up(index)
            .map_err(netlink(format!("set {name} up")))?;
        if name == "eth0" {
            nl.add_neighbour(index, gateway, host_mac)
                .map_err(netlink("gateway neighbour"))?;
            nl.add_route(Ipv4Addr::UNSPECIFIED, 0, index, Some(gateway), None)
                .map_err(netlink("default route"))?;
        }
    }
    Ok(())
}

/// Removes a sandbox's link and namespace pin (whatever exists), and its conntrack
/// entries. Failures are logged: recovery's `reconcile` removes what is left.
fn demolish(job: &Demolition) {
    unlink(job);
    if let Err(err) = Netlink::netfilter().and_then(|mut nl| nl.flush_conntrack_from(job.addr)) {
        tracing::warn!(sandbox = %job.id, addr = %job.addr, %err, "flushing conntrack entries");
    }
}

/// Removes a sandbox's link and namespace pin (whatever exists). Failures are logged.
fn unlink(job: &Demolition) {
    let Demolition { id, veth, pin, .. } = job;
    if let Err(err) = Netlink::route().and_then(|mut nl| nl.delete_link(veth)) {
        tracing::warn!(sandbox = %id, %veth, %err, "deleting a sandbox link");
    }
    if let Err(err) = sys::unmount(pin) {
        tracing::warn!(sandbox = %id, pin = %pin.display(), %err, "unpinning a network namespace");
    }
    match fs::remove_file(pin) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => {
            tracing::warn!(sandbox = %id, pin = %pin.display(), %err, "removing a namespace pin")
        }
        _ => {}
    }
}
