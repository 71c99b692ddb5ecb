//! Hardware formats of the mlx4 (ConnectX-3) data path: WQE segments, CQEs, doorbell values.
//!
//! Everything here is a typed view over bytes, in the shape of smoltcp's `wire` module: a
//! `View<T: AsRef<[u8]>>` with big-endian accessors over a private `field` map of byte ranges.
//! The driver encodes with these views and the software HCA decodes with them, so the layouts are
//! pinned by tests over literal byte arrays (`doc/prm.md` sections 1-6) rather than by either
//! user.
//!
//! All multi-byte fields are big-endian on the device side; accessors take and return host values.

#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cqe;
mod port;
mod wqe;

pub use cqe::Cqe;
pub use port::{FlowControl, PortEvent, QueueState, DEFAULT_RSS_KEY, RSS_KEY_LEN};
pub use wqe::{inline_header, CtrlSeg, DataSeg, InlineHdr, RxDataSeg};

/// log2 of the send basic block size.
pub const TXBB_SHIFT: u32 = 6;
/// Send basic block (TXBB): the SQ ring's slot size and a WQE's allocation unit.
pub const TXBB_SIZE: usize = 64;
/// Size of one WQE "DS" unit; the control segment's size field counts these.
pub const DS_SIZE: usize = 16;
/// Largest DS count the 6-bit size field can express (1008 bytes).
pub const MAX_WQE_DS: u8 = 63;
/// Offset of the 32-bit send doorbell register in a UAR page.
pub const SEND_DOORBELL_OFFSET: usize = 0x14;
/// Offset of the 64-bit CQ arm doorbell register in a UAR page.
pub const CQ_DOORBELL_OFFSET: usize = 0x20;
/// CQ doorbell command "request notification": an event for the next completion (bits 27:24
/// of the doorbell's high word).
pub const CQ_DB_REQ_NOT: u32 = 2 << 24;
/// CQ doorbell command "request notification for solicited completions only".
pub const CQ_DB_REQ_NOT_SOL: u32 = 1 << 24;
/// Size of a UAR page as the device exposes it (always 4 KiB, whatever the host page size).
pub const UAR_PAGE_SIZE: usize = 4096;
/// First dword (host order) of a freed TXBB; bit 31 must then be set to the parity of the pass
/// just consumed so the slot is invalid for the next pass.
pub const STAMP_DWORD: u32 = 0x7fff_ffff;
/// Bit 31 of a segment's first dword marks an inline segment.
pub const INLINE_SEG_FLAG: u32 = 1 << 31;
/// An inline segment (header plus data) must not cross a boundary of this many bytes in the WQE.
pub const INLINE_ALIGN: usize = 64;
/// lkey that terminates an RX scatter list early.
pub const INVALID_LKEY: u32 = 0x100;
/// Bytes the device may prefetch beyond the last posted WQE; the driver keeps this plus one WQE
/// free in the SQ.
pub const SQ_HEADROOM_BYTES: usize = 2048;
/// Longest L2-L4 header an LSO segment carries (DPDK mlx4's `MLX4_MAX_TSO_HEADER`).
pub const LSO_MAX_HEADER: usize = 192;

/// The LSO segment after the control segment (doc/prm.md 1.5): `mss_hdr_size` (BE32, `mss << 16 |
/// header length`), then the header bytes, padded to 16 bytes. Its length in the WQE.
pub const fn lso_seg_len(hdr_len: usize) -> usize {
    (4 + hdr_len).div_ceil(DS_SIZE) * DS_SIZE
}

/// The LSO segment's first dword (host order).
pub const fn lso_mss_hdr_size(mss: u16, hdr_len: u16) -> u32 {
    (mss as u32) << 16 | hdr_len as u32
}

/// Size of a CQE (64-byte CQEs are not used).
pub const CQE_SIZE: usize = 32;

/// Number of TXBBs a WQE of `ds` DS units occupies.
pub const fn wqe_txbbs(ds: u8) -> u32 {
    ((ds as u32 * DS_SIZE as u32) + TXBB_SIZE as u32 - 1) >> TXBB_SHIFT
}

/// Error of the `new_checked` constructors: the buffer is shorter than the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer is too short for the view.
    Truncated,
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Truncated => f.write_str("buffer too short for the descriptor"),
        }
    }
}

/// WQE opcodes (owner_opcode bits 4:0).
pub mod opcode {
    /// No operation: completes without moving data.
    pub const NOP: u8 = 0x00;
    /// Send with invalidate.
    pub const SEND_INVAL: u8 = 0x01;
    /// RDMA write.
    pub const RDMA_WRITE: u8 = 0x08;
    /// RDMA write with immediate.
    pub const RDMA_WRITE_IMM: u8 = 0x09;
    /// Send: the only opcode an Ethernet frame needs.
    pub const SEND: u8 = 0x0a;
    /// Send with immediate.
    pub const SEND_IMM: u8 = 0x0b;
    /// Large send offload (TSO).
    pub const LSO: u8 = 0x0e;
    /// RDMA read.
    pub const RDMA_READ: u8 = 0x10;
    /// Configuration command; also what a stamped TXBB decodes to.
    pub const CONFIG_CMD: u8 = 0x1f;
}

