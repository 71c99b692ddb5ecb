//! Just enough Ethernet/IP parsing for what the HCA's offloads do: fill TX checksums, classify
//! received frames and verify their checksums for the RX CQE status word.

use mlx4_prm::rx_status;

use crate::rss::{RssFields, Toeplitz};

mod rx;
pub(crate) use rx::*;

const ETH_HDR: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// TPIDs the parser steps over to find the L3 header.
const VLAN_TPIDS: [u16; 3] = [0x8100, 0x88a8, 0x9100];

fn be16(b: &[u8], at: usize) -> u16 {
    // One range check for both bytes.
    let w: [u8; 2] = b[at..at + 2].try_into().expect("two bytes");
    u16::from_be_bytes(w)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum L3 {
    V4 { ihl: usize, options: bool },
    V6,
}

/// Where the headers of a frame are, as far as a NIC parser looks: found once per received
/// frame, then read by the RSS hash and the CQE's classification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    l3_off: usize,
    l3: L3,
    fragment: bool,
    /// L4 protocol and its span `[l4_off, l4_off + l4_len)`, when the packet is not a fragment.
    l4: Option<(u8, usize, usize)>,
}

pub(crate) fn parse(frame: &[u8]) -> Option<Layout> {
    if frame.len() < ETH_HDR {
        return None;
    }
    let mut off = 12;
    let mut ethertype = be16(frame, off);
    while VLAN_TPIDS.contains(&ethertype) {
        off += 4;
        if frame.len() < off + 2 {
            return None;
        }
        ethertype = be16(frame, off);
    }
    let l3_off = off + 2;
    match ethertype {
        ETHERTYPE_IPV4 => {
            let h = frame.get(l3_off..l3_off + 20)?;
            if h[0] >> 4 != 4 {
                return None;
            }
            let ihl = usize::from(h[0] & 0xf) * 4;
            let total = usize::from(be16(h, 2));
            if ihl < 20 || total < ihl || frame.len() < l3_off + total {
                return None;
            }
            let fragment = be16(h, 6) & 0x3fff != 0;
            let proto = h[9];
            let l4 = (!fragment).then_some((proto, l3_off + ihl, total - ihl));
            Some(Layout {
                l3_off,
                l3: L3::V4 {
                    ihl,
                    options: ihl > 20,
                },
                fragment,
                l4,
            })
        }
        ETHERTYPE_IPV6 => {
            let h = frame.get(l3_off..l3_off + 40)?;
            if h[0] >> 4 != 6 {
                return None;
            }
            let payload = usize::from(be16(h, 4));
            let end = l3_off + 40 + payload;
            if frame.len() < end {
                return None;
            }
            let mut next = h[6];
            let mut off = l3_off + 40;
            let mut fragment = false;
            loop {
                match next {
                    // Hop-by-hop, routing, destination options: 8-byte units after the first 8.
                    0 | 43 | 60 => {
                        let e = frame.get(off..off + 2)?;
                        next = e[0];
                        off += (usize::from(e[1]) + 1) * 8;
                    }
                    44 => {
                        fragment = true;
                        break;
                    }
                    _ => break,
                }
                if off > end {
                    return None;
                }
            }
            let l4 = (!fragment).then_some((next, off, end - off));
            Some(Layout {
                l3_off,
                l3: L3::V6,
                fragment,
                l4,
            })
        }
        _ => None,
    }
}

