//! What the receive side reads off a frame: the CQE status word and checksum, the headers a
//! remembered flow keeps, and the RSS hash.

use super::*;
use crate::counters::RxMac;

/// RX classification: the CQE status word (doc/prm.md 6.3) and the value for the CQE checksum
/// field.
pub(crate) fn rx_status(frame: &[u8]) -> (u32, u16) {
    rx_status_of(frame, parse(frame).as_ref())
}

/// [`rx_status`] of a frame already parsed (`lay` is `parse(frame)`).
pub(crate) fn rx_status_of(frame: &[u8], lay: Option<&Layout>) -> (u32, u16) {
    rx_status_with(frame, &headers(frame, lay.copied()))
}

/// What a received frame's headers alone decide: where they are, the status bits of its
/// types and its IPv4 header checksum, and which L4 checksum is left to verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Headers {
    pub(crate) lay: Option<Layout>,
    /// The L3 length, as the MTU counts it ([`l3_len`]).
    pub(crate) l3_len: usize,
    /// What the port counters count of the frame.
    pub(crate) mac: RxMac,
    status: u32,
    l4: Option<L4Check>,
}

/// A TCP or UDP checksum to verify, and what of it the headers fix: the span it covers and
/// the pseudo-header's sum (addresses, protocol, length), so that a frame of a remembered
/// flow sums its L4 bytes only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct L4Check {
    /// The L4 header and payload: `[off, off + len)`.
    off: usize,
    len: usize,
    /// Offset of the checksum field in the L4 header.
    field: usize,
    /// UDP over IPv4, where a zero checksum means none was computed.
    zero_means_none: bool,
    pseudo: u32,
}

/// The [`Headers`] of `frame` (`lay` is `parse(frame)`).
pub(crate) fn headers(frame: &[u8], lay: Option<Layout>) -> Headers {
    let (l3_len, mac) = (l3_len(frame), RxMac::of(frame));
    let Some(l) = lay else {
        return Headers {
            lay,
            l3_len,
            mac,
            status: 0,
            l4: None,
        };
    };
    let mut st = 0;
    match l.l3 {
        L3::V4 { ihl, options } => {
            st |= rx_status::IPV4;
            if options {
                st |= rx_status::IPV4OPT;
            }
            if l.fragment {
                st |= rx_status::IPV4F;
            }
            if fold(sum16(0, &frame[l.l3_off..l.l3_off + ihl])) == 0xffff {
                st |= rx_status::IP_HDR_CSUM_OK;
            }
        }
        L3::V6 => {
            // No header checksum to get wrong: a well-formed header is "OK", as the NIC reports.
            st |= rx_status::IPV6 | rx_status::IP_HDR_CSUM_OK;
            if l.fragment {
                st |= rx_status::IPV6F;
            }
        }
    }
    let mut l4 = None;
    if let Some((proto, off, len)) = l.l4 {
        if let Some(field) = l4_csum_field(proto, len) {
            st |= if proto == PROTO_TCP {
                rx_status::TCP
            } else {
                rx_status::UDP
            };
            l4 = Some(L4Check {
                off,
                len,
                field,
                zero_means_none: proto == PROTO_UDP && matches!(l.l3, L3::V4 { .. }),
                pseudo: pseudo_sum(frame, &l, proto, len),
            });
        }
    }
    Headers {
        lay,
        l3_len,
        mac,
        status: st,
        l4,
    }
}

/// The CQE status word and checksum field of `frame`, whose headers are `h`: the L4 checksum,
/// which covers the payload, is verified here.
#[inline(always)]
pub(crate) fn rx_status_with(frame: &[u8], h: &Headers) -> (u32, u16) {
    h.verdict_for(frame.len()).of(frame)
}

/// [`rx_status_with`] for the frames of one flow and one length, the checksum's place found
/// once for them all ([`Headers::verdict_for`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct L4Verdict {
    status: u32,
    /// The L4 span `[off, off + len)` and the checksum field's offset in the frame, all
    /// inside a frame of the length the verdict is for.
    check: Option<(usize, usize, usize)>,
    zero_means_none: bool,
    pseudo: u32,
}

impl L4Verdict {
    /// The CQE status word and checksum field of `frame`, which has the headers and the
    /// length the verdict is for.
    #[inline(always)]
    pub(crate) fn of(&self, frame: &[u8]) -> (u32, u16) {
        self.fields(self.passes(frame))
    }

