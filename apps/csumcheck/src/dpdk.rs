//! csumcheck's calls into DPDK beyond what the shared app library offers: a port configured
//! with checksum offloads, mbuf chains with offload flags, and `tx_burst` through ethdev's
//! function table.

use std::ptr;

use apps::eal::Pool;
use dpdk_sys::{self as sys, bits};

use crate::frames::Spec;

extern "C" {
    // As in the shared app library: ethdev's exported per-port burst table.
    static mut rte_eth_fp_ops: [sys::rte_eth_fp_ops; 0];
}

/// IPv4, TCP and UDP checksum offloads plus multi-segment packets.
const TX_OFFLOADS: u64 = bits::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM
    | bits::RTE_ETH_TX_OFFLOAD_UDP_CKSUM
    | bits::RTE_ETH_TX_OFFLOAD_TCP_CKSUM
    | bits::RTE_ETH_TX_OFFLOAD_MULTI_SEGS;

pub fn configure(port: u16, pool: Pool, nb_desc: u16) -> Result<(), String> {
    // SAFETY: a zeroed rte_eth_conf is "all defaults" plus the offloads set here; the pointers
    // passed are valid for the calls.
    unsafe {
        let mut conf: sys::rte_eth_conf = std::mem::zeroed();
        conf.txmode.offloads = TX_OFFLOADS;
        let rc = sys::rte_eth_dev_configure(port, 1, 1, &conf);
        if rc != 0 {
            return Err(format!(
                "port {port}: configure with checksum offloads failed ({rc})"
            ));
        }
        let socket = sys::rte_socket_id();
        let rc = sys::rte_eth_rx_queue_setup(port, 0, nb_desc, socket, ptr::null(), pool.raw());
        if rc != 0 {
            return Err(format!("port {port}: RX queue setup failed ({rc})"));
        }
        let rc = sys::rte_eth_tx_queue_setup(port, 0, nb_desc, socket, ptr::null());
        if rc != 0 {
            return Err(format!("port {port}: TX queue setup failed ({rc})"));
        }
    }
    Ok(())
}

/// `frame` (prepared for offload) as an mbuf chain cut at `spec.cuts`, with the flags and
/// header lengths DPDK's checksum offload asks for.
pub fn chain(pool: Pool, spec: &Spec, frame: &[u8]) -> Result<*mut sys::rte_mbuf, String> {
    let mut bounds = vec![0];
    bounds.extend_from_slice(spec.cuts);
    bounds.push(frame.len());
    let mut head: *mut sys::rte_mbuf = ptr::null_mut();
    let mut tail: *mut sys::rte_mbuf = ptr::null_mut();
    for w in bounds.windows(2) {
        let piece = &frame[w[0]..w[1]];
        // SAFETY: a fresh mbuf from a valid pool (or NULL, checked); its data room (2 KiB) holds
        // any piece of a 1514-byte frame; the chain is built from mbufs we own.
        unsafe {
            let m = sys::mlx4rs_pktmbuf_alloc(pool.raw());
            if m.is_null() {
                if !head.is_null() {
                    sys::rte_pktmbuf_free_bulk(&mut head, 1);
                }
                return Err("mbuf pool exhausted".into());
            }
            let dst = ((*m).buf_addr as *mut u8).add(usize::from((*m).data_off));
            ptr::copy_nonoverlapping(piece.as_ptr(), dst, piece.len());
            (*m).data_len = piece.len() as u16;
            if head.is_null() {
                head = m;
            } else {
                (*tail).next = m;
            }
            tail = m;
        }
    }
    let l4 = if spec.tcp {
        bits::RTE_MBUF_F_TX_TCP_CKSUM
    } else {
        bits::RTE_MBUF_F_TX_UDP_CKSUM
    };
    // SAFETY: `head` is the chain's first mbuf, which we own.
    unsafe {
        (*head).nb_segs = (spec.cuts.len() + 1) as u16;
        (*head).pkt_len = frame.len() as u32;
        (*head).ol_flags = bits::RTE_MBUF_F_TX_IPV4 | bits::RTE_MBUF_F_TX_IP_CKSUM | l4;
        // tx_offload: l2_len (7 bits), l3_len (9 bits), l4_len (8 bits).
        (*head).tx_offload =
            crate::frames::ETH as u64 | (spec.l3_len() as u64) << 7 | (spec.l4_hdr() as u64) << 16;
    }
    Ok(head)
}

/// Offers `pkts` to queue 0 of `port` until every one is taken (or `deadline` passes); the
/// driver owns what it took.
pub fn send_all(
    port: u16,
    mut pkts: &mut [*mut sys::rte_mbuf],
    deadline: std::time::Instant,
) -> Result<(), String> {
    if u32::from(port) >= sys::RTE_MAX_ETHPORTS {
        return Err(format!("port {port} out of range"));
    }
    // SAFETY: `port` < RTE_MAX_ETHPORTS; the entry was filled when the port started, and this
    // thread is the only one using the queue.
    let (tx, txq) = unsafe {
        let ops =
            &*(ptr::addr_of!(rte_eth_fp_ops) as *const sys::rte_eth_fp_ops).add(usize::from(port));
        (ops.tx_pkt_burst, *ops.txq.data)
    };
    let tx = tx.ok_or("no tx_burst")?;
    while !pkts.is_empty() {
        let n = pkts.len().min(32);
        // SAFETY: queue and function from the port's table; the first `n` pointers are chains
        // we own, and ownership of the first `k` passes to the driver.
        let k = unsafe { tx(txq, pkts.as_mut_ptr(), n as u16) } as usize;
        pkts = &mut pkts[k..];
        if std::time::Instant::now() > deadline {
            // SAFETY: the remaining chains are still ours.
            unsafe { sys::rte_pktmbuf_free_bulk(pkts.as_mut_ptr(), pkts.len() as u32) };
            return Err(format!(
                "{} packets not taken before the deadline",
                pkts.len()
            ));
        }
    }
    Ok(())
}

/// `opackets` of a port.
pub fn opackets(port: u16) -> u64 {
    // SAFETY: a valid out-pointer for a plain getter.
    unsafe {
        let mut st: sys::rte_eth_stats = std::mem::zeroed();
        sys::rte_eth_stats_get(port, &mut st);
        st.opackets
    }
}

pub fn close(port: u16) {
    // SAFETY: control-path calls on a port we configured; errors are irrelevant here.
    unsafe {
        sys::rte_eth_dev_stop(port);
        sys::rte_eth_dev_close(port);
    }
}