/// Bits of the control segment's `owner_opcode` word (host order).
pub mod owner_opcode {
    /// Ownership: must equal the parity of the ring pass for the device to execute the WQE.
    pub const OWNER: u32 = 1 << 31;
    /// No error completion.
    pub const NEC: u32 = 1 << 29;
    /// Inner IP header checksum (tunnels).
    pub const IIP: u32 = 1 << 28;
    /// Inner L4 checksum (tunnels).
    pub const ILP: u32 = 1 << 27;
    /// Shift of the 16-bit BlueFlame counter.
    pub const BF_COUNTER_SHIFT: u32 = 8;
    /// Mask of the 16-bit BlueFlame counter.
    pub const BF_COUNTER_MASK: u32 = 0xffff << BF_COUNTER_SHIFT;
    /// Bit drivers set together with LSO (meaning unverified).
    pub const RR: u32 = 1 << 6;
    /// Mask of the opcode.
    pub const OPCODE_MASK: u32 = 0x1f;
}

/// Values of the control segment's `ins_vlan` byte.
pub mod ins_vlan {
    /// Insert an 802.1Q C-VLAN tag from `vlan_tag`.
    pub const CVLAN: u8 = 0x40;
    /// Insert an 802.1ad S-VLAN tag from `vlan_tag`.
    pub const SVLAN: u8 = 0x80;
}

/// Bits of the control segment's `fence_size` byte.
pub mod fence_size {
    /// Fence: wait for earlier WQEs.
    pub const FENCE: u8 = 0x40;
    /// WQE size in DS units, control segment included.
    pub const DS_MASK: u8 = 0x3f;
}

/// Low flag bits of the control segment's `srcrb_flags` word (host order).
pub mod srcrb {
    /// Strong ordering.
    pub const STRONG_ORDER: u32 = 1 << 7;
    /// Compute the TCP/UDP checksum.
    pub const TCP_UDP_CSUM: u32 = 1 << 5;
    /// Compute the IPv4 header checksum.
    pub const IP_CSUM: u32 = 1 << 4;
    /// Request a CQE for this WQE (both bits of the C field).
    pub const CQ_UPDATE: u32 = 3 << 2;
    /// Solicited event; on raw Ethernet QPs "no ICRC", always set by drivers.
    pub const SOLICIT: u32 = 1 << 1;
    /// Force loopback.
    pub const FORCE_LOOPBACK: u32 = 1;
}

/// CQE opcodes (owner_sr_opcode bits 4:0).
pub mod cqe_opcode {
    /// RX: send received.
    pub const RX_SEND: u8 = 0x01;
    /// RX: send with immediate received.
    pub const RX_SEND_IMM: u8 = 0x02;
    /// CQ resize.
    pub const RESIZE: u8 = 0x16;
    /// Error completion: syndrome at offset 27.
    pub const ERROR: u8 = 0x1e;
}

/// Bits of the CQE's `owner_sr_opcode` byte.
pub mod cqe_owner {
    /// Ownership: software owns the CQE at consumer count `n` iff this equals `(n & cqe_cnt) != 0`.
    pub const OWNER: u8 = 0x80;
    /// Set for send (TX) completions.
    pub const SEND: u8 = 0x40;
    /// Mask of the opcode.
    pub const OPCODE_MASK: u8 = 0x1f;
}

/// Error CQE syndromes (offset 27).
pub mod syndrome {
    /// Local length error.
    pub const LOCAL_LENGTH: u8 = 0x01;
    /// Local QP operation error (malformed WQE).
    pub const LOCAL_QP_OP: u8 = 0x02;
    /// Local protection error (bad lkey, address outside the region).
    pub const LOCAL_PROT: u8 = 0x04;
    /// WQE flushed because the queue is in error.
    pub const WR_FLUSH: u8 = 0x05;
    /// Memory window bind error.
    pub const MW_BIND: u8 = 0x06;
    /// Bad response.
    pub const BAD_RESP: u8 = 0x10;
    /// Local access error.
    pub const LOCAL_ACCESS: u8 = 0x11;
    /// Remote invalid request.
    pub const REMOTE_INVAL_REQ: u8 = 0x12;
    /// Remote access error.
    pub const REMOTE_ACCESS: u8 = 0x13;
    /// Remote operation error.
    pub const REMOTE_OP: u8 = 0x14;
    /// Transport retry counter exceeded.
    pub const TRANSPORT_RETRY_EXC: u8 = 0x15;
    /// RNR retry counter exceeded.
    pub const RNR_RETRY_EXC: u8 = 0x16;
    /// Remote aborted.
    pub const REMOTE_ABORTED: u8 = 0x22;
}

