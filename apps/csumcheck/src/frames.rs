//! The frames csumcheck sends, as DPDK asks an application to prepare them for checksum
//! offload, and as they must look on the wire: plain Rust over byte vectors.

/// Ethernet + IPv4 (+ options) + TCP or UDP with a payload, described before it is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub tcp: bool,
    /// Whole frame without FCS.
    pub len: usize,
    /// 4 bytes of IPv4 options (IHL 6) or none (IHL 5).
    pub ip_opts: bool,
    /// Where the frame is cut into mbuf segments (ascending offsets inside the frame).
    pub cuts: &'static [usize],
    pub seq: u16,
}

pub const ETH: usize = 14;

impl Spec {
    pub fn l3_len(&self) -> usize {
        if self.ip_opts {
            24
        } else {
            20
        }
    }

    pub fn l4_hdr(&self) -> usize {
        if self.tcp {
            20
        } else {
            8
        }
    }

    pub fn min_len(tcp: bool, ip_opts: bool) -> usize {
        ETH + if ip_opts { 24 } else { 20 } + if tcp { 20 } else { 8 }
    }

    /// Offset of the L4 checksum field in the frame.
    pub fn l4_csum_at(&self) -> usize {
        ETH + self.l3_len() + if self.tcp { 16 } else { 6 }
    }

    /// The frame as the application hands it to `tx_burst` for offload: IPv4 checksum 0, L4
    /// checksum the pseudo-header sum (not complemented), as `rte_ipv4_phdr_cksum` makes it.
    pub fn for_offload(&self) -> Vec<u8> {
        let mut f = self.skeleton();
        let l3 = ETH;
        let l4 = ETH + self.l3_len();
        let phdr = fold(pseudo_header_sum(&f[l3..l4], (self.len - l4) as u16));
        let at = self.l4_csum_at();
        f[at..at + 2].copy_from_slice(&phdr.to_be_bytes());
        f
    }

    /// The frame as it must appear on the wire: both checksums complete.
    pub fn on_wire(&self) -> Vec<u8> {
        let mut f = self.skeleton();
        let l3 = ETH;
        let l4 = ETH + self.l3_len();
        let ip = !fold(sum(&f[l3..l4]));
        f[l3 + 10..l3 + 12].copy_from_slice(&ip.to_be_bytes());
        let mut l4sum =
            !fold(pseudo_header_sum(&f[l3..l4], (self.len - l4) as u16) + sum(&f[l4..]));
        if !self.tcp && l4sum == 0 {
            // UDP sends a computed 0 as all ones (RFC 768).
            l4sum = 0xffff;
        }
        let at = self.l4_csum_at();
        f[at..at + 2].copy_from_slice(&l4sum.to_be_bytes());
        f
    }

