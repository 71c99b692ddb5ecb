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

            /// Copy into `old` every counter that differs from it, handing each new value to
            /// `changed` with its index in [`Counters::NAMES`] order: one pass, no copy of the
            /// counters that stood still.
            #[inline]
            pub(crate) fn update(&self, old: &mut Counters, mut changed: impl FnMut(usize, u64)) {
                let mut i = 0;
                $(
                    if self.$name != old.$name {
                        old.$name = self.$name;
                        changed(i, self.$name);
                    }
                    i += 1;
                )*
                let _ = i;
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
    /// Port counters, as a card's MAC keeps them (RMON): frames received into an RX queue
    /// (those in `rx_frames`) to the broadcast address.
    rx_broadcast,
    /// Received frames (of `rx_frames`) to a multicast address other than broadcast.
    rx_multicast,
    /// Received frames (of `rx_frames`) by their length on the wire, with the 4-byte FCS and
    /// padded to the 64-byte minimum as the sending MAC does: 64 bytes.
    rx_size_64,
    /// ... 65 to 127 bytes.
    rx_size_65_to_127,
    /// ... 128 to 255 bytes.
    rx_size_128_to_255,
    /// ... 256 to 511 bytes.
    rx_size_256_to_511,
    /// ... 512 to 1023 bytes.
    rx_size_512_to_1023,
    /// ... 1024 to 1522 bytes (1522: a VLAN-tagged frame of MTU 1500).
    rx_size_1024_to_1522,
    /// ... 1523 bytes and more (jumbo frames).
    rx_size_1523_to_max,
    /// Frames put on the wire (those in `tx_frames`) to the broadcast address. The null wire
    /// does not look at frames' bytes: there this and `tx_multicast` stay 0.
    tx_broadcast,
    /// Frames put on the wire to a multicast address other than broadcast.
    tx_multicast,
    /// Frames put on the wire by length on the wire (as `rx_size_64`): 64 bytes. On the null
    /// wire the segments of a large send count at their average length.
    tx_size_64,
    /// ... 65 to 127 bytes.
    tx_size_65_to_127,
    /// ... 128 to 255 bytes.
    tx_size_128_to_255,
    /// ... 256 to 511 bytes.
    tx_size_256_to_511,
    /// ... 512 to 1023 bytes.
    tx_size_512_to_1023,
    /// ... 1024 to 1522 bytes.
    tx_size_1024_to_1522,
    /// ... 1523 bytes and more.
    tx_size_1523_to_max,
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

/// The RMON size bucket (0 for 64 bytes ... 6 for 1523 and more) of a frame of `len` bytes
/// without its FCS: 4 bytes of FCS added, and short frames padded to the 64-byte minimum.
#[inline(always)]
pub(crate) fn size_bucket(len: usize) -> usize {
    match len + 4 {
        ..=64 => 0,
        65..=127 => 1,
        128..=255 => 2,
        256..=511 => 3,
        512..=1023 => 4,
        1024..=1522 => 5,
        _ => 6,
    }
}

/// What the port counters of a received frame depend on, found once with its headers: its
/// destination's kind and its size bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RxMac {
    cast: Cast,
    bucket: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cast {
    Unicast,
    Broadcast,
    Multicast,
}

impl RxMac {
    /// The kind and size of `frame`.
    pub(crate) fn of(frame: &[u8]) -> RxMac {
        let cast = match frame.get(..6) {
            Some(dst) if dst == [0xff; 6] => Cast::Broadcast,
            Some(dst) if dst[0] & 1 != 0 => Cast::Multicast,
            _ => Cast::Unicast,
        };
        RxMac {
            cast,
            bucket: size_bucket(frame.len()) as u8,
        }
    }
}

impl Counters {
    /// The port counters of `n` frames received into an RX queue, whose [`RxMac`] is `mac`.
    #[inline(always)]
    pub(crate) fn count_rx(&mut self, mac: RxMac, n: u64) {
        match mac.cast {
            Cast::Unicast => {}
            Cast::Broadcast => self.rx_broadcast += n,
            Cast::Multicast => self.rx_multicast += n,
        }
        // A match, not an array of the seven references: that array is built per frame.
        let bucket = match mac.bucket {
            0 => &mut self.rx_size_64,
            1 => &mut self.rx_size_65_to_127,
            2 => &mut self.rx_size_128_to_255,
            3 => &mut self.rx_size_256_to_511,
            4 => &mut self.rx_size_512_to_1023,
            5 => &mut self.rx_size_1024_to_1522,
            _ => &mut self.rx_size_1523_to_max,
        };
        *bucket += n;
    }
}

impl Counters {
    /// The size bucket counter of `len`-byte frames sent (see [`size_bucket`]).
    #[inline(always)]
    pub(crate) fn tx_size(&mut self, len: usize) -> &mut u64 {
        match size_bucket(len) {
            0 => &mut self.tx_size_64,
            1 => &mut self.tx_size_65_to_127,
            2 => &mut self.tx_size_128_to_255,
            3 => &mut self.tx_size_256_to_511,
            4 => &mut self.tx_size_512_to_1023,
            5 => &mut self.tx_size_1024_to_1522,
            _ => &mut self.tx_size_1523_to_max,
        }
    }
}

/// What a port's MAC counts of frames going one way: broadcast, multicast and the size
/// buckets.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct MacTally {
    pub(crate) broadcast: u64,
    pub(crate) multicast: u64,
    pub(crate) sizes: [u64; 7],
}

