//! Receive steering on a card: the indirection table over the port's WQs, the Toeplitz hash
//! QP on it and the flow rules that feed it, built while started and rebuilt when a setting
//! changes.
#![allow(unsafe_code)]

use super::*;

impl Verbs {
    /// Takes steering down: flows, hash QP, indirection table, in that order.
    pub(super) fn teardown(&self, s: &mut Steer) {
        if let Some(b) = s.built.take() {
            self.destroy_hash(b.hash);
        }
    }

    /// Destroys a hash QP's flows, the QP and its table.
    pub(super) fn destroy_hash(&self, h: QpFlows) {
        for f in h.flows {
            // SAFETY: a flow of ours, destroyed once.
            if let Err(e) = unsafe { rdma::destroy_flow(f) } {
                pmd_log!(ERR, "{}: destroying a flow: {}", self.name, strerror(e));
            }
        }
        self.destroy_qp(h.qp);
        if !h.table.is_null() {
            // SAFETY: our table, with its only QP gone.
            if let Err(e) = unsafe { rdma::destroy_rwq_ind_table(h.table) } {
                pmd_log!(
                    ERR,
                    "{}: destroying the indirection table: {}",
                    self.name,
                    strerror(e)
                );
            }
        }
        if !h.cq.is_null() {
            // SAFETY: the drop QP's own CQ, its QP gone, destroyed once.
            unsafe { self.rdma.ibv.ibv_destroy_cq(h.cq) };
        }
    }

    /// A QP without receive queue (what flows on it match is dropped, as DPDK's C mlx4
    /// drops), with a CQ of its own, ready (RTR).
    pub(super) fn drop_qp(&self) -> Result<QpFlows, HwError> {
        // SAFETY: a live context; no channel, no completion vector.
        let cq = unsafe {
            self.rdma
                .ibv
                .ibv_create_cq(self.ctx, 1, ptr::null_mut(), ptr::null_mut(), 0)
        };
        if cq.is_null() {
            return Err(dev_err(format!("{}: the drop QP's CQ", self.name), errno()));
        }
        let mut a = sys::ibv_qp_init_attr {
            send_cq: cq,
            recv_cq: cq,
            cap: sys::ibv_qp_cap {
                max_send_wr: 1,
                max_send_sge: 1,
                ..Default::default()
            },
            qp_type: sys::IBV_QPT_RAW_PACKET,
            ..Default::default()
        };
        // SAFETY: a live PD and a filled attribute.
        let qp = unsafe { self.rdma.ibv.ibv_create_qp(self.pd, &mut a) };
        let h = QpFlows {
            table: ptr::null_mut(),
            qp,
            cq,
            flows: Vec::new(),
        };
        if qp.is_null() {
            let e = errno();
            // SAFETY: the CQ just created, with no QP, destroyed once.
            unsafe { self.rdma.ibv.ibv_destroy_cq(cq) };
            return Err(dev_err(format!("{}: the drop QP", self.name), e));
        }
        self.to_rtr(h, "the drop QP")
    }

    /// Moves `h`'s QP to RTR (it receives), or destroys it all.
    fn to_rtr(&self, h: QpFlows, what: &str) -> Result<QpFlows, HwError> {
        let moved = self
            .modify_qp(h.qp, sys::IBV_QPS_INIT)
            .and_then(|()| self.modify_qp(h.qp, sys::IBV_QPS_RTR));
        match moved {
            Ok(()) => Ok(h),
            Err(e) => {
                self.destroy_hash(h);
                Err(dev_err(format!("{}: {what} to RTR", self.name), e))
            }
        }
    }

    /// Puts steering in place for the current settings, replacing what was there.
    pub(super) fn rebuild(&self, st: &mut State) -> Result<(), HwError> {
        self.teardown(&mut st.steer);
        let s = &st.steer;
        if !s.started || s.reta.is_empty() {
            return Ok(());
        }
        let wqns = steer::ind_table(&s.reta).map_err(HwError::Invalid)?;
        let mut hash = self.hash_qp(st, &wqns, s.key, s.hash)?;
        let rules = if s.isolated {
            Vec::new()
        } else {
            let more: Vec<[u8; 6]> = s.unicast.iter().chain(&s.multicast).copied().collect();
            steer::flow_rules(self.port, s.mac, &more, s.promisc, s.allmulti)
        };
        let mut result = Ok(());
        for mut rule in rules {
            // SAFETY: a live QP; the rule's header is followed by its spec.
            match unsafe { rdma::create_flow(hash.qp, &mut rule.attr) } {
                Ok(f) => hash.flows.push(f),
                Err(e) => {
                    result = Err(dev_err(format!("{}: flow rule", self.name), e));
                    break;
                }
            }
        }
        st.steer.built = Some(Built { hash, wqns });
        if result.is_err() {
            self.teardown(&mut st.steer);
        }
        result
    }

    /// A Toeplitz hash QP (`key`, `hash`'s fields) over the WQs `wqns` (a power-of-two run
    /// of consecutive WQNs), ready to receive (RTR), with no flow yet.
    pub(super) fn hash_qp(
        &self,
        st: &State,
        wqns: &[u32],
        key: [u8; RSS_KEY_LEN],
        hash: RssHash,
    ) -> Result<QpFlows, HwError> {
        let mut wqs = Vec::with_capacity(wqns.len());
        for q in wqns {
            let wq = st.wqs.get(q).copied().ok_or_else(|| {
                HwError::Invalid(format!(
                    "RSS names WQ {q:#x}, which is not one of this port's"
                ))
            })?;
            wqs.push(wq);
        }
        let mut ta = sys::ibv_rwq_ind_table_init_attr {
            log_ind_tbl_size: wqns.len().trailing_zeros(),
            ind_tbl: wqs.as_mut_ptr(),
            comp_mask: 0,
        };
        // SAFETY: a live context; the WQ array outlives the call.
        let table = unsafe { rdma::create_rwq_ind_table(self.ctx, &mut ta) }.map_err(|e| {
            dev_err(
                format!("{}: indirection table over WQs {wqns:#x?}", self.name),
                e,
            )
        })?;
        let mut key = key;
        let mut qa = sys::ibv_qp_init_attr_ex {
            qp_type: sys::IBV_QPT_RAW_PACKET,
            comp_mask: sys::IBV_QP_INIT_ATTR_PD
                | sys::IBV_QP_INIT_ATTR_IND_TABLE
                | sys::IBV_QP_INIT_ATTR_RX_HASH,
            pd: self.pd,
            rwq_ind_tbl: table,
            rx_hash_conf: sys::ibv_rx_hash_conf {
                rx_hash_function: sys::IBV_RX_HASH_FUNC_TOEPLITZ as u8,
                rx_hash_key_len: RSS_KEY_LEN as u8,
                rx_hash_key: key.as_mut_ptr(),
                rx_hash_fields_mask: steer::hash_fields(hash),
            },
            ..Default::default()
        };
        let drop_table = |e: HwError| {
            // SAFETY: our table, no QP on it.
            let _ = unsafe { rdma::destroy_rwq_ind_table(table) };
            e
        };
        // SAFETY: a live context; the key outlives the call.
        let qp = unsafe { rdma::create_qp_ex(self.ctx, &mut qa) }
            .map_err(|e| drop_table(dev_err(format!("{}: RSS hash QP", self.name), e)))?;
        let h = QpFlows {
            table,
            qp,
            cq: ptr::null_mut(),
            flows: Vec::new(),
        };
        self.to_rtr(h, "RSS hash QP")
    }
}