/// Bits of the RX CQE status word at offset 16, in DPDK's 32-bit host-order view (doc/prm.md 6.3).
pub mod rx_status {
    /// L4 (TCP/UDP) checksum verified.
    pub const TCP_UDP_CSUM_OK: u32 = 1 << 2;
    /// Bad FCS.
    pub const BAD_FCS: u32 = 1 << 4;
    /// IPv6 fragment.
    pub const IPV6F: u32 = 1 << 12;
    /// IPv4 packet.
    pub const IPV4: u32 = 1 << 22;
    /// IPv4 fragment.
    pub const IPV4F: u32 = 1 << 23;
    /// IPv6 packet.
    pub const IPV6: u32 = 1 << 24;
    /// IPv4 with options.
    pub const IPV4OPT: u32 = 1 << 25;
    /// TCP segment.
    pub const TCP: u32 = 1 << 26;
    /// UDP datagram.
    pub const UDP: u32 = 1 << 27;
    /// IP header checksum verified.
    pub const IP_HDR_CSUM_OK: u32 = 1 << 28;
    /// Bits DPDK uses to index its packet-type table (`>> 22`).
    pub const PTYPE_MASK: u32 = IPV4 | IPV4F | IPV6 | IPV4OPT | TCP | UDP;
}

/// CQE `vlan_my_qpn` bits beyond the QPN.
pub mod cqe_vlan {
    /// Mask of the QPN.
    pub const QPN_MASK: u32 = 0x00ff_ffff;
    /// A C-VLAN tag was stripped into `sl_vid`.
    pub const CVLAN_PRESENT: u32 = 1 << 29;
    /// An S-VLAN tag was stripped into `sl_vid`.
    pub const SVLAN_PRESENT: u32 = 1 << 30;
    /// ConnectX-3 Pro: the frame is a tunnel (VXLAN); the status word describes the inner
    /// packet (DPDK's `MLX4_CQE_L2_TUNNEL`).
    pub const L2_TUNNEL: u32 = 1 << 27;
    /// ConnectX-3 Pro: the tunnel's outer L3 is IPv4 (`MLX4_CQE_L2_TUNNEL_IPV4`).
    pub const L2_TUNNEL_IPV4: u32 = 1 << 25;
    /// ConnectX-3 Pro: the outer L4 (UDP) checksum is good (`MLX4_CQE_L2_TUNNEL_L4_CSUM`).
    pub const L2_TUNNEL_L4_CSUM: u32 = 1 << 26;
    /// ConnectX-3 Pro: the outer IP header checksum is good (`MLX4_CQE_L2_TUNNEL_IPOK`).
    pub const L2_TUNNEL_IPOK: u32 = 1 << 31;
}

/// The UDP destination port of VXLAN (IANA), the tunnel a ConnectX-3 Pro parses.
pub const VXLAN_PORT: u16 = 4789;

/// Host-order value of the send doorbell for `qpn`; the driver stores it big-endian at
/// UAR + [`SEND_DOORBELL_OFFSET`], so the register bytes read QPN\[23:0\] then 0x00.
pub const fn doorbell_value(qpn: u32) -> u32 {
    (qpn & 0x00ff_ffff) << 8
}

/// Decode a send doorbell from the four bytes at UAR + 0x14; the low byte is ignored.
pub const fn doorbell_qpn(bytes: [u8; 4]) -> u32 {
    u32::from_be_bytes(bytes) >> 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbell_bytes() {
        assert_eq!(doorbell_value(0x40).to_be_bytes(), [0x00, 0x00, 0x40, 0x00]);
        assert_eq!(
            doorbell_value(0x12_3456).to_be_bytes(),
            [0x12, 0x34, 0x56, 0x00]
        );
        assert_eq!(doorbell_qpn([0x12, 0x34, 0x56, 0x99]), 0x12_3456);
    }

    #[test]
    fn txbbs() {
        assert_eq!(wqe_txbbs(1), 1);
        assert_eq!(wqe_txbbs(4), 1);
        assert_eq!(wqe_txbbs(5), 2);
        assert_eq!(wqe_txbbs(MAX_WQE_DS), 16);
    }

    #[test]
    fn stamp_is_invalid_opcode_and_both_parities() {
        assert_eq!(STAMP_DWORD & owner_opcode::OWNER, 0);
        assert_eq!(
            STAMP_DWORD & owner_opcode::OPCODE_MASK,
            opcode::CONFIG_CMD as u32
        );
    }

    #[test]
    fn tunnel_bits_are_dpdks() {
        // DPDK's mlx4_prm.h: L2_TUNNEL 1<<27, L2_TUNNEL_IPV4 1<<25, L2_TUNNEL_L4_CSUM 1<<26,
        // L2_TUNNEL_IPOK 1<<31; none overlaps the QPN.
        let all = cqe_vlan::L2_TUNNEL
            | cqe_vlan::L2_TUNNEL_IPV4
            | cqe_vlan::L2_TUNNEL_L4_CSUM
            | cqe_vlan::L2_TUNNEL_IPOK;
        assert_eq!(all, 0x8e00_0000);
        assert_eq!(all & cqe_vlan::QPN_MASK, 0);
    }

    #[test]
    fn status_bits_match_kernel_view() {
        // The kernel's 16-bit status bit b is DPDK's bit b + 16 (doc/prm.md 6.3).
        assert_eq!(rx_status::IPV4, (1 << 6) << 16);
        assert_eq!(rx_status::IP_HDR_CSUM_OK, (1 << 12) << 16);
    }
}