impl MacTally {
    /// One frame, with its bytes.
    #[inline(always)]
    pub(crate) fn frame(&mut self, frame: &[u8]) {
        self.frame_of(frame, frame.len());
    }

    /// [`TxMac::frame`] of a frame of `len` bytes that starts with `head`.
    #[inline(always)]
    pub(crate) fn frame_of(&mut self, head: &[u8], len: usize) {
        if let Some(dst) = head.get(..6) {
            if dst == [0xff; 6] {
                self.broadcast += 1;
            } else if dst[0] & 1 != 0 {
                self.multicast += 1;
            }
        }
        self.sizes[size_bucket(len)] += 1;
    }

    /// The destination of a frame whose first 8 bytes are `head` (memory order, read as
    /// little-endian), [`MacTally::frame_of`]'s test in two compares; its size is counted
    /// apart ([`MacTally::sized`]).
    #[inline(always)]
    pub(crate) fn dst_word(&mut self, head: u64) {
        let dst = head & 0xffff_ffff_ffff;
        self.broadcast += u64::from(dst == 0xffff_ffff_ffff);
        self.multicast += u64::from(dst != 0xffff_ffff_ffff && dst & 1 != 0);
    }

    /// `n` frames of `len` bytes whose bytes were not looked at.
    #[inline(always)]
    pub(crate) fn sized(&mut self, len: usize, n: u64) {
        self.sizes[size_bucket(len)] += n;
    }

    pub(crate) fn add_tx(&self, c: &mut Counters) {
        c.tx_broadcast += self.broadcast;
        c.tx_multicast += self.multicast;
        for (d, s) in [
            &mut c.tx_size_64,
            &mut c.tx_size_65_to_127,
            &mut c.tx_size_128_to_255,
            &mut c.tx_size_256_to_511,
            &mut c.tx_size_512_to_1023,
            &mut c.tx_size_1024_to_1522,
            &mut c.tx_size_1523_to_max,
        ]
        .into_iter()
        .zip(self.sizes)
        {
            *d += s;
        }
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

    #[test]
    fn size_buckets_count_the_fcs_and_the_padding() {
        for (len, b) in [
            (0, 0),
            (42, 0),
            (60, 0),
            (61, 1),
            (123, 1),
            (124, 2),
            (251, 2),
            (252, 3),
            (1019, 4),
            (1020, 5),
            (1518, 5),
            (1519, 6),
            (9018, 6),
        ] {
            assert_eq!(size_bucket(len), b, "{len}");
        }
        let mut t = MacTally::default();
        t.frame(&[0xff; 64]);
        t.frame(&[0x01, 0, 0x5e, 0, 0, 1, 0, 0]);
        t.frame(&[0x02; 200]);
        t.sized(1500, 3);
        let mut c = Counters::default();
        t.add_tx(&mut c);
        assert_eq!((c.tx_broadcast, c.tx_multicast), (1, 1));
        assert_eq!(
            (c.tx_size_64, c.tx_size_65_to_127, c.tx_size_128_to_255),
            (1, 1, 1)
        );
        assert_eq!(c.tx_size_1024_to_1522, 3);
        assert_eq!(c.rx_size_64, 0);
    }
}
