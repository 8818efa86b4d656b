//! A cluster's subnet of several switches, by the names a cluster file gives them
//! (`[[switch]]`, `[[link]]`), and the model's [`Topology`] it cables once node names are
//! LIDs (node `i` has LID `i + 1`). Every refusal of `hca_model::subnet` is said again
//! here in the file's own names, so that a user reads which switch or node to change.

use hca_model::subnet::{self, Topology, TopologyError, MAX_SWITCHES, MAX_SWITCH_PORTS};

use crate::ClusterSpec;

/// The longest switch name: NodeDescription holds 64 bytes, "hcabench switch " takes 16.
pub const MAX_SWITCH_NAME: usize = 48;

/// One switch: its name and the nodes cabled to its ports 1, 2, ... in order (its links
/// to other switches take the ports after those).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwitchSpec {
    pub name: String,
    pub nodes: Vec<String>,
    /// The host it is on, in a cluster that spans hosts (see [`crate::hosts`]).
    pub host: String,
}

/// The subnet's cabling by name. No switches: the default, one switch with node `n` on
/// its port `n`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologySpec {
    /// The switches; the first runs the SM.
    pub switches: Vec<SwitchSpec>,
    /// Inter-switch links by the names of the two switches each joins; two switches may
    /// have several.
    pub links: Vec<[String; 2]>,
}

/// Why a topology cannot be cabled, in the cluster file's names. Links are numbered from
/// 1 in the file's order.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TopologySpecError {
    #[error(
        "switch name {0:?}: want 1 to {MAX_SWITCH_NAME} letters, digits, '-', '_' or '.' \
         (the name is what ibnetdiscover shows and `hcabench link` takes)"
    )]
    Name(String),
    #[error("two switches are named {0:?}")]
    NameTwice(String),
    #[error("{0} switches: at most {MAX_SWITCHES}")]
    TooManySwitches(usize),
    #[error("switch {switch:?}: {node} is not a node (the nodes are node1 to node{nodes})")]
    NotANode {
        switch: String,
        node: String,
        nodes: usize,
    },
    #[error("{node} is on two switches, {first:?} and {second:?} (a node has one port)")]
    NodeTwice {
        node: String,
        first: String,
        second: String,
    },
    #[error("{0} is on no switch (once a [[switch]] is named, every node must be on one)")]
    NodeOnNoSwitch(String),
    #[error("[[link]] {link}: no switch {name:?} (the switches are {known})")]
    NoSwitch {
        link: usize,
        name: String,
        known: String,
    },
    #[error("[[link]] {link} joins switch {name:?} to itself")]
    SelfLink { link: usize, name: String },
    #[error(
        "switch {name:?} needs {ports} ports for its nodes and links: a switch has at most \
         {MAX_SWITCH_PORTS}"
    )]
    TooManyPorts { name: String, ports: usize },
    #[error(
        "switch {name:?} is not linked to {sm:?}, the first switch, whose SM must reach every \
         switch (add a [[link]])"
    )]
    Disconnected { name: String, sm: String },
    /// A refusal the checks by name leave to the model (none of those it has today).
    #[error(transparent)]
    Cabling(TopologyError),
}

impl TopologySpec {
    /// Whether this is the default single switch.
    pub fn is_single(&self) -> bool {
        self.switches.is_empty() && self.links.is_empty()
    }

