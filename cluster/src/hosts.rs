//! A cluster that spans hosts (`[[host]]` in a cluster file): which hcabench host runs
//! which nodes, the address each listens on for the others ([`crate::interhost`]), and the
//! switches each carries. Nodes are numbered across the hosts in order (the first host's
//! are node1.., the next host's follow), so that node `i` keeps LID `i + 1` wherever it
//! runs. The first host runs the subnet manager.
//!
//! With no switches named, each host gets one switch of its own, named as the host, with
//! its nodes, and the first host's switch is linked to each other's: a star around the SM.

use std::net::SocketAddr;
use std::ops::Range;

use hca_model::subnet::Topology;

use crate::switches::{TopologySpec, TopologySpecError};
use crate::ClusterSpec;

/// The most hosts a subnet spans.
pub const MAX_HOSTS: usize = 64;

/// One host of a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSpec {
    /// Its name (`hcabench up --host NAME`).
    pub name: String,
    /// Where it listens for the other hosts (UDP).
    pub address: SocketAddr,
    /// How many of the cluster's nodes it runs.
    pub nodes: usize,
}

/// The hosts of a cluster, and which of them this is. No hosts: the cluster is this host's
/// alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostsSpec {
    pub hosts: Vec<HostSpec>,
    /// This host's index in `hosts`.
    pub here: usize,
}

/// Why the hosts cannot be set up, in the cluster file's names.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostsError {
    #[error("{0} hosts: at most {MAX_HOSTS}")]
    TooMany(usize),
    #[error("two hosts are named {0:?}")]
    NameTwice(String),
    #[error("hosts {0:?} and {1:?} have one address, {2}")]
    AddressTwice(String, String, SocketAddr),
    #[error("host {0:?} runs no nodes (give it nodes = N)")]
    NoNodes(String),
    #[error("the hosts' nodes add up to {sum}, the cluster has {nodes}: make them agree")]
    Nodes { sum: usize, nodes: usize },
    #[error("no host {name:?} (the hosts are {known})")]
    NoSuchHost { name: String, known: String },
    #[error("switch {switch:?} names no host: with [[host]] tables, give each switch host = NAME")]
    SwitchWithoutHost { switch: String },
    #[error("switch {switch:?} is on host {host:?}, which is not one of the hosts ({known})")]
    SwitchHost {
        switch: String,
        host: String,
        known: String,
    },
    #[error(
        "{node} runs on host {runs:?} but is cabled to switch {switch:?} on host {on:?}: a \
         node's switch is on its own host"
    )]
    NodeElsewhere {
        node: String,
        runs: String,
        switch: String,
        on: String,
    },
    #[error(transparent)]
    Topology(#[from] TopologySpecError),
    #[error("the hosts' cabling: {0}")]
    Cabling(String),
}

impl HostsSpec {
    /// Whether the cluster spans more than one host.
    pub fn spans(&self) -> bool {
        self.hosts.len() > 1
    }

    /// The host named `name`, for `hcabench up --host`.
    pub fn index_of(&self, name: &str) -> Result<usize, HostsError> {
        (self.hosts.iter().position(|h| h.name == name)).ok_or_else(|| HostsError::NoSuchHost {
            name: name.to_string(),
            known: self.known(),
        })
    }

    /// The nodes this host runs, of a cluster of `nodes` (all of them on one host).
    pub fn local_nodes(&self, nodes: usize) -> Range<usize> {
        if !self.spans() {
            return 0..nodes;
        }
        let first: usize = self.hosts.iter().take(self.here).map(|h| h.nodes).sum();
        let n = self.hosts.get(self.here).map_or(0, |h| h.nodes);
        first..first + n
    }

    /// The host that runs node `i`.
    pub fn host_of_node(&self, i: usize) -> usize {
        let mut first = 0;
        for (k, h) in self.hosts.iter().enumerate() {
            if i < first + h.nodes {
                return k;
            }
            first += h.nodes;
        }
        0
    }

