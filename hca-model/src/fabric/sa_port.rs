//! The subnet administrator's port on the fabric, what the SA asks of the ports, and the
//! subnet's partitions.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, Weak};

use super::{DropReason, Fabric, Inner, Lid, PacketSink, Rejected};
use crate::packet::Packet;
use crate::partition::{self, PKeyTable, Partition, PartitionError};
use crate::sa::SubnetAdmin;
use crate::sync::{Unpoisoned, UnpoisonedRw};

/// A subnet's partitions beside the default and the port tables they make.
pub(super) type Partitioning = (Vec<Partition>, Vec<(Lid, PKeyTable)>);

/// The port the subnet administrator answers on: a packet for [`SM_LID`] is a query, and
/// its answer goes back onto the fabric like any port's packet.
pub(super) struct SaPort {
    pub(super) fabric: Weak<Inner>,
    pub(super) sa: Mutex<SubnetAdmin>,
    /// The switch's PMA, which reads device counters: never under the SA's lock (a port
    /// attaching holds its device's lock and then takes the SA's).
    pub(super) pma: Mutex<crate::sa::pma::Agent>,
}

impl PacketSink for SaPort {
    fn deliver(&self, pkt: Packet) -> Result<(), Rejected> {
        let Some(inner) = self.fabric.upgrade() else {
            return Err(Rejected::of(pkt));
        };
        let fabric = Fabric { inner };
        if pkt.dest_qpn == crate::abi::SMI_QPN {
            // To the switches' agents, which may send it on to another host.
            let out = {
                let mut sa = self.sa.lock_unpoisoned();
                sa.answer_smp(&pkt, None, &fabric)
            };
            fabric.retrain_set_down();
            return match out {
                Some(out) => {
                    fabric.smp_out(Some(out));
                    Ok(())
                }
                None => Err(Rejected::of(pkt)),
            };
        }
        // Every switch here has a PMA; the SA is the SM's switch's.
        let counters = (self.pma.lock_unpoisoned()).answer(&pkt, &fabric);
        let answer = match counters {
            Some(a) => Some(vec![a]),
            None if pkt.dlid != crate::sa::SM_LID => None,
            // Under a user's SM the SA is that SM's, not the switch's.
            None if fabric.guest_sm() => None,
            None => {
                let mut sa = self.sa.lock_unpoisoned();
                sa.answer(&pkt, &fabric)
            }
        };
        match answer {
            // Queued behind what is in flight; the pump that delivered the query moves it.
            Some(packets) => {
                for a in packets {
                    fabric.enqueue(a);
                }
                Ok(())
            }
            None => Err(Rejected::of(pkt)),
        }
    }

    fn undeliverable(&self, _pkt: Packet, _why: DropReason) {}

    fn port_guid(&self) -> Option<u64> {
        None
    }
}

/// The SA's view: this host's ports, and on a subnet that spans hosts the ports the others
/// announced (`remote.rs`).
impl crate::sa::Ports for Fabric {
    fn lid_of(&self, guid: u64) -> Option<Lid> {
        // The index, where it still holds (else the walk below: a port gone, or one
        // whose GUID changed since it attached).
        if let Some(lid) = self.indexed_lid(guid) {
            if self.guid_of(lid) == Some(guid) {
                return Some(lid);
            }
        }
        let ports = self.inner.ports.read_unpoisoned();
        let local = ports.iter().enumerate().find_map(|(lid, p)| {
            let sink = p.as_ref()?.upgrade()?;
            (sink.port_guid() == Some(guid)).then_some(lid as Lid)
        });
        drop(ports);
        local.or_else(|| {
            (self.inner.remote_ports.read_unpoisoned().values())
                .find(|(_, p)| p.guid == guid)
                .map(|(_, p)| p.lid)
        })
    }

    fn guid_of(&self, lid: Lid) -> Option<u64> {
        match self.port(lid) {
            Some(p) => p.port_guid(),
            None => self.remote_port(lid).map(|p| p.guid),
        }
    }

    fn lids(&self) -> Vec<Lid> {
        let mut lids = self.local_lids();
        let remote = self.inner.remote_ports.read_unpoisoned();
        if !remote.is_empty() {
            lids.extend(remote.keys().copied());
            lids.sort_unstable();
            lids.dedup();
        }
        lids
    }

    fn link_up(&self, lid: Lid) -> bool {
        if let Some(p) = self.remote_port(lid) {
            return p.up;
        }
        let down = self.inner.links_down.lock_unpoisoned();
        !down.contains(&lid)
    }