    /// Whether `frame`'s L4 checksum is verified good (false where there is none to verify).
    #[inline(always)]
    pub(crate) fn passes(&self, frame: &[u8]) -> bool {
        let Some((off, len, field)) = self.check else {
            return false;
        };
        match frame.get(field..field + 2) {
            // Without a checksum there is nothing to verify: the verdict is OK either way.
            Some(&[0, 0]) if self.zero_means_none => true,
            _ => frame
                .get(off..off + len)
                .is_some_and(|data| fold(sum16(self.pseudo, data)) == 0xffff),
        }
    }

    /// The CQE status word and checksum field of a frame that [`L4Verdict::passes`] or not.
    #[inline(always)]
    pub(crate) fn fields(&self, passes: bool) -> (u32, u16) {
        if passes {
            (self.status | rx_status::TCP_UDP_CSUM_OK, 0xffff)
        } else {
            (self.status, 0)
        }
    }
}

impl Headers {
    /// What [`rx_status_with`] finds of a frame of `len` bytes with these headers, but for
    /// the L4 bytes it sums.
    pub(crate) fn verdict_for(&self, len: usize) -> L4Verdict {
        let c = self
            .l4
            .filter(|c| c.off + c.len <= len && c.field + 2 <= c.len);
        L4Verdict {
            status: self.status,
            check: c.map(|c| (c.off, c.len, c.off + c.field)),
            zero_means_none: c.is_some_and(|c| c.zero_means_none),
            pseudo: c.map_or(0, |c| c.pseudo),
        }
    }
}

/// Header bytes a [`RxMemo`] compares, at most: VLAN tags, an IPv6 header with a few
/// extension headers, and the ports.
const MEMO_KEY: usize = 96;

/// The last received frame's headers and what they decided, so that the frames of one flow
/// (the same bytes up to and including the ports, and the same length) are not parsed,
/// hashed and checked again: each such frame is compared with what is remembered instead.
/// Only TCP and UDP frames outside fragments are remembered; their L4 checksum, which covers
/// the payload, is verified for every frame all the same. What the frame's hash depends on
/// besides (the port's RSS key and fields) is the owner's to forget it on.
#[derive(Clone)]
pub(crate) struct RxMemo {
    /// Bytes of `key` in use; 0: nothing remembered.
    key_len: usize,
    len: usize,
    key: [u8; MEMO_KEY],
    heads: Headers,
    hash: u32,
}

impl Default for RxMemo {
    fn default() -> Self {
        RxMemo {
            key_len: 0,
            len: 0,
            key: [0; MEMO_KEY],
            heads: headers(&[], None),
            hash: 0,
        }
    }
}

impl std::fmt::Debug for RxMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxMemo")
            .field("key_len", &self.key_len)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl RxMemo {
    /// Find the headers of `frame` and its hash under `key` and `fields`, which
    /// [`RxMemo::heads`] and [`RxMemo::hash`] then give: remembered if the frame starts as the
    /// last one learnt did, else found in full (and remembered, if of the kind kept). They are
    /// left in place, not copied out, since the delivery reads them where they are.
    #[inline]
    pub(crate) fn find(&mut self, frame: &[u8], key: &Toeplitz, fields: RssFields) {
        if !self.recalls(frame) {
            self.learn(frame, key, fields);
        }
    }

    /// Whether `frame` starts as the last frame learnt did (and has its length).
    #[inline(always)]
    pub(crate) fn recalls(&self, frame: &[u8]) -> bool {
        let n = self.key_len;
        n != 0 && frame.len() == self.len && frame.get(..n) == Some(&self.key[..n])
    }

    /// What [`RxMemo::recalls`] compares of a frame of `len` bytes: it recalls one that
    /// starts with these bytes, and none if there are none.
    #[inline(always)]
    pub(crate) fn key_for(&self, len: usize) -> Option<&[u8]> {
        (self.key_len != 0 && self.len == len).then(|| &self.key[..self.key_len])
    }

    #[cold]
    fn learn(&mut self, frame: &[u8], key: &Toeplitz, fields: RssFields) {
        self.heads = headers(frame, parse(frame));
        self.hash = rss_hash_of(frame, self.heads.lay.as_ref(), key, fields);
        self.key_len = 0;
        if let Some(L4Check { off, .. }) = self.heads.l4 {
            let n = off + 4;
            if n <= MEMO_KEY {
                self.key[..n].copy_from_slice(&frame[..n]);
                self.key_len = n;
                self.len = frame.len();
            }
        }
    }

    /// The headers of the frame [`RxMemo::find`] was last given.
    #[inline(always)]
    pub(crate) fn heads(&self) -> &Headers {
        &self.heads
    }

    /// That frame's hash.
    #[inline(always)]
    pub(crate) fn hash(&self) -> u32 {
        self.hash
    }

    /// Remember nothing: the hash's key or fields changed.
    pub(crate) fn forget(&mut self) {
        self.key_len = 0;
    }
}