    /// Every host's address, in host order.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.hosts.iter().map(|h| h.address).collect()
    }

    fn known(&self) -> String {
        let names: Vec<&str> = self.hosts.iter().map(|h| h.name.as_str()).collect();
        if names.is_empty() {
            "none: name them in [[host]] tables".into()
        } else {
            names.join(", ")
        }
    }

    /// Checks the hosts of a cluster of `nodes`.
    pub fn check(&self, nodes: usize) -> Result<(), HostsError> {
        if self.hosts.len() > MAX_HOSTS {
            return Err(HostsError::TooMany(self.hosts.len()));
        }
        if self.hosts.is_empty() {
            return Ok(());
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if let Some(o) = self.hosts.iter().take(i).find(|o| o.name == h.name) {
                return Err(HostsError::NameTwice(o.name.clone()));
            }
            if let Some(o) = self.hosts.iter().take(i).find(|o| o.address == h.address) {
                return Err(HostsError::AddressTwice(
                    o.name.clone(),
                    h.name.clone(),
                    h.address,
                ));
            }
            if h.nodes == 0 {
                return Err(HostsError::NoNodes(h.name.clone()));
            }
        }
        let sum = self.hosts.iter().map(|h| h.nodes).sum();
        if sum != nodes {
            return Err(HostsError::Nodes { sum, nodes });
        }
        Ok(())
    }

    /// The subnet's cabling over the hosts: `switches` (with each switch's host), or one
    /// switch per host in a star around the first; every node on a switch of its own host.
    pub fn topology(&self, switches: &TopologySpec, nodes: usize) -> Result<Topology, HostsError> {
        self.check(nodes)?;
        if !self.spans() {
            return Ok(switches.topology(nodes)?);
        }
        let (spec, hosts) = if switches.is_single() {
            let mut first = 0;
            let spec = TopologySpec {
                switches: (self.hosts.iter())
                    .map(|h| {
                        let own = (first..first + h.nodes)
                            .map(ClusterSpec::node_name)
                            .collect();
                        first += h.nodes;
                        crate::SwitchSpec {
                            name: h.name.clone(),
                            nodes: own,
                            host: h.name.clone(),
                        }
                    })
                    .collect(),
                links: (self.hosts.iter().skip(1))
                    .filter_map(|h| Some([self.hosts.first()?.name.clone(), h.name.clone()]))
                    .collect(),
            };
            (spec, (0..self.hosts.len() as u16).collect())
        } else {
            let mut hosts = Vec::with_capacity(switches.switches.len());
            for s in &switches.switches {
                if s.host.is_empty() {
                    return Err(HostsError::SwitchWithoutHost {
                        switch: s.name.clone(),
                    });
                }
                let h = (self.hosts.iter().position(|h| h.name == s.host)).ok_or_else(|| {
                    HostsError::SwitchHost {
                        switch: s.name.clone(),
                        host: s.host.clone(),
                        known: self.known(),
                    }
                })?;
                for node in &s.nodes {
                    let runs = ClusterSpec::node_index(node, nodes).map(|i| self.host_of_node(i));
                    if let Some(runs) = runs.filter(|&r| r != h) {
                        return Err(HostsError::NodeElsewhere {
                            node: node.clone(),
                            runs: self
                                .hosts
                                .get(runs)
                                .map_or(String::new(), |x| x.name.clone()),
                            switch: s.name.clone(),
                            on: s.host.clone(),
                        });
                    }
                }
                hosts.push(h as u16);
            }
            (switches.clone(), hosts)
        };
        let t = spec.topology(nodes)?;
        t.on_hosts(hosts)
            .map_err(|e| HostsError::Cabling(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, port: u16, nodes: usize) -> HostSpec {
        HostSpec {
            name: name.into(),
            address: SocketAddr::from(([10, 0, 0, 1], port)),
            nodes,
        }
    }

    fn two(here: usize) -> HostsSpec {
        HostsSpec {
            hosts: vec![host("a", 7700, 2), host("b", 7701, 3)],
            here,
        }
    }

    #[test]
    fn test_nodes_are_numbered_across_hosts() {
        assert_eq!(two(0).local_nodes(5), 0..2);
        assert_eq!(two(1).local_nodes(5), 2..5);
        assert_eq!(HostsSpec::default().local_nodes(4), 0..4);
        assert_eq!(
            (0..5).map(|i| two(0).host_of_node(i)).collect::<Vec<_>>(),
            [0, 0, 1, 1, 1]
        );
        assert_eq!(two(0).index_of("b"), Ok(1));
        assert!(matches!(
            two(0).index_of("c"),
            Err(HostsError::NoSuchHost { .. })
        ));
    }

    #[test]
    fn test_the_default_cabling_is_a_switch_per_host_in_a_star() {
        let mut h = two(0);
        h.hosts.push(host("c", 7702, 1));
        let t = h.topology(&TopologySpec::default(), 6).unwrap();
        let names: Vec<&str> = t.switches().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(t.switches()[1].hcas, [3, 4, 5]);
        assert_eq!(t.links(), [(0, 1), (0, 2)]);
        assert_eq!((t.host_of(0), t.host_of(2)), (0, 2));
        assert!(t.spans_hosts());
    }

    #[test]
    fn test_bad_hosts_are_refused_in_the_files_names() {
        let mut h = two(0);
        assert_eq!(
            h.topology(&TopologySpec::default(), 4).unwrap_err(),
            HostsError::Nodes { sum: 5, nodes: 4 }
        );
        h.hosts[1].name = "a".into();
        assert_eq!(h.check(5).unwrap_err(), HostsError::NameTwice("a".into()));
        let mut h = two(0);
        h.hosts[1].address = h.hosts[0].address;
        assert!(matches!(h.check(5), Err(HostsError::AddressTwice(..))));
        let mut h = two(0);
        h.hosts[1].nodes = 0;
        assert_eq!(h.check(2).unwrap_err(), HostsError::NoNodes("b".into()));
        // Named switches: each on a host, each node on its own host's switch.
        let sw = |name: &str, nodes: &[&str], host: &str| crate::SwitchSpec {
            name: name.into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            host: host.into(),
        };
        let spec = |s: Vec<crate::SwitchSpec>| TopologySpec {
            switches: s,
            links: vec![["x".into(), "y".into()]],
        };
        let ok = spec(vec![
            sw("x", &["node1", "node2"], "a"),
            sw("y", &["node3", "node4", "node5"], "b"),
        ]);
        let t = two(0).topology(&ok, 5).unwrap();
        assert_eq!((t.host_of(0), t.host_of(1)), (0, 1));
        let no_host = spec(vec![
            sw("x", &["node1", "node2"], "a"),
            sw("y", &["node3", "node4", "node5"], ""),
        ]);
        assert!(matches!(
            two(0).topology(&no_host, 5),
            Err(HostsError::SwitchWithoutHost { .. })
        ));
        let elsewhere = spec(vec![
            sw("x", &["node1", "node3"], "a"),
            sw("y", &["node2", "node4", "node5"], "b"),
        ]);
        assert!(matches!(
            two(0).topology(&elsewhere, 5),
            Err(HostsError::NodeElsewhere { ref node, .. }) if node == "node3"
        ));
        let unknown = spec(vec![
            sw("x", &["node1", "node2"], "a"),
            sw("y", &["node3", "node4", "node5"], "q"),
        ]);
        assert!(matches!(
            two(0).topology(&unknown, 5),
            Err(HostsError::SwitchHost { .. })
        ));
    }
}
