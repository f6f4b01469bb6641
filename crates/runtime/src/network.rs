//! Sandbox networking in the Linux runtime, through berth-net's [`HostNetwork`]: a
//! network namespace per sandbox created and pinned by the host, a veth to it, and the
//! daemon's nftables table. With no network configured every sandbox keeps its own
//! loopback-only namespace (the init is cloned with `CLONE_NEWNET`).
//!
//! With a network, `create` (and every restore) first gives the sandbox its network
//! under its policy, then clones the init from a thread that has entered the sandbox's
//! namespace, without `CLONE_NEWNET`: the namespace stays owned by the host's user
//! namespace, so root inside cannot reconfigure it. The policy lives in berth-net's
//! record of the sandbox (address + policy), which survives pause, resume and daemon
//! restarts; checkpoints carry it, so forks and snapshot starts inherit it. A pause keeps
//! the namespace, link and rules; CRIU runs inside the sandbox's namespace, so it leaves
//! the namespace out of the images and restores the tree into it again (see
//! berth-checkpoint's `join_netns` for why not CRIU's external namespaces). A restore from a
//! checkpoint gets a new namespace and address of its own.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use berth_net::{HostNetwork, NetError, NetworkPolicy};

use super::LinuxRuntime;
use crate::sys::{
    self, FsContext, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};
use crate::RuntimeError;

/// A detached read-only sysfs of network namespace `netns`, made from a thread that has
/// entered it (sysfs shows the mounter's namespace's devices). The launcher attaches it
/// at /sys: the sandbox's root may not mount sysfs of a namespace the host owns.
pub(super) fn sysfs_in(netns: &OwnedFd) -> io::Result<OwnedFd> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                sys::setns(netns.as_fd(), libc::CLONE_NEWNET)?;
                let fs = FsContext::open(c"sysfs")?;
                fs.create_mount(
                    MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                )
            })
            .join()
            .map_err(|_| io::Error::other("sysfs thread panicked"))?
    })
}

impl LinuxRuntime {
    /// The daemon's sandbox networking, when configured: the egress proxy and DNS server
    /// bind to its gateway and find sandboxes with [`HostNetwork::lookup`].
    pub fn network(&self) -> Option<&HostNetwork> {
        self.network.as_ref()
    }

    /// Gives new sandbox `id` its network (default policy when `policy` is None). A
    /// policy without networking configured is an error: it could not be enforced.
    pub(super) fn attach_network(
        &self,
        id: &str,
        policy: Option<&NetworkPolicy>,
    ) -> Result<(), RuntimeError> {
        match (&self.network, policy) {
            (Some(net), policy) => {
                net.attach(id, policy.unwrap_or(&NetworkPolicy::default()))?;
                Ok(())
            }
            (None, Some(_)) => Err(NetError::Disabled.into()),
            (None, None) => Ok(()),
        }
    }

    /// The network namespace sandbox `id`'s init must start in (rebuilt if a reboot took
    /// it); None without networking. A sandbox made before networking was configured
    /// gets a network with the default policy.
    pub(super) fn netns_for_start(&self, id: &str) -> Result<Option<OwnedFd>, RuntimeError> {
        let Some(net) = &self.network else {
            return Ok(None);
        };
        match net.ensure(id) {
            Err(NetError::UnknownSandbox(_)) => {
                net.attach(id, &NetworkPolicy::default())?;
            }
            other => {
                other?;
            }
        }
        Ok(Some(net.open_netns(id)?))
    }

    /// Sandbox `id`'s network namespace for CRIU to run in (None without networking).
    pub(super) fn sandbox_netns(
        &self,
        id: &str,
    ) -> Result<Option<std::sync::Arc<OwnedFd>>, RuntimeError> {
        match &self.network {
            Some(net) => Ok(Some(std::sync::Arc::new(net.open_netns(id)?))),
            None => Ok(None),
        }
    }

    /// Refuses a restore without a network namespace (`netns` None) of images that hold
    /// none either (dumped with networking): CRIU would put the tree in the daemon's own
    /// network namespace, the host's.
    pub(super) fn check_restore_netns(
        images: &std::path::Path,
        netns: Option<&std::sync::Arc<OwnedFd>>,
    ) -> Result<(), RuntimeError> {
        if netns.is_some() {
            return Ok(());
        }
        let has_netns_image = std::fs::read_dir(images)
            .map_err(|source| RuntimeError::Io {
                op: format!("read {}", images.display()),
                source,
            })?
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("netns-"));
        if has_netns_image {
            Ok(())
        } else {
            Err(NetError::CheckpointNeedsNetwork {
                images: images.to_path_buf(),
            }
            .into())
        }
    }

    /// Sandbox `id`'s stored policy (None without networking).
    pub fn network_policy(&self, id: &str) -> Option<NetworkPolicy> {
        self.network.as_ref()?.policy(id)
    }

    /// Removes sandbox `id`'s network, if it has one.
    pub(super) fn detach_network(&self, id: &str) -> Result<(), RuntimeError> {
        match &self.network {
            Some(net) if net.sandbox(id).is_some() => Ok(net.detach(id)?),
            _ => Ok(()),
        }
    }

    /// Replaces the policy of sandbox `id` (running or paused) atomically; connections
    /// to newly denied destinations are cut.
    pub(super) fn replace_network_policy(
        &self,
        id: &str,
        policy: &NetworkPolicy,
    ) -> Result<(), RuntimeError> {
        let net = self.network.as_ref().ok_or(NetError::Disabled)?;
        if net.sandbox(id).is_none() {
            return Err(RuntimeError::NotFound(id.to_owned()));
        }
        Ok(net.set_policy(id, policy)?)
    }

    /// Recovery: networks of sandboxes not in `known` go, with any link or pin of this
    /// daemon no record accounts for.
    pub(super) fn reconcile_network(&self, known: &BTreeSet<String>) -> Result<(), RuntimeError> {
        if let Some(net) = &self.network {
            let report = net.reconcile(known)?;
            if report != Default::default() {
                tracing::info!(?report, "reconciled sandbox networks");
            }
        }
        Ok(())
    }
}
