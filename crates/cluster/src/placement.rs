//! Choosing the node a new sandbox runs on, from facts the caller gathered (a pure
//! function: no I/O, so every rule is unit-tested here).
//!
//! A node is a candidate when it accepts placements (registered, its lease current, not
//! draining) and has room: the CPUs, memory and sandbox slots it offers minus what its
//! running sandboxes hold. Among candidates the first of these wins: it already has the
//! template's layers (no transfer before the start), then the most free memory, then the
//! fewest sandboxes, then the smallest id (so equal nodes are chosen the same way every
//! time).

/// What is known of one node when a sandbox is placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub id: String,
    /// Registered, lease current, not draining.
    pub accepting: bool,
    /// CPUs the node offers sandboxes (its cores times its overcommit).
    pub cpu_capacity: u32,
    /// Memory the node offers sandboxes.
    pub memory_capacity_mb: u64,
    /// Sandboxes it can hold at once (running or paused).
    pub slots: u32,
    /// What its running sandboxes were given.
    pub cpu_reserved: u32,
    pub memory_reserved_mb: u64,
    /// Its sandboxes, running or paused (each holds a slot).
    pub sandboxes: u32,
    /// It has the template the sandbox starts from.
    pub has_template: bool,
}

impl NodeFacts {
    fn free_memory_mb(&self) -> u64 {
        self.memory_capacity_mb
            .saturating_sub(self.memory_reserved_mb)
    }

    fn fits(&self, request: &Request) -> bool {
        self.accepting
            && self.sandboxes < self.slots
            && self.free_memory_mb() >= request.memory_mb
            && self.cpu_capacity.saturating_sub(self.cpu_reserved) >= request.cpu_count
    }
}

/// What the new sandbox needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub cpu_count: u32,
    pub memory_mb: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error(
        "no node is accepting sandboxes (none registered, every lease expired, or all draining)"
    )]
    NoNodes,
    #[error("no node has room for {cpu_count} CPUs and {memory_mb} MiB (the most free memory on a node is {most_free_mb} MiB)")]
    NoCapacity {
        cpu_count: u32,
        memory_mb: u64,
        most_free_mb: u64,
    },
}

/// The node `request` should run on.
pub fn place<'a>(
    nodes: &'a [NodeFacts],
    request: &Request,
) -> Result<&'a NodeFacts, PlacementError> {
    let accepting: Vec<&NodeFacts> = nodes.iter().filter(|node| node.accepting).collect();
    if accepting.is_empty() {
        return Err(PlacementError::NoNodes);
    }
    accepting
        .iter()
        .copied()
        .filter(|node| node.fits(request))
        .min_by(|a, b| {
            b.has_template
                .cmp(&a.has_template)
                .then(b.free_memory_mb().cmp(&a.free_memory_mb()))
                .then(a.sandboxes.cmp(&b.sandboxes))
                .then(a.id.cmp(&b.id))
        })
        .ok_or_else(|| PlacementError::NoCapacity {
            cpu_count: request.cpu_count,
            memory_mb: request.memory_mb,
            most_free_mb: accepting
                .iter()
                .map(|node| node.free_memory_mb())
                .max()
                .unwrap_or(0),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str) -> NodeFacts {
        NodeFacts {
            id: id.into(),
            accepting: true,
            cpu_capacity: 8,
            memory_capacity_mb: 4096,
            slots: 100,
            cpu_reserved: 0,
            memory_reserved_mb: 0,
            sandboxes: 0,
            has_template: false,
        }
    }

    const SMALL: Request = Request {
        cpu_count: 2,
        memory_mb: 512,
    };

    #[test]
    fn the_node_with_the_most_free_memory_wins_and_ties_go_by_load_then_id() {
        let mut a = node("a");
        a.memory_reserved_mb = 1024;
        let b = node("b");
        assert_eq!(place(&[a.clone(), b.clone()], &SMALL).unwrap().id, "b");
        let mut c = node("c");
        c.sandboxes = 3;
        c.memory_capacity_mb = 3072;
        c.memory_reserved_mb = 0;
        let mut d = node("d");
        d.memory_capacity_mb = 3072;
        d.sandboxes = 1;
        assert_eq!(place(&[c.clone(), d], &SMALL).unwrap().id, "d");
        assert_eq!(place(&[node("z"), node("y")], &SMALL).unwrap().id, "y");
    }

    #[test]
    fn a_node_with_the_template_wins_when_it_has_room() {
        let mut warm = node("warm");
        warm.has_template = true;
        warm.memory_reserved_mb = 3000;
        assert_eq!(
            place(&[node("cold"), warm.clone()], &SMALL).unwrap().id,
            "warm"
        );
        warm.memory_reserved_mb = 3800;
        assert_eq!(place(&[node("cold"), warm], &SMALL).unwrap().id, "cold");
    }

    #[test]
    fn full_draining_and_lapsed_nodes_are_skipped() {
        let mut full_slots = node("slots");
        full_slots.sandboxes = 100;
        let mut full_cpu = node("cpu");
        full_cpu.cpu_reserved = 7;
        let mut draining = node("draining");
        draining.accepting = false;
        let ok = node("ok");
        assert_eq!(
            place(
                &[full_slots.clone(), full_cpu.clone(), draining.clone(), ok],
                &SMALL
            )
            .unwrap()
            .id,
            "ok"
        );
        assert_eq!(
            place(&[full_slots, full_cpu], &SMALL).unwrap_err(),
            PlacementError::NoCapacity {
                cpu_count: 2,
                memory_mb: 512,
                most_free_mb: 4096
            }
        );
        assert_eq!(
            place(&[draining], &SMALL).unwrap_err(),
            PlacementError::NoNodes
        );
        assert_eq!(place(&[], &SMALL).unwrap_err(), PlacementError::NoNodes);
    }
}
