//! `struct rte_mbuf`, written out once for every supported release.
//!
//! Its binary layout is the same from 22.11 to 25.11 (doc/dpdk-releases.md), but from 24.11 the
//! headers wrap groups of its fields in anonymous unions, so bindgen's names for them change
//! between releases (`data_off` becomes `__bindgen_anon_1.__bindgen_anon_1.data_off`). The
//! driver reads and writes mbufs by field name on the data path; one flat definition keeps
//! that code the same everywhere. `mbuf_fields_sit_where_the_installed_headers_put_them`
//! holds every field against `offsetof` in the installed headers (glue.c).

use std::ffi::c_void;

use super::{rte_mbuf_ext_shared_info, rte_mempool};

/// The packet mbuf: two cache lines.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct rte_mbuf {
    pub buf_addr: *mut c_void,
    pub buf_iova: u64,
    pub data_off: u16,
    pub refcnt: u16,
    pub nb_segs: u16,
    pub port: u16,
    pub ol_flags: u64,
    /// `RTE_PTYPE_*` (a union with its L2/L3/L4/tunnel/inner bit fields in C).
    pub packet_type: u32,
    pub pkt_len: u32,
    pub data_len: u16,
    pub vlan_tci: u16,
    pub hash: rte_mbuf_hash,
    pub vlan_tci_outer: u16,
    pub buf_len: u16,
    pub pool: *mut rte_mempool,
    pub next: *mut rte_mbuf,
    /// `l2_len:7 l3_len:9 l4_len:8 tso_segsz:16 outer_l3_len:9 outer_l2_len:7`, low bits first
    /// (a union with those bit fields in C).
    pub tx_offload: u64,
    pub shinfo: *mut rte_mbuf_ext_shared_info,
    pub priv_size: u16,
    pub timesync: u16,
    pub dynfield1: [u32; 9],
}

/// The hash a NIC reports (RSS, flow director, scheduler or a user value).
#[repr(C)]
#[derive(Clone, Copy)]
pub union rte_mbuf_hash {
    pub rss: u32,
    pub words: [u32; 2],
}

impl std::fmt::Debug for rte_mbuf_hash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: every bit pattern is a valid [u32; 2].
        write!(f, "{:?}", unsafe { self.words })
    }
}

const _: () = assert!(std::mem::size_of::<rte_mbuf>() == 128);

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::rte_mbuf;

    #[test]
    fn mbuf_fields_sit_where_the_installed_headers_put_them() {
        // SAFETY: glue.c's table and its length.
        let header = unsafe {
            crate::named_values(
                crate::mlx4rs_mbuf_offsets.as_ptr(),
                crate::mlx4rs_mbuf_offsets_n,
            )
        };
        let ours = [
            ("buf_addr", offset_of!(rte_mbuf, buf_addr)),
            ("buf_iova", offset_of!(rte_mbuf, buf_iova)),
            ("data_off", offset_of!(rte_mbuf, data_off)),
            ("refcnt", offset_of!(rte_mbuf, refcnt)),
            ("nb_segs", offset_of!(rte_mbuf, nb_segs)),
            ("port", offset_of!(rte_mbuf, port)),
            ("ol_flags", offset_of!(rte_mbuf, ol_flags)),
            ("packet_type", offset_of!(rte_mbuf, packet_type)),
            ("pkt_len", offset_of!(rte_mbuf, pkt_len)),
            ("data_len", offset_of!(rte_mbuf, data_len)),
            ("vlan_tci", offset_of!(rte_mbuf, vlan_tci)),
            ("hash", offset_of!(rte_mbuf, hash)),
            ("vlan_tci_outer", offset_of!(rte_mbuf, vlan_tci_outer)),
            ("buf_len", offset_of!(rte_mbuf, buf_len)),
            ("pool", offset_of!(rte_mbuf, pool)),
            ("next", offset_of!(rte_mbuf, next)),
            ("tx_offload", offset_of!(rte_mbuf, tx_offload)),
            ("shinfo", offset_of!(rte_mbuf, shinfo)),
            ("priv_size", offset_of!(rte_mbuf, priv_size)),
            ("timesync", offset_of!(rte_mbuf, timesync)),
            ("dynfield1", offset_of!(rte_mbuf, dynfield1)),
            ("sizeof", std::mem::size_of::<rte_mbuf>()),
        ];
        assert_eq!(ours.len(), header.len(), "glue.c lists every field");
        for (name, off) in ours {
            assert_eq!(header.get(name), Some(&(off as u64)), "rte_mbuf.{name}");
        }
    }
}