    fn capability_mask(&self, lid: Lid) -> u32 {
        match self.port(lid) {
            Some(p) => p.capability_mask(),
            None => self.remote_port(lid).map_or(0, |p| p.caps),
        }
    }

    fn pkeys(&self, lid: Lid) -> PKeyTable {
        self.pkey_table(lid)
    }

    fn now_ns(&self) -> u64 {
        Fabric::now_ns(self)
    }

    fn counters(&self, lid: Lid) -> Option<[u64; crate::abi::COUNTERS_LEN as usize]> {
        Fabric::counters(self, lid)
    }

    fn switch_link_stats(&self, link: crate::subnet::SwitchLink) -> Option<super::SwitchLinkStats> {
        Fabric::switch_link_stats(self, link)
    }

    fn switch_tables(
        &self,
    ) -> Option<&std::sync::RwLock<Vec<crate::sa::switch_tables::SwitchTables>>> {
        self.user_tables()
    }

    fn subnet(&self) -> std::sync::Arc<crate::subnet::Subnet> {
        Fabric::subnet(self)
    }
}

impl Fabric {
    /// Runs `f` on the subnet administrator's state (its multicast groups).
    pub fn with_sa<T>(&self, f: impl FnOnce(&SubnetAdmin) -> T) -> T {
        f(&self.inner.sa.sa.lock_unpoisoned())
    }

    /// Sets the PacketLifeTime the subnet administrator gives paths and groups (OpenSM's
    /// `packet_life_time`; 4.096 us * 2^life, see [`crate::sa::DEFAULT_PACKET_LIFE`]).
    /// Set it before guests ask for paths: ib_cm derives a connection's QP ACK timeout
    /// from it. None (changing nothing) past [`crate::sa::MAX_PACKET_LIFE`].
    pub fn set_packet_life(&self, life: u8) -> Option<()> {
        (self.inner.sa.sa.lock_unpoisoned()).set_packet_life(life)
    }

    /// Queues the SA's trap Reports for a port coming into service or going out of it
    /// (trap 64 or 65); the next tick moves them.
    pub(super) fn report_port(&self, lid: Lid, up: bool) {
        if self.guest_sm() {
            return;
        }
        let reports = {
            let mut sa = self.inner.sa.sa.lock_unpoisoned();
            sa.port_changed(lid, up, self)
        };
        if !reports.is_empty() {
            for r in reports {
                self.enqueue(r);
            }
            self.inner.reports_waiting.store(true, Relaxed);
        }
    }

    /// The partitions beside the default, as the subnet manager sets them: every port's
    /// P_Key table follows (ports on the fabric are told now, later ones as they attach),
    /// and the SA answers by them. Replaces the partitions set before.
    pub fn set_partitions(&self, parts: &[Partition]) -> Result<(), PartitionError> {
        let tables = partition::tables(parts)?;
        *self.inner.pkeys.write_unpoisoned() = (parts.to_vec(), tables);
        let pkeys: Vec<u16> = parts.iter().map(|p| p.pkey).collect();
        (self.inner.sa.sa.lock_unpoisoned()).set_partitions(&pkeys);
        let ports: Vec<_> = {
            let ports = self.inner.ports.read_unpoisoned();
            ports
                .iter()
                .enumerate()
                .map(|(l, p)| (l as Lid, p.clone()))
                .collect()
        };
        for (lid, port) in ports {
            if let Some(sink) = port.and_then(|w| w.upgrade()) {
                sink.pkeys_changed(&self.pkey_table(lid));
            }
        }
        Ok(())
    }

    /// The P_Key table of the port at `lid`.
    pub fn pkey_table(&self, lid: Lid) -> PKeyTable {
        let pkeys = self.inner.pkeys.read_unpoisoned();
        (pkeys.1.iter())
            .find(|(l, _)| *l == lid)
            .map_or_else(partition::default_table, |(_, t)| *t)
    }

    /// Every partition beside the default, as last set (its P_Key with the full bit), in
    /// the order given (`hcabench fabric`).
    pub fn partitions(&self) -> Vec<Partition> {
        let pkeys = self.inner.pkeys.read_unpoisoned();
        (pkeys.0.iter())
            .map(|p| Partition {
                pkey: p.pkey | partition::FULL_MEMBER,
                ..p.clone()
            })
            .collect()
    }

    pub(super) fn tell_pkeys(&self, lid: Lid, sink: &Weak<dyn PacketSink>) {
        if let Some(s) = sink.upgrade() {
            s.pkeys_changed(&self.pkey_table(lid));
        }
    }
}