/// The RSS hash of a received frame: Toeplitz over source and destination address, then source
/// and destination port when the L4 field set of that IP version is enabled; 0 for frames no
/// enabled field set covers (non-IP, malformed, or a disabled IP version).
pub(crate) fn rss_hash(frame: &[u8], key: &Toeplitz, fields: RssFields) -> u32 {
    rss_hash_of(frame, parse(frame).as_ref(), key, fields)
}

/// [`rss_hash`] of a frame already parsed (`lay` is `parse(frame)`).
pub(crate) fn rss_hash_of(
    frame: &[u8],
    lay: Option<&Layout>,
    key: &Toeplitz,
    fields: RssFields,
) -> u32 {
    let Some(lay) = lay else {
        return 0;
    };
    let (addrs, ip, tcp, udp) = match lay.l3 {
        L3::V4 { .. } => (
            lay.l3_off + 12..lay.l3_off + 20,
            RssFields::IPV4,
            RssFields::IPV4_TCP,
            RssFields::IPV4_UDP,
        ),
        L3::V6 => (
            lay.l3_off + 8..lay.l3_off + 40,
            RssFields::IPV6,
            RssFields::IPV6_TCP,
            RssFields::IPV6_UDP,
        ),
    };
    // Fragments have no ports to hash (later fragments carry none), so they fall back to the
    // addresses, as the standard asks; a header too short to be TCP/UDP is not TCP/UDP.
    let ports = match lay.l4 {
        Some((proto, off, len)) if l4_csum_field(proto, len).is_some() => {
            let set = if proto == PROTO_TCP { tcp } else { udp };
            fields.contains(set).then_some(off)
        }
        _ => None,
    };
    if ports.is_none() && !fields.contains(ip) {
        return 0;
    }
    // The input is the addresses followed by the ports: each part is hashed where it lies in
    // the frame, at its position in the input, in fixed sizes the compiler unrolls.
    let n = addrs.len();
    let h = match lay.l3 {
        L3::V4 { .. } => key.hash_at::<8>(0, frame[addrs].try_into().expect("8 bytes")),
        L3::V6 => key.hash_at::<32>(0, frame[addrs].try_into().expect("32 bytes")),
    };
    match ports {
        Some(off) => h ^ key.hash_at::<4>(n, frame[off..off + 4].try_into().expect("4 bytes")),
        None => h,
    }
}

#[cfg(test)]
mod rss_tests {
    use super::*;
    use crate::rss::DEFAULT_RSS_KEY;

    fn ip4(s: &str) -> Vec<u8> {
        s.split('.').map(|x| x.parse::<u8>().unwrap()).collect()
    }

    fn ip6(s: &str) -> Vec<u8> {
        s.parse::<std::net::Ipv6Addr>().unwrap().octets().to_vec()
    }