    /// Headers with both checksum fields 0, and a payload pattern.
    fn skeleton(&self) -> Vec<u8> {
        let mut f = vec![0u8; self.len];
        f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut f[ETH..ETH + self.l3_len()];
        ip[0] = 0x40 | (self.l3_len() / 4) as u8;
        ip[2..4].copy_from_slice(&((self.len - ETH) as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&self.seq.to_be_bytes());
        ip[6] = 0x40; // DF
        ip[8] = 64;
        ip[9] = if self.tcp { 6 } else { 17 };
        ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
        if self.ip_opts {
            // NOP, NOP, NOP, end of options.
            ip[20..24].copy_from_slice(&[1, 1, 1, 0]);
        }
        let l4 = ETH + self.l3_len();
        let sport = 1000 + self.seq;
        f[l4..l4 + 2].copy_from_slice(&sport.to_be_bytes());
        f[l4 + 2..l4 + 4].copy_from_slice(&9u16.to_be_bytes());
        if self.tcp {
            f[l4 + 4..l4 + 8].copy_from_slice(&(u32::from(self.seq) * 1000).to_be_bytes());
            f[l4 + 12] = 5 << 4;
            f[l4 + 13] = 0x18; // PSH, ACK
            f[l4 + 14..l4 + 16].copy_from_slice(&0xffffu16.to_be_bytes());
        } else {
            f[l4 + 4..l4 + 6].copy_from_slice(&((self.len - l4) as u16).to_be_bytes());
        }
        for (i, b) in f[l4 + self.l4_hdr()..].iter_mut().enumerate() {
            *b = (i as u32 * 13 + u32::from(self.seq) * 7) as u8;
        }
        f
    }
}

/// The one's-complement sum of 16-bit big-endian words (odd tail padded with 0), unfolded.
pub fn sum(b: &[u8]) -> u32 {
    let mut s: u32 = 0;
    let mut words = b.chunks_exact(2);
    for w in &mut words {
        s += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        s += u32::from(*last) << 8;
    }
    s
}

pub fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// Source and destination address, protocol and L4 length: the IPv4 pseudo header.
fn pseudo_header_sum(ip: &[u8], l4_len: u16) -> u32 {
    sum(&ip[12..20]) + u32::from(ip[9]) + u32::from(l4_len)
}

/// Every frame csumcheck sends: both protocols, lengths at each class boundary of the TX path
/// (one inline chunk, several, the 104 and 928 thresholds, gather), with and without IPv4
/// options, in one segment or cut into several (also inside the headers).
pub fn all() -> Vec<Spec> {
    const CUTS: [&[usize]; 4] = [&[], &[14], &[34, 60], &[5, 30, 41]];
    let mut v = Vec::new();
    let mut seq = 0u16;
    for tcp in [false, true] {
        for ip_opts in [false, true] {
            let min = Spec::min_len(tcp, ip_opts);
            for len in [min, 60, 64, 100, 104, 105, 300, 928, 929, 1514] {
                if len < min {
                    continue;
                }
                for cuts in CUTS {
                    let cuts: &'static [usize] = cuts;
                    if cuts.last().is_some_and(|&c| c >= len) {
                        continue;
                    }
                    v.push(Spec {
                        tcp,
                        len,
                        ip_opts,
                        cuts,
                        seq,
                    });
                    seq += 1;
                }
            }
        }
    }
    v
}

/// The records of a classic pcap file (microsecond or nanosecond, either byte order).
pub fn read_pcap(b: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if b.len() < 24 {
        return Err(format!("pcap of {} bytes has no global header", b.len()));
    }
    let magic = [b[0], b[1], b[2], b[3]];
    let le = match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
        _ => return Err(format!("not a pcap file (magic {magic:02x?})")),
    };
    let u32_at = |at: usize| {
        let w = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if le {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        }
    };
    let mut out = Vec::new();
    let mut at = 24;
    while at < b.len() {
        if at + 16 > b.len() {
            return Err(format!("truncated record header at byte {at}"));
        }
        let incl = u32_at(at + 8) as usize;
        let start = at + 16;
        if start + incl > b.len() {
            return Err(format!("truncated record at byte {at}"));
        }
        out.push(b[start..start + incl].to_vec());
        at = start + incl;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_of_a_known_frame() {
        // An IPv4 header whose checksum is the textbook example (0xb861).
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(!fold(sum(&h)), 0xb861);
    }

    #[test]
    fn wire_frames_verify_and_offload_frames_carry_the_pseudo_header() {
        for s in all() {
            let w = s.on_wire();
            assert_eq!(w.len(), s.len);
            let l4 = ETH + s.l3_len();
            assert_eq!(
                fold(sum(&w[ETH..l4])),
                0xffff,
                "{s:?}: IP header sums to all ones"
            );
            let total = pseudo_header_sum(&w[ETH..l4], (s.len - l4) as u16) + sum(&w[l4..]);
            assert_eq!(fold(total), 0xffff, "{s:?}: L4 sums to all ones");
            let o = s.for_offload();
            assert_eq!(
                &o[ETH + 10..ETH + 12],
                &[0, 0],
                "IP checksum left to the device"
            );
            assert_eq!(o[..ETH + 10], w[..ETH + 10]);
            assert_eq!(o[s.l4_csum_at() + 2..], w[s.l4_csum_at() + 2..]);
        }
        assert!(all().len() >= 120);
    }

    #[test]
    fn pcap_records() {
        let mut f = vec![0xd4, 0xc3, 0xb2, 0xa1];
        f.extend_from_slice(&[0; 20]);
        for len in [3u32, 0, 5] {
            f.extend_from_slice(&[0; 8]);
            f.extend_from_slice(&len.to_le_bytes());
            f.extend_from_slice(&len.to_le_bytes());
            f.extend(std::iter::repeat_n(len as u8, len as usize));
        }
        let r = read_pcap(&f).unwrap();
        assert_eq!(r, vec![vec![3; 3], vec![], vec![5; 5]]);
        assert!(read_pcap(&f[..f.len() - 1]).is_err());
        assert!(read_pcap(&[0; 24]).is_err());
    }
}
