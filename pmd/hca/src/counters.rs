//! What a bus analyser on the PCIe link and a port counter block would show.

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// A snapshot of the device counters. Field names are stable: the driver exposes them as
        /// xstats `hca_<name>`.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct Counters {
            $($(#[doc = $doc])* pub $name: u64,)*
        }

        impl Counters {
            /// Every counter name, in [`Counters::iter`] order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// `(name, value)` for every counter, in a stable order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($name), self.$name)),*].into_iter()
            }

            /// Every value, in [`Counters::NAMES`] order.
            pub fn values(&self) -> [u64; Counters::NAMES.len()] {
                [$(self.$name),*]
            }

            /// Counters from values in [`Counters::NAMES`] order (missing ones are 0).
            pub fn from_values(v: &[u64]) -> Counters {
                let mut it = v.iter().copied();
                Counters {
                    $($name: it.next().unwrap_or(0),)*
                }
            }
        }
    };
}

counters! {
    /// UAR send-doorbell writes taken (two that land before the device looks count once).
    doorbells,
    /// Doorbells naming no send queue of the adapter (ignored).
    doorbells_bad_qpn,
    /// Doorbells for a send queue not in `Ready` (dropped, as by a QP not in RTS).
    doorbells_not_ready,
    /// Walks of a send queue that executed WQEs without a doorbell of its own seen: another
    /// queue's doorbell arrived on the shared UAR page, where it may have overwritten this
    /// queue's (two doorbells that land on one page before the device looks merge; a card
    /// would have taken both). A driver that shares UAR pages and forgets a doorbell would
    /// have its WQEs run anyway; this counter shows it.
    doorbells_inferred,
    /// BlueFlame writes seen, whole or torn.
    bf_bursts,
    /// BlueFlame writes that did not arrive as one whole copy (all of them without WC): the
    /// copy still differed from the WQE in ring memory after the device re-read it, and no
    /// newer write had replaced it.
    bf_torn,
    /// 8-byte pieces of torn BlueFlame writes.
    bf_pieces,
    /// BlueFlame writes for another QPN, or for a WQE already consumed (used as nothing).
    bf_ignored,
    /// Whole BlueFlame copies a newer write to the same half replaced before the device used
    /// them (it ran those WQEs from ring memory). Writes replaced before the device even saw
    /// them are not in `bf_bursts` at all: the driver's own count of BF writes minus
    /// `bf_bursts` says how many.
    bf_superseded,
    /// WQEs fetched from ring memory.
    wqe_fetched,
    /// WQEs taken from a BlueFlame copy instead of ring memory.
    wqe_from_bf,
    /// Bytes of WQEs read from ring memory (DS * 16 per fetched WQE).
    wqe_fetch_bytes,
    /// TXBBs consumed.
    txbbs,
    /// Executed WQEs with a stamp value (0x7fffffff / 0xffffffff) as the first dword of a later
    /// TXBB: a hint that the driver published the owner before the rest (doc/prm.md 10.1), or just
    /// payload bytes that happen to look like one.
    wqe_stamp_seen,
    /// Frames put on the wire.
    tx_frames,
    /// Bytes of the frames put on the wire.
    tx_bytes,
    /// Frames the port could not put on its wire: its link down, no port at the other end of
    /// a cable, the TAP interface refused it, the pcap file could not be written. A frame that
    /// left the port counts as sent even if the receiving side then drops it: that side counts
    /// it.
    tx_drops_wire,
    /// Bytes read from host memory for frames (gather entries and nothing else).
    dma_read_bytes,
    /// Bytes written to host memory for received frames.
    dma_write_bytes,
    /// CQEs written (including error CQEs).
    cqes,
    /// Error CQEs written.
    error_cqes,
    /// Times a queue had to wait because its CQ was full.
    cq_full_stalls,
    /// CQ arm doorbells taken (UAR + 0x20).
    cq_arms,
    /// Arm doorbells naming no CQ of the adapter, or with an unknown command (ignored).
    cq_arms_bad,
    /// Completion events raised by armed CQs (one per arming).
    cq_events,
    /// Frames delivered to an RX queue.
    rx_frames,
    /// Bytes of the frames delivered to an RX queue.
    rx_bytes,
    /// Received frames dropped because no RX WQE was posted (or no RX queue exists).
    rx_drops_no_wqe,
    /// Frames that reached the port but found its receive buffer full or the port down (also
    /// what the buffer held when the port went down).
    rx_drops_wire,
    /// Received frames dropped because their RQ's completion queue stayed full for longer
    /// than the device waits (`RX_CQ_PATIENCE`).
    rx_drops_cq_full,
    /// Received frames larger than the posted buffers (error CQE, queue stays usable).
    rx_drops_too_long,
    /// Received frames dropped on an RX queue in error (bad scatter entry).
    rx_drops_error,
    /// Received frames steered to an RX queue not in `Ready` (as a WQ not in RDY).
    rx_drops_not_ready,
    /// Received frames dropped by the destination-MAC filter (not promiscuous, not broadcast,
    /// a unicast address not in the MAC table or a multicast one neither in the multicast list
    /// nor let through by all-multicast).
    rx_drops_filter,
    /// Received frames whose L3 length (after the MAC header and VLAN tags) exceeds the MTU.
    rx_drops_mtu,
    /// Received tagged frames whose VLAN ID is not in the VLAN filter (while filtering and not
    /// promiscuous).
    rx_drops_vlan,
    /// Received frames a flow rule with the drop action matched.
    rx_drops_flow,
    /// Send WQEs completed in error on purpose (`Faults::tx_error_every`).
    inj_tx_errors,
    /// Received frames given a buffer error on purpose (`Faults::rx_error_every`).
    inj_rx_errors,
    /// UAR doorbells lost on purpose (`Faults::doorbell_drop_every`).
    inj_doorbells_dropped,
    /// Times the link went down on purpose (`Faults::link_flap_every`).
    inj_link_downs,
    /// Send completions lost on purpose (`Faults::cqe_drop_every`): not written, not in
    /// `cqes`.
    inj_cqe_drops,
    /// Send completions written a second time on purpose (`Faults::cqe_dup_every`); both
    /// copies are in `cqes`.
    inj_cqe_dups,
}

