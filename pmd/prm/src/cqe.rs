//! The 32-byte completion queue entry (doc/prm.md 5.2), normal and error views over the same bytes.

use crate::{cqe_owner, cqe_vlan, Error};

mod field {
    pub type Field = core::ops::Range<usize>;
    pub const VLAN_MY_QPN: Field = 0..4;
    pub const IMMED_RSS_INVALID: Field = 4..8;
    pub const G_MLPATH_RQPN: Field = 8..12;
    pub const SL_VID: Field = 12..14;
    pub const RLID: Field = 14..16;
    pub const STATUS: Field = 16..20;
    pub const BYTE_CNT: Field = 20..24;
    pub const WQE_INDEX: Field = 24..26;
    /// In an error CQE these two bytes are `vendor_err`, `syndrome`.
    pub const CHECKSUM: Field = 26..28;
    pub const VENDOR_ERR: usize = 26;
    pub const SYNDROME: usize = 27;
    pub const OWNER_SR_OPCODE: usize = 31;
    pub const LEN: usize = 32;
}

#[inline]
fn get32(b: &[u8], f: field::Field) -> u32 {
    let s = &b[f];
    u32::from_be_bytes([s[0], s[1], s[2], s[3]])
}

#[inline]
fn get16(b: &[u8], f: field::Field) -> u16 {
    let s = &b[f];
    u16::from_be_bytes([s[0], s[1]])
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Cqe<T> {
    /// Size of the entry in bytes.
    pub const LEN: usize = field::LEN;
    /// Offset of the `owner_sr_opcode` byte, which the device writes last.
    pub const OWNER_OFFSET: usize = field::OWNER_SR_OPCODE;

    /// Wrap a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        Cqe { buffer }
    }

    /// Wrap a buffer of at least 32 bytes.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        if buffer.as_ref().len() < field::LEN {
            return Err(Error::Truncated);
        }
        Ok(Cqe { buffer })
    }

    /// Give the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The whole `vlan_my_qpn` word (QPN plus VLAN/tunnel flags).
    pub fn vlan_my_qpn(&self) -> u32 {
        get32(self.buffer.as_ref(), field::VLAN_MY_QPN)
    }

    /// QPN of the queue that completed (bits 23:0).
    pub fn qpn(&self) -> u32 {
        self.vlan_my_qpn() & cqe_vlan::QPN_MASK
    }

    /// RX: RSS hash (host order; DPDK copies the raw bytes, see doc/prm.md 6.3).
    pub fn immed_rss_invalid(&self) -> u32 {
        get32(self.buffer.as_ref(), field::IMMED_RSS_INVALID)
    }

    /// InfiniBand only.
    pub fn g_mlpath_rqpn(&self) -> u32 {
        get32(self.buffer.as_ref(), field::G_MLPATH_RQPN)
    }

    /// RX: stripped VLAN TCI.
    pub fn sl_vid(&self) -> u16 {
        get16(self.buffer.as_ref(), field::SL_VID)
    }

    /// InfiniBand only.
    pub fn rlid(&self) -> u16 {
        get16(self.buffer.as_ref(), field::RLID)
    }

    /// RX: status word, bits in [`crate::rx_status`].
    pub fn status(&self) -> u32 {
        get32(self.buffer.as_ref(), field::STATUS)
    }

    /// RX: received length.
    pub fn byte_cnt(&self) -> u32 {
        get32(self.buffer.as_ref(), field::BYTE_CNT)
    }

    /// RX: the status word and the received length, `(status, byte_cnt)`, in one 8-byte load
    /// (the two fields are adjacent).
    #[inline]
    pub fn status_byte_cnt(&self) -> (u32, u32) {
        let s = &self.buffer.as_ref()[field::STATUS.start..field::BYTE_CNT.end];
        let both = u64::from_be_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
        ((both >> 32) as u32, both as u32)
    }

    /// TX: 16-bit counter of the completed WQE's first TXBB; RX: RQ index.
    pub fn wqe_index(&self) -> u16 {
        get16(self.buffer.as_ref(), field::WQE_INDEX)
    }

    /// RX: L4 checksum.
    pub fn checksum(&self) -> u16 {
        get16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// Error CQE: vendor error code.
    pub fn vendor_err(&self) -> u8 {
        self.buffer.as_ref()[field::VENDOR_ERR]
    }

    /// Error CQE: syndrome ([`crate::syndrome`]).
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }

    /// The `owner_sr_opcode` byte.
    pub fn owner_sr_opcode(&self) -> u8 {
        self.buffer.as_ref()[field::OWNER_SR_OPCODE]
    }

    /// The ownership bit.
    pub fn owner(&self) -> bool {
        self.owner_sr_opcode() & cqe_owner::OWNER != 0
    }

    /// Whether this completes a send (TX) WQE.
    pub fn is_send(&self) -> bool {
        self.owner_sr_opcode() & cqe_owner::SEND != 0
    }

    /// The opcode ([`crate::cqe_opcode`] or the completed WQE's opcode).
    pub fn opcode(&self) -> u8 {
        self.owner_sr_opcode() & cqe_owner::OPCODE_MASK
    }

    /// Whether software owns this entry when its consumer count is `n` in a CQ of `cqe_cnt`.
    pub fn sw_owned(&self, n: u32, cqe_cnt: u32) -> bool {
        self.owner() == (n & cqe_cnt != 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Cqe<T> {
    #[inline]
    fn put32(&mut self, f: field::Field, v: u32) {
        self.buffer.as_mut()[f].copy_from_slice(&v.to_be_bytes())
    }

    #[inline]
    fn put16(&mut self, f: field::Field, v: u16) {
        self.buffer.as_mut()[f].copy_from_slice(&v.to_be_bytes())
    }

    /// Set the `vlan_my_qpn` word.
    pub fn set_vlan_my_qpn(&mut self, v: u32) {
        self.put32(field::VLAN_MY_QPN, v)
    }

    /// Set the QPN, keeping the flag bits above it.
    pub fn set_qpn(&mut self, qpn: u32) {
        let v = (self.vlan_my_qpn() & !cqe_vlan::QPN_MASK) | (qpn & cqe_vlan::QPN_MASK);
        self.set_vlan_my_qpn(v)
    }

    /// Set the RSS hash word.
    pub fn set_immed_rss_invalid(&mut self, v: u32) {
        self.put32(field::IMMED_RSS_INVALID, v)
    }

    /// Set the InfiniBand path word.
    pub fn set_g_mlpath_rqpn(&mut self, v: u32) {
        self.put32(field::G_MLPATH_RQPN, v)
    }

    /// Set the stripped VLAN TCI.
    pub fn set_sl_vid(&mut self, v: u16) {
        self.put16(field::SL_VID, v)
    }

    /// Set the InfiniBand rlid.
    pub fn set_rlid(&mut self, v: u16) {
        self.put16(field::RLID, v)
    }

    /// Set the RX status word.
    pub fn set_status(&mut self, v: u32) {
        self.put32(field::STATUS, v)
    }

    /// Set the byte count.
    pub fn set_byte_cnt(&mut self, v: u32) {
        self.put32(field::BYTE_CNT, v)
    }

    /// Set the WQE index.
    pub fn set_wqe_index(&mut self, v: u16) {
        self.put16(field::WQE_INDEX, v)
    }

    /// Set the L4 checksum.
    pub fn set_checksum(&mut self, v: u16) {
        self.put16(field::CHECKSUM, v)
    }

    /// Set the vendor error code (error CQEs).
    pub fn set_vendor_err(&mut self, v: u8) {
        self.buffer.as_mut()[field::VENDOR_ERR] = v
    }

    /// Set the syndrome (error CQEs).
    pub fn set_syndrome(&mut self, v: u8) {
        self.buffer.as_mut()[field::SYNDROME] = v
    }

    /// Set the `owner_sr_opcode` byte; the device writes it last.
    pub fn set_owner_sr_opcode(&mut self, v: u8) {
        self.buffer.as_mut()[field::OWNER_SR_OPCODE] = v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{cqe_opcode, opcode, rx_status, syndrome};

    // TX completion in pass 1 for QPN 0x41, WQE at TXBB counter 0x0102, opcode SEND.
    const TX_CQE: [u8; 32] = [
        0x00, 0x00, 0x00, 0x41, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01,
        0x02, 0, 0, 0, 0, 0, 0xca,
    ];

    #[test]
    fn status_and_byte_count_in_one_load() {
        let mut b = [0u8; 32];
        b[16..24].copy_from_slice(&[0x12, 0x34, 0x56, 0x78, 0x00, 0x00, 0x05, 0xee]);
        let c = Cqe::new_checked(&b[..]).unwrap();
        assert_eq!(c.status_byte_cnt(), (0x1234_5678, 0x5ee));
        assert_eq!(c.status_byte_cnt(), (c.status(), c.byte_cnt()));
    }

    #[test]
    fn tx_cqe() {
        let c = Cqe::new_checked(&TX_CQE[..]).unwrap();
        assert_eq!(c.qpn(), 0x41);
        assert_eq!(c.wqe_index(), 0x0102);
        assert!(c.owner());
        assert!(c.is_send());
        assert_eq!(c.opcode(), opcode::SEND);
        assert!(c.sw_owned(8, 8));
        assert!(!c.sw_owned(0, 8));

        let mut b = [0u8; 32];
        let mut w = Cqe::new_unchecked(&mut b[..]);
        w.set_qpn(0x41);
        w.set_wqe_index(0x0102);
        w.set_owner_sr_opcode(cqe_owner::OWNER | cqe_owner::SEND | opcode::SEND);
        assert_eq!(b, TX_CQE);
    }

    #[test]
    fn error_cqe() {
        let mut b = [0u8; 32];
        b[0..4].copy_from_slice(&[0, 0, 0x40, 0x44]);
        b[24..26].copy_from_slice(&[0x00, 0x07]);
        b[26] = 0x57;
        b[27] = syndrome::LOCAL_PROT;
        b[31] = cqe_owner::SEND | cqe_opcode::ERROR;
        let c = Cqe::new_unchecked(&b[..]);
        assert_eq!(c.qpn(), 0x4044);
        assert_eq!(c.wqe_index(), 7);
        assert_eq!(c.vendor_err(), 0x57);
        assert_eq!(c.syndrome(), syndrome::LOCAL_PROT);
        assert_eq!(c.opcode(), cqe_opcode::ERROR);
        assert!(!c.owner());
        // The error view overlays the checksum field.
        assert_eq!(c.checksum(), 0x5704);
    }

    #[test]
    fn rx_cqe() {
        let mut b = [0u8; 32];
        let mut w = Cqe::new_unchecked(&mut b[..]);
        w.set_vlan_my_qpn(0x0000_0042);
        w.set_immed_rss_invalid(0xdead_beef);
        w.set_sl_vid(0x0064);
        w.set_status(rx_status::IPV4 | rx_status::UDP | rx_status::IP_HDR_CSUM_OK);
        w.set_byte_cnt(60);
        w.set_wqe_index(3);
        w.set_checksum(0xffff);
        w.set_owner_sr_opcode(cqe_opcode::RX_SEND);
        assert_eq!(
            b,
            [
                0x00, 0x00, 0x00, 0x42, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0x00, 0x64, 0, 0, 0x18,
                0x40, 0x00, 0x00, 0, 0, 0, 60, 0, 3, 0xff, 0xff, 0, 0, 0, 0x01
            ]
        );
        let c = Cqe::new_unchecked(&b[..]);
        assert!(!c.is_send());
        assert_eq!(c.byte_cnt(), 60);
        assert_eq!(
            c.status() & rx_status::PTYPE_MASK,
            rx_status::IPV4 | rx_status::UDP
        );
        assert!(Cqe::new_checked(&b[..31]).is_err());
    }
}