    /// The cabling with the nodes as LIDs, in a cluster of `nodes`: every node on exactly
    /// one switch, every link between two named switches.
    pub fn topology(&self, nodes: usize) -> Result<Topology, TopologySpecError> {
        if self.is_single() {
            return Ok(Topology::single());
        }
        let index = |name: &str| self.switches.iter().position(|s| s.name == name);
        // Which switch each node is on (index: node), to name both of a node's switches.
        let mut on: Vec<Option<&str>> = vec![None; nodes];
        let mut switches = Vec::with_capacity(self.switches.len());
        for (k, s) in self.switches.iter().enumerate() {
            if !is_switch_name(&s.name) {
                return Err(TopologySpecError::Name(s.name.clone()));
            }
            if index(&s.name) != Some(k) {
                return Err(TopologySpecError::NameTwice(s.name.clone()));
            }
            let mut hcas = Vec::with_capacity(s.nodes.len());
            for node in &s.nodes {
                let i = ClusterSpec::node_index(node, nodes).ok_or_else(|| {
                    TopologySpecError::NotANode {
                        switch: s.name.clone(),
                        node: node.clone(),
                        nodes,
                    }
                })?;
                if let Some(first) = on.get_mut(i).and_then(|o| o.replace(&s.name)) {
                    return Err(TopologySpecError::NodeTwice {
                        node: node.clone(),
                        first: first.to_string(),
                        second: s.name.clone(),
                    });
                }
                hcas.push((i + 1) as u16);
            }
            switches.push(subnet::SwitchSpec {
                name: s.name.clone(),
                hcas,
            });
        }
        let links = (self.links.iter().enumerate())
            .map(|(k, pair)| {
                let end = |name: &String| {
                    index(name).ok_or_else(|| TopologySpecError::NoSwitch {
                        link: k + 1,
                        name: name.clone(),
                        known: self.known(),
                    })
                };
                Ok((end(&pair[0])?, end(&pair[1])?))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(i) = on.iter().position(Option::is_none) {
            return Err(TopologySpecError::NodeOnNoSwitch(ClusterSpec::node_name(i)));
        }
        Topology::new(switches, links).map_err(|e| self.named(e))
    }

    /// The switches' names for an error, or that there are none.
    fn known(&self) -> String {
        if self.switches.is_empty() {
            return "none: name them in [[switch]] tables".to_string();
        }
        let names: Vec<&str> = self.switches.iter().map(|s| s.name.as_str()).collect();
        names.join(", ")
    }

    /// The model's refusal in this spec's names.
    fn named(&self, e: TopologyError) -> TopologySpecError {
        let name = |i: usize| self.switches.get(i).map_or("", |s| s.name.as_str());
        let link_name = |k: usize| {
            let pair = self.links.get(k);
            pair.map_or(String::new(), |p| p[0].clone())
        };
        match e {
            TopologyError::NameTwice(n) => TopologySpecError::NameTwice(n),
            TopologyError::TooManySwitches(n) => TopologySpecError::TooManySwitches(n),
            TopologyError::SelfLink(k) => TopologySpecError::SelfLink {
                link: k + 1,
                name: link_name(k),
            },
            TopologyError::TooManyPorts(name, ports) => {
                TopologySpecError::TooManyPorts { name, ports }
            }
            TopologyError::Disconnected(n) => TopologySpecError::Disconnected {
                name: n,
                sm: name(0).to_string(),
            },
            // Checked above by name: no switch, a node twice, a LID no node has, a link
            // to a switch not named.
            e => TopologySpecError::Cabling(e),
        }
    }

    /// The same cabling with only the first `nodes` nodes (a bench that boots fewer nodes
    /// than its cluster file has).
    pub fn within(&self, nodes: usize) -> TopologySpec {
        TopologySpec {
            switches: (self.switches.iter())
                .map(|s| SwitchSpec {
                    name: s.name.clone(),
                    nodes: (s.nodes.iter())
                        .filter(|n| ClusterSpec::node_index(n, nodes).is_some())
                        .cloned()
                        .collect(),
                    host: s.host.clone(),
                })
                .collect(),
            links: self.links.clone(),
        }
    }
}

/// A switch name: what NodeDescription has room for, and one word on the control socket.
fn is_switch_name(name: &str) -> bool {
    (1..=MAX_SWITCH_NAME).contains(&name.len())
        && (name.chars()).all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sw(name: &str, nodes: &[&str]) -> SwitchSpec {
        SwitchSpec {
            name: name.into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            host: String::new(),
        }
    }

    fn link(a: &str, b: &str) -> [String; 2] {
        [a.into(), b.into()]
    }

    /// node1 and node2 on leaf1, node3 on leaf2, one link between them.
    fn two_leaves() -> TopologySpec {
        TopologySpec {
            switches: vec![sw("leaf1", &["node1", "node2"]), sw("leaf2", &["node3"])],
            links: vec![link("leaf1", "leaf2")],
        }
    }

    #[test]
    fn test_node_names_become_lids_on_their_switches_ports() {
        let t = two_leaves().topology(3).unwrap();
        let s = &t.switches()[0];
        assert_eq!((s.name.as_str(), s.hcas.as_slice()), ("leaf1", &[1, 2][..]));
        assert_eq!(t.switches()[1].hcas, [3]);
        assert_eq!(t.links(), [(0, 1)]);
        assert!(TopologySpec::default().topology(3).unwrap().is_single());
    }

    #[test]
    fn test_a_bench_on_fewer_nodes_leaves_the_others_off_their_switches() {
        let t = two_leaves().within(2);
        assert!(t.switches[1].nodes.is_empty());
        assert_eq!(t.topology(2).unwrap().switches()[1].hcas, [] as [u16; 0]);
    }

    #[test]
    fn test_bad_cablings_are_refused_in_the_files_names() {
        let bad = |t: TopologySpec| t.topology(3).unwrap_err().to_string();
        let mut t = two_leaves();
        t.switches[1].nodes.push("node4".into());
        let e = bad(t);
        assert!(e.contains("switch \"leaf2\": node4 is not a node"), "{e}");
        let mut t = two_leaves();
        t.switches[1].nodes.push("node2".into());
        let e = bad(t);
        assert!(
            e.contains("node2 is on two switches, \"leaf1\" and \"leaf2\""),
            "{e}"
        );
        let mut t = two_leaves();
        t.switches[1].nodes.clear();
        assert!(bad(t).contains("node3 is on no switch"));
        let mut t = two_leaves();
        t.links.push(link("leaf2", "spine"));
        let e = bad(t);
        assert!(
            e.contains("[[link]] 2: no switch \"spine\" (the switches are leaf1, leaf2)"),
            "{e}"
        );
        let mut t = two_leaves();
        t.links = vec![link("leaf2", "leaf2")];
        assert!(bad(t).contains("[[link]] 1 joins switch \"leaf2\" to itself"));
        let mut t = two_leaves();
        t.links.clear();
        let e = bad(t);
        assert!(
            e.contains("switch \"leaf2\" is not linked to \"leaf1\", the first switch"),
            "{e}"
        );
        let mut t = two_leaves();
        t.switches[1].name = "leaf1".into();
        assert!(bad(t).contains("two switches are named \"leaf1\""));
        for name in ["", "has space", "semi;colon", &"x".repeat(49)] {
            let mut t = two_leaves();
            t.switches[0].name = name.into();
            assert!(bad(t).contains("want 1 to 48 letters"), "{name:?}");
        }
        let links_only = TopologySpec {
            switches: vec![],
            links: vec![link("a", "b")],
        };
        let e = bad(links_only);
        assert!(e.contains("no switch \"a\" (the switches are none"), "{e}");
    }
}