impl Counters {
    /// Frames the port received but could not place in host memory: no RX WQE, its receive
    /// buffer full or the port down, the CQ full for too long, the RQ in error. This is what a
    /// NIC reports as missed (DPDK's `imissed`, `rx_missed_errors`); the `rx_drops_*` fields
    /// say why.
    pub fn rx_missed(&self) -> u64 {
        self.rx_drops_no_wqe
            + self.rx_drops_wire
            + self.rx_drops_cq_full
            + self.rx_drops_error
            + self.rx_drops_not_ready
    }

    /// Every frame that reached the port and was not delivered to an RQ as a good frame:
    /// [`Counters::rx_missed`] plus frames filtered by MAC or VLAN, dropped by a flow rule,
    /// longer than the MTU, or
    /// larger than the posted buffers (those get an error CQE). On a cable, what one port sent
    /// equals what the other received plus this.
    pub fn rx_dropped(&self) -> u64 {
        self.rx_missed()
            + self.rx_drops_filter
            + self.rx_drops_vlan
            + self.rx_drops_flow
            + self.rx_drops_mtu
            + self.rx_drops_too_long
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_fields() {
        let c = Counters {
            doorbells: 3,
            rx_drops_mtu: 7,
            ..Counters::default()
        };
        let v: Vec<_> = c.iter().collect();
        assert_eq!(v.len(), Counters::NAMES.len());
        assert_eq!(v[0], ("doorbells", 3));
        let mtu = Counters::NAMES
            .iter()
            .position(|&n| n == "rx_drops_mtu")
            .unwrap();
        assert_eq!(v[mtu], ("rx_drops_mtu", 7));
        let values: Vec<u64> = v.iter().map(|&(_, x)| x).collect();
        assert_eq!(Counters::from_values(&values), c);
    }
}