/// One's-complement sum of `data` added to `sum`, folded to at most 17 bits. It adds 32-bit
/// words: since 2^16 = 1 modulo 0xffff, a word counts as the sum of its two halves, and a
/// 64-bit accumulator cannot overflow on any frame, so the carries are folded once at the end.
fn sum16(sum: u32, data: &[u8]) -> u32 {
    let mut acc = u64::from(sum);
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        acc += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut pairs = rest.chunks_exact(2);
    for c in &mut pairs {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = pairs.remainder() {
        acc += u64::from(*last) << 8;
    }
    let acc = (acc & 0xffff_ffff) + (acc >> 32);
    let acc = (acc & 0xffff) + (acc >> 16);
    ((acc & 0xffff) + (acc >> 16)) as u32
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Internet checksum of `data` (the value to store in a zeroed checksum field).
pub(crate) fn checksum(data: &[u8]) -> u16 {
    !fold(sum16(0, data))
}

fn pseudo_sum(frame: &[u8], lay: &Layout, proto: u8, l4_len: usize) -> u32 {
    match lay.l3 {
        L3::V4 { .. } => {
            let s = sum16(0, &frame[lay.l3_off + 12..lay.l3_off + 20]);
            s + u32::from(proto) + l4_len as u32
        }
        L3::V6 => {
            let s = sum16(0, &frame[lay.l3_off + 8..lay.l3_off + 40]);
            s + u32::from(proto) + (l4_len as u32 >> 16) + (l4_len as u32 & 0xffff)
        }
    }
}

/// Offset of the checksum field within an L4 header of `len` bytes.
fn l4_csum_field(proto: u8, len: usize) -> Option<usize> {
    match proto {
        PROTO_TCP if len >= 20 => Some(16),
        PROTO_UDP if len >= 8 => Some(6),
        _ => None,
    }
}

/// TX offloads: fill the IPv4 header checksum and/or the TCP/UDP checksum of `frame` in place,
/// from scratch, whatever the fields held (the hardware does not need a pseudo-header seed).
/// Frames that are not IP, fragments and malformed headers are left as they are.
pub(crate) fn fill_tx_checksums(frame: &mut [u8], ip: bool, l4: bool) {
    let Some(lay) = parse(frame) else {
        return;
    };
    if let (true, L3::V4 { ihl, .. }) = (ip, lay.l3) {
        let h = &mut frame[lay.l3_off..lay.l3_off + ihl];
        h[10] = 0;
        h[11] = 0;
        let c = checksum(h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
    }
    if !l4 {
        return;
    }
    let Some((proto, off, len)) = lay.l4 else {
        return;
    };
    let Some(field) = l4_csum_field(proto, len) else {
        return;
    };
    frame[off + field] = 0;
    frame[off + field + 1] = 0;
    let sum = sum16(pseudo_sum(frame, &lay, proto, len), &frame[off..off + len]);
    let mut c = !fold(sum);
    if proto == PROTO_UDP && c == 0 {
        // Zero means "no checksum" for UDP; a computed zero is sent as all ones.
        c = 0xffff;
    }
    frame[off + field..off + field + 2].copy_from_slice(&c.to_be_bytes());
}

/// A VXLAN frame as a ConnectX-3 Pro parses it: where the inner Ethernet frame starts, and the
/// outer headers' verdicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Vxlan {
    pub(crate) inner: usize,
    pub(crate) outer_v4: bool,
    /// The outer IPv4 header checksum is right (IPv6 has none to get wrong).
    pub(crate) outer_ip_ok: bool,
    /// The outer UDP checksum is right, or absent (zero, as VXLAN senders usually leave it).
    pub(crate) outer_udp_ok: bool,
}

/// VXLAN header length.
const VXLAN_HDR: usize = 8;

/// The frame's VXLAN tunnel (UDP to port 4789 carrying a VXLAN header and at least an inner
/// Ethernet header), if it is one.
pub(crate) fn vxlan(frame: &[u8]) -> Option<Vxlan> {
    let lay = parse(frame)?;
    let (proto, off, len) = lay.l4?;
    if proto != PROTO_UDP
        || len < 8 + VXLAN_HDR + ETH_HDR
        || be16(frame, off + 2) != mlx4_prm::VXLAN_PORT
    {
        return None;
    }
    let (outer_v4, outer_ip_ok) = match lay.l3 {
        L3::V4 { ihl, .. } => (
            true,
            fold(sum16(0, &frame[lay.l3_off..lay.l3_off + ihl])) == 0xffff,
        ),
        L3::V6 => (false, true),
    };
    let stored = be16(frame, off + 6);
    let sum = sum16(pseudo_sum(frame, &lay, proto, len), &frame[off..off + len]);
    Some(Vxlan {
        inner: off + 8 + VXLAN_HDR,
        outer_v4,
        outer_ip_ok,
        outer_udp_ok: stored == 0 || fold(sum) == 0xffff,
    })
}

/// TX offloads of a ConnectX-3 Pro for a VXLAN frame: the inner IPv4 header checksum (`iip`)
/// and the inner TCP/UDP checksum (`ilp`), filled from scratch. Returns false (nothing done)
/// if the frame is not VXLAN.
pub(crate) fn fill_inner_checksums(frame: &mut [u8], iip: bool, ilp: bool) -> bool {
    let Some(t) = vxlan(frame) else {
        return false;
    };
    fill_tx_checksums(&mut frame[t.inner..], iip, ilp);
    true
}

/// Where the IP and TCP headers sit in an LSO header template (`hdr` = L2 + L3 + L4 headers
/// only): `(l3_off, is_ipv4, l4_off)`. `None` unless it is TCP over IPv4/IPv6 whose headers end
/// within `hdr`.
pub(crate) fn tso_template(hdr: &[u8]) -> Option<(usize, bool, usize)> {
    if hdr.len() < ETH_HDR {
        return None;
    }
    let mut off = 12;
    let mut ethertype = be16(hdr, off);
    while VLAN_TPIDS.contains(&ethertype) {
        off += 4;
        if hdr.len() < off + 2 {
            return None;
        }
        ethertype = be16(hdr, off);
    }
    let l3 = off + 2;
    let (v4, l4, proto) = match ethertype {
        ETHERTYPE_IPV4 => {
            let h = hdr.get(l3..l3 + 20)?;
            let ihl = usize::from(h[0] & 0xf) * 4;
            (true, l3 + ihl.max(20), h[9])
        }
        ETHERTYPE_IPV6 => (false, l3 + 40, *hdr.get(l3 + 6)?),
        _ => return None,
    };
    let doff = usize::from(*hdr.get(l4 + 12)? >> 4) * 4;
    (proto == PROTO_TCP && doff >= 20 && l4 + doff <= hdr.len()).then_some((l3, v4, l4))
}

/// Number of segments LSO cuts `payload` bytes into.
pub(crate) fn tso_segments(payload: usize, mss: usize) -> usize {
    payload.div_ceil(mss).max(1)
}

/// Large send: cut `frame` (header template of `hdr_len` bytes, then payload) into segments of
/// at most `mss` payload bytes, each with its own IP length and ID, TCP sequence number and
/// flags (FIN/PSH only on the last, CWR only on the first) and fresh checksums, and hand each to
/// `emit`. `hdr_len` must have passed [`tso_template`].
pub(crate) fn for_each_tso_segment(
    frame: &[u8],
    hdr_len: usize,
    mss: usize,
    buf: &mut Vec<u8>,
    mut emit: impl FnMut(&[u8]),
) {
    let Some((l3, v4, l4)) = tso_template(&frame[..hdr_len]) else {
        return;
    };
    let payload = &frame[hdr_len..];
    let n = tso_segments(payload.len(), mss);
    let seq0 = u32::from_be_bytes([frame[l4 + 4], frame[l4 + 5], frame[l4 + 6], frame[l4 + 7]]);
    let id0 = if v4 { be16(frame, l3 + 4) } else { 0 };
    for i in 0..n {
        let chunk = &payload[(i * mss).min(payload.len())..((i + 1) * mss).min(payload.len())];
        buf.clear();
        buf.extend_from_slice(&frame[..hdr_len]);
        buf.extend_from_slice(chunk);
        let total = buf.len();
        if v4 {
            buf[l3 + 2..l3 + 4].copy_from_slice(&((total - l3) as u16).to_be_bytes());
            buf[l3 + 4..l3 + 6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
        } else {
            buf[l3 + 4..l3 + 6].copy_from_slice(&((total - l3 - 40) as u16).to_be_bytes());
        }
        let seq = seq0.wrapping_add((i * mss) as u32);
        buf[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
        if i + 1 < n {
            buf[l4 + 13] &= !0x09; // FIN, PSH
        }
        if i > 0 {
            buf[l4 + 13] &= !0x80; // CWR
        }
        fill_tx_checksums(buf, true, true);
        emit(buf);
    }
}

/// The IEEE 802.3 CRC-32 (reflected polynomial 0xedb88320) as a table of every byte value.
const CRC32_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// The Ethernet FCS of `frame` (destination MAC to the end of the payload): CRC-32, initial
/// value and final XOR all ones.
pub(crate) fn crc32(frame: &[u8]) -> u32 {
    !frame.iter().fold(!0u32, |c, &b| {
        CRC32_TABLE[usize::from((c as u8) ^ b)] ^ (c >> 8)
    })
}

/// What flow rules match on, read from a received frame once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FrameFields {
    pub(crate) dst: [u8; 6],
    pub(crate) src: [u8; 6],
    /// The EtherType after any VLAN tags.
    pub(crate) ether_type: u16,
    /// The outer tag's VLAN ID.
    pub(crate) vid: Option<u16>,
    /// IPv4 source and destination.
    pub(crate) ipv4: Option<([u8; 4], [u8; 4])>,
    /// TCP (6) or UDP (17) and its ports, outside fragments.
    pub(crate) l4: Option<(u8, u16, u16)>,
}

/// The fields of `frame` flow rules look at (a runt has all zero).
pub(crate) fn frame_fields(frame: &[u8]) -> FrameFields {
    let mut f = FrameFields::default();
    if frame.len() < ETH_HDR {
        return f;
    }
    f.dst.copy_from_slice(&frame[..6]);
    f.src.copy_from_slice(&frame[6..12]);
    f.vid = outer_vlan(frame);
    let mut off = 12;
    let mut et = be16(frame, off);
    while VLAN_TPIDS.contains(&et) && frame.len() >= off + 6 {
        off += 4;
        et = be16(frame, off);
    }
    f.ether_type = et;
    if let Some(lay) = parse(frame) {
        if let L3::V4 { .. } = lay.l3 {
            let a = lay.l3_off + 12;
            let mut src = [0; 4];
            let mut dst = [0; 4];
            src.copy_from_slice(&frame[a..a + 4]);
            dst.copy_from_slice(&frame[a + 4..a + 8]);
            f.ipv4 = Some((src, dst));
        }
        if let Some((proto, l4, len)) = lay.l4 {
            if l4_csum_field(proto, len).is_some() {
                f.l4 = Some((proto, be16(frame, l4), be16(frame, l4 + 2)));
            }
        }
    }
    f
}

/// The VLAN ID of the outer tag (802.1Q, 802.1ad or the old 0x9100), if the frame has one.
pub(crate) fn outer_vlan(frame: &[u8]) -> Option<u16> {
    if frame.len() < 16 || !VLAN_TPIDS.contains(&be16(frame, 12)) {
        return None;
    }
    Some(be16(frame, 14) & 0x0fff)
}

/// The frame's L3 length as the MTU counts it: everything after the MAC header and its VLAN
/// tags (the frames here carry no FCS).
pub(crate) fn l3_len(frame: &[u8]) -> usize {
    let mut hdr = ETH_HDR;
    let mut off = 12;
    while frame.len() >= off + 2 && VLAN_TPIDS.contains(&be16(frame, off)) {
        hdr += 4;
        off += 4;
    }
    frame.len().saturating_sub(hdr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The classic worked example of an IPv4 header checksum: 0xb861.
    const IP_HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];

    #[test]
    fn ipv4_header_checksum_known_value() {
        let mut h = IP_HDR;
        h[10] = 0;
        h[11] = 0;
        assert_eq!(checksum(&h), 0xb861);
        assert_eq!(fold(sum16(0, &IP_HDR)), 0xffff);
    }

    /// The definition: 16-bit big-endian words, an odd last byte padded with zero.
    fn sum16_by_halfwords(data: &[u8]) -> u32 {
        let mut sum = 0u32;
        for c in data.chunks(2) {
            sum += u32::from(c[0]) << 8 | u32::from(c.get(1).copied().unwrap_or(0));
        }
        sum
    }

    #[test]
    fn word_sum_folds_to_the_halfword_sum() {
        let mut x = 0x9e37_79b9u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for len in 0..200 {
            for fill in [None, Some(0x00), Some(0xff)] {
                let data: Vec<u8> = (0..len)
                    .map(|_| fill.unwrap_or_else(|| next() as u8))
                    .collect();
                let seed = next() & 0x3_ffff;
                assert_eq!(
                    fold(sum16(seed, &data)),
                    fold(seed + sum16_by_halfwords(&data)),
                    "{len} bytes {fill:?}"
                );
                assert_eq!(fold(sum16(0, &data)), fold(sum16_by_halfwords(&data)));
            }
        }
    }

    #[test]
    fn crc32_check_value_and_fcs_residue() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        // A frame followed by its FCS (least significant byte first) leaves the fixed residue.
        let frame: Vec<u8> = (0..60u8).collect();
        let mut with = frame.clone();
        with.extend(crc32(&frame).to_le_bytes());
        assert_eq!(!crc32(&with), 0xdebb_20e3);
    }

    #[test]
    fn non_ip_is_left_alone() {
        let mut f = [0u8; 60];
        f[12] = 0x08;
        f[13] = 0x06; // ARP
        let copy = f;
        fill_tx_checksums(&mut f, true, true);
        assert_eq!(f, copy);
        assert_eq!(rx_status(&f), (0, 0));
        assert_eq!(rx_status(&f[..5]), (0, 0));
    }
}
