//! RX queues. (Foundation: the queue exists and counts; the receive path arrives with its issue.)

use std::ffi::c_void;

use dpdk_sys as sys;

use crate::port::{Port, PortError};

#[derive(Debug, Default, Clone, Copy)]
pub struct RxStats {
    pub packets: u64,
    pub bytes: u64,
    pub errors: u64,
    pub nombuf: u64,
}

pub struct RxQueue {
    pub qid: u16,
    stats: RxStats,
}

impl RxQueue {
    pub fn new(
        _port: &mut Port,
        qid: u16,
        _nb_desc: u16,
        _socket: i32,
        _mp: *mut sys::rte_mempool,
    ) -> Result<Box<RxQueue>, PortError> {
        Ok(Box::new(RxQueue {
            qid,
            stats: RxStats::default(),
        }))
    }

    pub fn stats(&self) -> RxStats {
        self.stats
    }

    pub fn reset_stats(&mut self) {
        self.stats = RxStats::default();
    }
}

pub fn offload_capa(_port: &Port) -> u64 {
    0
}

/// # Safety
/// Called by ethdev with a queue from `rx_queue_setup` and room for `n` mbuf pointers.
#[allow(unsafe_code)]
pub unsafe extern "C" fn rx_burst(_q: *mut c_void, _pkts: *mut *mut sys::rte_mbuf, _n: u16) -> u16 {
    0
}
