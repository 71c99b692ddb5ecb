//! Send WQE segments: control, data (gather/scatter) and inline.

use crate::{fence_size, owner_opcode, Error, INLINE_SEG_FLAG};

#[inline]
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
fn put_be32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

mod ctrl_field {
    pub type Field = core::ops::Range<usize>;
    pub const OWNER_OPCODE: Field = 0..4;
    pub const VLAN_TAG: Field = 4..6;
    pub const INS_VLAN: usize = 6;
    pub const FENCE_SIZE: usize = 7;
    /// Overlays `VLAN_TAG`, `INS_VLAN`, `FENCE_SIZE` in BlueFlame copies.
    pub const BF_QPN: Field = 4..8;
    pub const SRCRB_FLAGS: Field = 8..12;
    pub const IMM: Field = 12..16;
    pub const LEN: usize = 16;
}

/// The 16-byte control segment that starts every send WQE (doc/prm.md 1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtrlSeg<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> CtrlSeg<T> {
    /// Size of the segment in bytes.
    pub const LEN: usize = ctrl_field::LEN;

    /// Wrap a buffer without checking its length; accessors panic if it is shorter than 16 bytes.
    pub const fn new_unchecked(buffer: T) -> Self {
        CtrlSeg { buffer }
    }

    /// Wrap a buffer of at least 16 bytes.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        if buffer.as_ref().len() < ctrl_field::LEN {
            return Err(Error::Truncated);
        }
        Ok(CtrlSeg { buffer })
    }

    /// Give the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The whole `owner_opcode` word (host order).
    pub fn owner_opcode(&self) -> u32 {
        be32(self.buffer.as_ref(), ctrl_field::OWNER_OPCODE.start)
    }

    /// The ownership bit.
    pub fn owner(&self) -> bool {
        self.owner_opcode() & owner_opcode::OWNER != 0
    }

    /// The opcode (bits 4:0).
    pub fn opcode(&self) -> u8 {
        (self.owner_opcode() & owner_opcode::OPCODE_MASK) as u8
    }

    /// The BlueFlame counter (bits 23:8); meaningful only in a BF copy.
    pub fn bf_counter(&self) -> u16 {
        ((self.owner_opcode() & owner_opcode::BF_COUNTER_MASK) >> owner_opcode::BF_COUNTER_SHIFT)
            as u16
    }

    /// VLAN TCI to insert.
    pub fn vlan_tag(&self) -> u16 {
        let b = &self.buffer.as_ref()[ctrl_field::VLAN_TAG];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// VLAN insertion request ([`crate::ins_vlan`]).
    pub fn ins_vlan(&self) -> u8 {
        self.buffer.as_ref()[ctrl_field::INS_VLAN]
    }

    /// The whole `fence_size` byte.
    pub fn fence_size(&self) -> u8 {
        self.buffer.as_ref()[ctrl_field::FENCE_SIZE]
    }

    /// WQE size in DS units (16 bytes), control segment included.
    pub fn ds(&self) -> u8 {
        self.fence_size() & fence_size::DS_MASK
    }

    /// QPN carried in bytes 4-6 of a BlueFlame copy.
    pub fn bf_qpn(&self) -> u32 {
        be32(self.buffer.as_ref(), ctrl_field::BF_QPN.start) >> 8
    }

    /// The `srcrb_flags` word (host order), flags in [`crate::srcrb`].
    pub fn srcrb_flags(&self) -> u32 {
        be32(self.buffer.as_ref(), ctrl_field::SRCRB_FLAGS.start)
    }

    /// The immediate word (host order).
    pub fn imm(&self) -> u32 {
        be32(self.buffer.as_ref(), ctrl_field::IMM.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> CtrlSeg<T> {
    /// Set the `owner_opcode` word; the driver writes it last, behind a barrier.
    pub fn set_owner_opcode(&mut self, v: u32) {
        put_be32(self.buffer.as_mut(), ctrl_field::OWNER_OPCODE.start, v)
    }

    /// Set the VLAN TCI to insert.
    pub fn set_vlan_tag(&mut self, v: u16) {
        self.buffer.as_mut()[ctrl_field::VLAN_TAG].copy_from_slice(&v.to_be_bytes())
    }

    /// Set the VLAN insertion request.
    pub fn set_ins_vlan(&mut self, v: u8) {
        self.buffer.as_mut()[ctrl_field::INS_VLAN] = v
    }

    /// Set the whole `fence_size` byte.
    pub fn set_fence_size(&mut self, v: u8) {
        self.buffer.as_mut()[ctrl_field::FENCE_SIZE] = v
    }

    /// Set bytes 4-7 as a BlueFlame copy carries them: QPN in 4-6, DS in 7.
    pub fn set_bf_qpn_ds(&mut self, qpn: u32, ds: u8) {
        put_be32(
            self.buffer.as_mut(),
            ctrl_field::BF_QPN.start,
            ((qpn & 0x00ff_ffff) << 8) | u32::from(ds & fence_size::DS_MASK),
        )
    }

    /// Set the `srcrb_flags` word.
    pub fn set_srcrb_flags(&mut self, v: u32) {
        put_be32(self.buffer.as_mut(), ctrl_field::SRCRB_FLAGS.start, v)
    }

    /// Set the immediate word.
    pub fn set_imm(&mut self, v: u32) {
        put_be32(self.buffer.as_mut(), ctrl_field::IMM.start, v)
    }
}

mod data_field {
    pub type Field = core::ops::Range<usize>;
    pub const BYTE_COUNT: Field = 0..4;
    pub const LKEY: Field = 4..8;
    pub const ADDR: Field = 8..16;
    pub const LEN: usize = 16;
}

/// A 16-byte data segment: a gather entry in a send WQE, a scatter entry in an RX WQE
/// (doc/prm.md 1.3, 6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataSeg<T: AsRef<[u8]>> {
    buffer: T,
}

/// A receive scatter entry has the data segment's layout.
pub type RxDataSeg<T> = DataSeg<T>;

impl<T: AsRef<[u8]>> DataSeg<T> {
    /// Size of the segment in bytes.
    pub const LEN: usize = data_field::LEN;
    /// `byte_count` that both rdma-core and DPDK write for a zero-length gather entry.
    pub const ZERO_LENGTH: u32 = INLINE_SEG_FLAG;

    /// Wrap a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Self {
        DataSeg { buffer }
    }

    /// Wrap a buffer of at least 16 bytes.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        if buffer.as_ref().len() < data_field::LEN {
            return Err(Error::Truncated);
        }
        Ok(DataSeg { buffer })
    }

    /// Give the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Raw `byte_count` (host order); bit 31 set means an inline segment or a zero-length entry.
    pub fn byte_count(&self) -> u32 {
        be32(self.buffer.as_ref(), data_field::BYTE_COUNT.start)
    }

    /// Bytes the entry describes: `byte_count` without bit 31. For a scatter entry this is the
    /// buffer's size.
    pub fn length(&self) -> u32 {
        self.byte_count() & !INLINE_SEG_FLAG
    }

    /// Memory key of the region `addr` lies in.
    pub fn lkey(&self) -> u32 {
        be32(self.buffer.as_ref(), data_field::LKEY.start)
    }

    /// Process virtual address of the buffer.
    pub fn addr(&self) -> u64 {
        let b = &self.buffer.as_ref()[data_field::ADDR];
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        u64::from_be_bytes(a)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> DataSeg<T> {
    /// Set `byte_count`; written last, behind a barrier, when the segment starts a TXBB.
    pub fn set_byte_count(&mut self, v: u32) {
        put_be32(self.buffer.as_mut(), data_field::BYTE_COUNT.start, v)
    }

    /// Set the memory key.
    pub fn set_lkey(&mut self, v: u32) {
        put_be32(self.buffer.as_mut(), data_field::LKEY.start, v)
    }

    /// Set the buffer address.
    pub fn set_addr(&mut self, v: u64) {
        self.buffer.as_mut()[data_field::ADDR].copy_from_slice(&v.to_be_bytes())
    }
}

/// Host-order header of an inline segment carrying `len` bytes (doc/prm.md 1.4).
pub const fn inline_header(len: usize) -> u32 {
    INLINE_SEG_FLAG | (len as u32 & !INLINE_SEG_FLAG)
}

/// The 4-byte header of an inline segment; the data follows it directly and header plus data
/// must not cross a 64-byte boundary of the WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InlineHdr(pub u32);

impl InlineHdr {
    /// Size of the header in bytes.
    pub const LEN: usize = 4;

    /// Host-order header for `len` bytes of inline data.
    pub const fn inline_header(len: usize) -> u32 {
        inline_header(len)
    }

    /// Header for `len` bytes of inline data.
    pub const fn new(len: usize) -> Self {
        InlineHdr(inline_header(len))
    }

    /// Parse from the four big-endian bytes at the start of a segment.
    pub const fn from_be_bytes(b: [u8; 4]) -> Self {
        InlineHdr(u32::from_be_bytes(b))
    }

    /// The big-endian bytes as they sit in the WQE.
    pub const fn to_be_bytes(self) -> [u8; 4] {
        self.0.to_be_bytes()
    }

    /// Whether a segment's first dword marks it inline.
    pub const fn is_inline(self) -> bool {
        self.0 & INLINE_SEG_FLAG != 0
    }

    /// Inline data length.
    pub const fn len(self) -> usize {
        (self.0 & !INLINE_SEG_FLAG) as usize
    }

    /// Whether it carries no data.
    pub const fn is_empty(self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ins_vlan, opcode, srcrb};

    // A SEND WQE's control segment as mlx4_en would post it in pass 1 with a C-VLAN insert and
    // completion requested: OWNER|SEND, TCI 0x0123, CVLAN, DS 3, CQ_UPDATE|SOLICIT|IP|L4, imm 0.
    const CTRL: [u8; 16] = [
        0x80, 0x00, 0x00, 0x0a, 0x01, 0x23, 0x40, 0x03, 0x00, 0x00, 0x00, 0x3e, 0x00, 0x00, 0x00,
        0x00,
    ];

    #[test]
    fn ctrl_deconstruct() {
        let c = CtrlSeg::new_checked(&CTRL[..]).unwrap();
        assert!(c.owner());
        assert_eq!(c.opcode(), opcode::SEND);
        assert_eq!(c.owner_opcode(), 0x8000_000a);
        assert_eq!(c.vlan_tag(), 0x0123);
        assert_eq!(c.ins_vlan(), ins_vlan::CVLAN);
        assert_eq!(c.ds(), 3);
        assert_eq!(
            c.srcrb_flags(),
            srcrb::CQ_UPDATE | srcrb::SOLICIT | srcrb::IP_CSUM | srcrb::TCP_UDP_CSUM
        );
        assert_eq!(c.imm(), 0);
    }

    #[test]
    fn ctrl_construct() {
        let mut b = [0u8; 16];
        let mut c = CtrlSeg::new_unchecked(&mut b[..]);
        c.set_vlan_tag(0x0123);
        c.set_ins_vlan(ins_vlan::CVLAN);
        c.set_fence_size(3);
        c.set_srcrb_flags(0x3e);
        c.set_imm(0);
        c.set_owner_opcode(owner_opcode::OWNER | opcode::SEND as u32);
        assert_eq!(b, CTRL);
    }

    #[test]
    fn ctrl_blueflame_copy() {
        // Counter 0x1234 in bits 23:8, QPN 0x000041 in bytes 4-6, DS 2 in byte 7.
        let mut b = [0u8; 16];
        let mut c = CtrlSeg::new_unchecked(&mut b[..]);
        c.set_owner_opcode((0x1234 << owner_opcode::BF_COUNTER_SHIFT) | opcode::NOP as u32);
        c.set_bf_qpn_ds(0x41, 2);
        assert_eq!(&b[..8], &[0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x41, 0x02]);
        let c = CtrlSeg::new_unchecked(&b[..]);
        assert_eq!(c.bf_counter(), 0x1234);
        assert_eq!(c.bf_qpn(), 0x41);
        assert_eq!(c.ds(), 2);
        assert!(!c.owner());
    }

    #[test]
    fn ctrl_truncated() {
        assert_eq!(CtrlSeg::new_checked(&[0u8; 15][..]), Err(Error::Truncated));
    }

    #[test]
    fn data_seg_layout() {
        let bytes = [
            0x00, 0x00, 0x05, 0xdc, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x7f, 0x01, 0x02, 0x03,
            0x04, 0x00,
        ];
        let d = DataSeg::new_checked(&bytes[..]).unwrap();
        assert_eq!(d.byte_count(), 1500);
        assert_eq!(d.lkey(), 0x1234);
        assert_eq!(d.addr(), 0x7f01_0203_0400);
        assert_eq!(d.length(), 1500);
        let zero = 0x8000_0000u32.to_be_bytes();
        assert_eq!(DataSeg::new_unchecked(&zero[..]).length(), 0);

        let mut b = [0u8; 16];
        let mut d = DataSeg::new_unchecked(&mut b[..]);
        d.set_lkey(0x1234);
        d.set_addr(0x7f01_0203_0400);
        d.set_byte_count(1500);
        assert_eq!(b, bytes);
        assert_eq!(DataSeg::<&[u8]>::ZERO_LENGTH.to_be_bytes(), [0x80, 0, 0, 0]);
        assert!(DataSeg::new_checked(&[0u8; 8][..]).is_err());
    }

    #[test]
    fn inline_header_bytes() {
        assert_eq!(inline_header(44).to_be_bytes(), [0x80, 0x00, 0x00, 0x2c]);
        let h = InlineHdr::from_be_bytes([0x80, 0x00, 0x00, 0x3c]);
        assert!(h.is_inline());
        assert_eq!(h.len(), 60);
        assert_eq!(InlineHdr::new(60), h);
        assert_eq!(InlineHdr::inline_header(60), h.0);
        assert!(!InlineHdr::from_be_bytes([0x00, 0x00, 0x00, 0x3c]).is_inline());
    }
}