    /// An Ethernet frame carrying `proto` (TCP or UDP, with a minimal header) from `src:sport`
    /// to `dst:dport`; the address length picks IPv4 or IPv6.
    fn frame(proto: u8, src: &[u8], sport: u16, dst: &[u8], dport: u16) -> Vec<u8> {
        let l4_len = if proto == PROTO_TCP { 20 } else { 8 };
        let mut l4 = vec![0u8; l4_len];
        l4[0..2].copy_from_slice(&sport.to_be_bytes());
        l4[2..4].copy_from_slice(&dport.to_be_bytes());
        if proto == PROTO_TCP {
            l4[12] = 5 << 4;
        } else {
            l4[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        }
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        if src.len() == 4 {
            f.extend(ETHERTYPE_IPV4.to_be_bytes());
            let mut h = [0u8; 20];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&((20 + l4_len) as u16).to_be_bytes());
            h[8] = 64;
            h[9] = proto;
            h[12..16].copy_from_slice(src);
            h[16..20].copy_from_slice(dst);
            f.extend(h);
        } else {
            f.extend(ETHERTYPE_IPV6.to_be_bytes());
            let mut h = [0u8; 40];
            h[0] = 0x60;
            h[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
            h[6] = proto;
            h[7] = 64;
            h[8..24].copy_from_slice(src);
            h[24..40].copy_from_slice(dst);
            f.extend(h);
        }
        f.extend(l4);
        f
    }

    /// Microsoft's "Verifying the RSS Hash Calculation" tables (default key): destination,
    /// source, hash over the addresses only, hash with TCP ports.
    const V4: [(&str, u16, &str, u16, u32, u32); 5] = [
        (
            "161.142.100.80",
            1766,
            "66.9.149.187",
            2794,
            0x323e_8fc2,
            0x51cc_c178,
        ),
        (
            "65.69.140.83",
            4739,
            "199.92.111.2",
            14230,
            0xd718_262a,
            0xc626_b0ea,
        ),
        (
            "12.22.207.184",
            38024,
            "24.19.198.95",
            12898,
            0xd2d0_a5de,
            0x5c2b_394a,
        ),
        (
            "209.142.163.6",
            2217,
            "38.27.205.30",
            48228,
            0x8298_9176,
            0xafc7_327f,
        ),
        (
            "202.188.127.2",
            1303,
            "153.39.163.191",
            44251,
            0x5d18_09c5,
            0x10e8_28a2,
        ),
    ];

    const V6: [(&str, u16, &str, u16, u32, u32); 3] = [
        (
            "3ffe:2501:200:3::1",
            1766,
            "3ffe:2501:200:1fff::7",
            2794,
            0x2cc1_8cd5,
            0x4020_7d3d,
        ),
        (
            "ff02::1",
            4739,
            "3ffe:501:8::260:97ff:fe40:efab",
            14230,
            0x0f0c_461c,
            0xdde5_1bbf,
        ),
        (
            "fe80::200:f8ff:fe21:67cf",
            38024,
            "3ffe:1900:4545:3:200:f8ff:fe21:67cf",
            44251,
            0x4b61_e985,
            0x02d1_feef,
        ),
    ];

    #[test]
    fn toeplitz_matches_the_published_ipv4_vectors() {
        let k = &Toeplitz::new(&DEFAULT_RSS_KEY);
        for (dst, dport, src, sport, ip_only, with_tcp) in V4 {
            let (d, s) = (ip4(dst), ip4(src));
            let tcp = frame(PROTO_TCP, &s, sport, &d, dport);
            assert_eq!(
                rss_hash(&tcp, k, RssFields::ALL),
                with_tcp,
                "{src} -> {dst}"
            );
            assert_eq!(
                rss_hash(&tcp, k, RssFields::IPV4),
                ip_only,
                "{src} -> {dst}"
            );
            // UDP hashes the same tuple when its field set is on, the addresses otherwise.
            let udp = frame(PROTO_UDP, &s, sport, &d, dport);
            assert_eq!(rss_hash(&udp, k, RssFields::ALL), with_tcp);
            assert_eq!(
                rss_hash(&udp, k, RssFields::IPV4 | RssFields::IPV4_TCP),
                ip_only
            );
        }
    }

    #[test]
    fn toeplitz_matches_the_published_ipv6_vectors() {
        let k = &Toeplitz::new(&DEFAULT_RSS_KEY);
        for (dst, dport, src, sport, ip_only, with_tcp) in V6 {
            let (d, s) = (ip6(dst), ip6(src));
            let tcp = frame(PROTO_TCP, &s, sport, &d, dport);
            assert_eq!(
                rss_hash(&tcp, k, RssFields::ALL),
                with_tcp,
                "{src} -> {dst}"
            );
            assert_eq!(
                rss_hash(&tcp, k, RssFields::IPV6),
                ip_only,
                "{src} -> {dst}"
            );
        }
    }

    #[test]
    fn disabled_or_non_ip_frames_hash_to_zero() {
        let k = &Toeplitz::new(&DEFAULT_RSS_KEY);
        let (d, s) = (ip4(V4[0].0), ip4(V4[0].2));
        let tcp = frame(PROTO_TCP, &s, 2794, &d, 1766);
        assert_eq!(rss_hash(&tcp, k, RssFields::IPV6 | RssFields::IPV6_TCP), 0);
        assert_eq!(rss_hash(&tcp, k, RssFields::IPV4_UDP), 0);
        assert_eq!(rss_hash(&tcp, k, RssFields::IPV4_TCP), 0x51cc_c178);
        assert_eq!(rss_hash(&tcp, k, RssFields::NONE), 0);
        let mut arp = tcp.clone();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(rss_hash(&arp, k, RssFields::ALL), 0);
        // A fragment has no ports: addresses only, even with the TCP set on.
        let mut frag = tcp.clone();
        frag[ETH_HDR + 6] = 0x20; // MF
        assert_eq!(rss_hash(&frag, k, RssFields::ALL), 0x323e_8fc2);
        // The key matters.
        let mut other = DEFAULT_RSS_KEY;
        other[0] ^= 0xff;
        assert_ne!(
            rss_hash(&tcp, &Toeplitz::new(&other), RssFields::ALL),
            0x51cc_c178
        );
    }

    /// The remembered headers against the full parse, over a stream of frames in which
    /// neighbours share headers and differ in payload, checksum, length, ports, IP ID or
    /// kind: every frame gets what the full path gives it, and most are recalled.
    #[test]
    fn remembered_headers_are_what_the_full_path_finds() {
        let k = &Toeplitz::new(&DEFAULT_RSS_KEY);
        let (a4, b4) = (ip4(V4[0].0), ip4(V4[0].2));
        let (a6, b6) = (ip6(V6[0].0), ip6(V6[0].2));
        let with_payload = |mut f: Vec<u8>, n: usize| {
            f.extend((0..n).map(|i| i as u8));
            // Lengths in the headers cover the payload.
            if f[12..14] == ETHERTYPE_IPV4.to_be_bytes() {
                let total = (f.len() - ETH_HDR) as u16;
                f[ETH_HDR + 2..ETH_HDR + 4].copy_from_slice(&total.to_be_bytes());
                f[ETH_HDR + 10..ETH_HDR + 12].fill(0);
                let c = checksum(&f[ETH_HDR..ETH_HDR + 20]);
                f[ETH_HDR + 10..ETH_HDR + 12].copy_from_slice(&c.to_be_bytes());
            } else {
                let payload = (f.len() - ETH_HDR - 40) as u16;
                f[ETH_HDR + 4..ETH_HDR + 6].copy_from_slice(&payload.to_be_bytes());
            }
            f
        };
        let mut bases = vec![
            with_payload(frame(PROTO_UDP, &b4, 1766, &a4, 2794), 30),
            with_payload(frame(PROTO_TCP, &b4, 1766, &a4, 2794), 26),
            with_payload(frame(PROTO_UDP, &b6, 1766, &a6, 2794), 30),
            with_payload(frame(PROTO_TCP, &b6, 4739, &a6, 14230), 8),
        ];
        let mut checked = bases[0].clone();
        fill_tx_checksums(&mut checked, true, true);
        bases.push(checked);
        let mut tagged = bases[1].clone();
        tagged.splice(12..12, [0x81, 0x00, 0x00, 0x64]);
        bases.push(tagged);
        let mut frag = bases[0].clone();
        frag[ETH_HDR + 6] = 0x20;
        bases.push(frag);
        let mut arp = bases[0].clone();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        bases.push(arp);
        let mut x = 0x1234_5678u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as usize
        };
        let mut memo = RxMemo::default();
        let (mut frames, mut recalled) = (0, 0);
        for fields in [RssFields::ALL, RssFields::IPV4 | RssFields::IPV6] {
            memo.forget();
            for _ in 0..400 {
                let mut f = bases[next() % bases.len()].clone();
                for _ in 0..8 {
                    // A run of the same flow, each frame altered a little.
                    let (at, last) = (next() % f.len(), f.len() - 1);
                    match next() % 7 {
                        0 | 1 => f[last - next() % 8] ^= 1 << (next() % 8),
                        2 => f[at] ^= 1 << (next() % 8),
                        3 => f.truncate(last),
                        4 => f[34..38].fill(next() as u8),
                        5 => f[ETH_HDR + 4] ^= 1,
                        _ => {}
                    }
                    let full = (headers(&f, parse(&f)), rss_hash(&f, k, fields));
                    recalled += usize::from(memo.recalls(&f));
                    let key = memo.key_for(f.len());
                    assert_eq!(key.is_some_and(|k| f.starts_with(k)), memo.recalls(&f));
                    memo.find(&f, k, fields);
                    assert_eq!((*memo.heads(), memo.hash()), full, "{f:02x?}");
                    assert_eq!(rx_status_with(&f, memo.heads()), rx_status(&f), "{f:02x?}");
                    let verdict = memo.heads().verdict_for(f.len());
                    assert_eq!(verdict.of(&f), rx_status(&f), "{f:02x?}");
                    frames += 1;
                }
            }
        }
        assert!(recalled * 10 > frames, "{recalled} of {frames} recalled");
    }

    #[test]
    fn l3_length_skips_vlan_tags() {
        let mut f = vec![0u8; 100];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        assert_eq!(l3_len(&f), 86);
        f[12..14].copy_from_slice(&0x88a8u16.to_be_bytes());
        f[16..18].copy_from_slice(&0x8100u16.to_be_bytes());
        f[20..22].copy_from_slice(&0x0800u16.to_be_bytes());
        assert_eq!(l3_len(&f), 78);
        assert_eq!(l3_len(&f[..10]), 0);
    }
}
