//! Queues through verbs and mlx4dv: CQs, RAW_PACKET send QPs and WQs made, queried, restarted
//! and destroyed, each handing the driver the rings libmlx4 laid out ([`CqDesc`], [`SqDesc`],
//! [`RqDesc`]).

use super::*;

impl Verbs {
    pub(super) fn new_cq(&self, cqe_cnt: u32, socket: i32) -> Result<CqDesc, HwError> {
        let mut st = self.st.lock();
        self.set_socket(socket);
        // libmlx4 sizes the CQ as the next power of two above the count asked for.
        let want = cqe_cnt.max(2) as c_int - 1;
        // SAFETY: a live context; no channel, no completion vector.
        let cq = unsafe {
            self.rdma
                .ibv
                .ibv_create_cq(self.ctx, want, ptr::null_mut(), ptr::null_mut(), 0)
        };
        if cq.is_null() {
            return Err(dev_err(format!("{}: creating a CQ", self.name), errno()));
        }
        let mut out = sys::mlx4dv_cq::default();
        let mut obj = sys::mlx4dv_obj::default();
        obj.cq.in_ = cq;
        obj.cq.out = &mut out;
        // SAFETY: a live CQ and its out struct.
        let rc = unsafe {
            self.rdma
                .dv
                .mlx4dv_init_obj(&mut obj, sys::MLX4DV_OBJ_CQ as u64)
        };
        let desc = (|| {
            if rc != 0 {
                return Err(dev_err("mlx4dv_init_obj(CQ)", rc));
            }
            let size = out.cqe_size as u32;
            if !out.cqe_cnt.is_power_of_two() || !(size == 32 || size == 64) {
                return Err(HwError::Device(format!(
                    "rdma-core handed back a CQ of {} entries of {size} bytes",
                    out.cqe_cnt
                )));
            }
            let (Some(buf), Some(ci)) = (
                NonNull::new(out.buf.buf.cast()),
                NonNull::new(out.set_ci_db),
            ) else {
                return Err(HwError::Device(
                    "rdma-core handed back a CQ without memory".into(),
                ));
            };
            // SAFETY: libmlx4's ring of `cqe_cnt` entries of `cqe_size` bytes and its
            // consumer-index record, both valid until ibv_destroy_cq in destroy_cq.
            Ok(unsafe { CqDesc::new(buf, out.cqe_cnt, size, ci.cast(), out.cqn) })
        })();
        match desc {
            Ok(d) => {
                st.cqs.insert(d.cqn(), cq);
                Ok(d)
            }
            Err(e) => {
                // SAFETY: the CQ just created, destroyed once.
                unsafe { self.rdma.ibv.ibv_destroy_cq(cq) };
                Err(e)
            }
        }
    }

    pub(super) fn drop_cq(&self, cq: CqDesc) -> Result<(), HwError> {
        let Some(p) = self.st.lock().cqs.remove(&cq.cqn()) else {
            return Err(HwError::Invalid(format!("no CQ {:#x}", cq.cqn())));
        };
        // SAFETY: our CQ, its queues destroyed before (the trait's order), destroyed once.
        match unsafe { self.rdma.ibv.ibv_destroy_cq(p) } {
            0 => Ok(()),
            e => Err(dev_err(format!("{}: destroying a CQ", self.name), e)),
        }
    }

    pub(super) fn new_sq(
        &self,
        txbb_cnt: u32,
        cq: &CqDesc,
        socket: i32,
    ) -> Result<SqDesc, HwError> {
        let mut st = self.st.lock();
        let Some(&cqp) = st.cqs.get(&cq.cqn()) else {
            return Err(HwError::Invalid(format!("no CQ {:#x}", cq.cqn())));
        };
        if txbb_cnt <= SQ_SPARE || !txbb_cnt.is_power_of_two() {
            return Err(HwError::Invalid(format!(
                "a send queue of {txbb_cnt} TXBBs (a power of two above {SQ_SPARE})"
            )));
        }
        self.set_socket(socket);
        let mut a = sys::ibv_qp_init_attr {
            send_cq: cqp,
            recv_cq: cqp,
            cap: sys::ibv_qp_cap {
                max_send_wr: txbb_cnt - SQ_SPARE,
                max_send_sge: 1,
                ..Default::default()
            },
            qp_type: sys::IBV_QPT_RAW_PACKET,
            ..Default::default()
        };
        // SAFETY: a live PD and a filled attribute.
        let qp = unsafe { self.rdma.ibv.ibv_create_qp(self.pd, &mut a) };
        if qp.is_null() {
            return Err(dev_err(
                format!("{}: creating a send QP", self.name),
                errno(),
            ));
        }
        let made = (|| {
            for s in [sys::IBV_QPS_INIT, sys::IBV_QPS_RTR, sys::IBV_QPS_RTS] {
                self.modify_qp(qp, s)
                    .map_err(|e| dev_err(format!("send QP to state {s}"), e))?;
            }
            let mut out = sys::mlx4dv_qp::default();
            let mut obj = sys::mlx4dv_obj::default();
            obj.qp.in_ = qp;
            obj.qp.out = &mut out;
            // SAFETY: a live QP and its out struct.
            let rc = unsafe {
                self.rdma
                    .dv
                    .mlx4dv_init_obj(&mut obj, sys::MLX4DV_OBJ_QP as u64)
            };
            if rc != 0 {
                return Err(dev_err("mlx4dv_init_obj(QP)", rc));
            }
            let shift = out.sq.wqe_shift;
            if !(6..=11).contains(&shift) || !out.sq.wqe_cnt.is_power_of_two() {
                return Err(HwError::Device(format!(
                    "rdma-core handed back a send queue of {} WQEs of stride 2^{shift}",
                    out.sq.wqe_cnt
                )));
            }
            // WQEs are built TXBB after TXBB whatever the stride (the device walks TXBBs).
            let txbbs = out.sq.wqe_cnt << (shift - 6);
            // SAFETY: the send queue lies `sq.offset` bytes into libmlx4's QP buffer.
            let buf = unsafe { out.buf.buf.cast::<u8>().add(out.sq.offset as usize) };
            let (Some(buf), Some(db)) = (NonNull::new(buf), NonNull::new(out.sdb)) else {
                return Err(HwError::Device(
                    "rdma-core handed back a QP without memory".into(),
                ));
            };
            Ok((buf, txbbs, db))
        })();
        let (buf, txbbs, db) = match made {
            Ok(m) => m,
            Err(e) => {
                self.destroy_qp(qp);
                return Err(e);
            }
        };
        let bf = self.bf.as_ref().and_then(pages::BfPage::take);
        // SAFETY: a live QP.
        let qpn = unsafe { (*qp).qp_num };
        // SAFETY: libmlx4's ring of `txbbs` TXBBs, the send doorbell of the context's UAR page
        // and our BF register stay valid until destroy_sq destroys the QP and frees the
        // register.
        let desc = unsafe { SqDesc::new(buf, txbbs, db.cast(), bf.map(|b| b.1), qpn) };
        st.qps.insert(qpn, (qp, bf.map(|b| b.0)));
        Ok(desc)
    }

    pub(super) fn drop_sq(&self, sq: SqDesc) -> Result<(), HwError> {
        let Some((qp, reg)) = self.st.lock().qps.remove(&sq.qpn()) else {
            return Err(HwError::Invalid(format!("no send QP {:#x}", sq.qpn())));
        };
        // SAFETY: our QP, destroyed once.
        let rc = unsafe { self.rdma.ibv.ibv_destroy_qp(qp) };
        if let (Some(i), Some(p)) = (reg, &self.bf) {
            p.give_back(i);
        }
        match rc {
            0 => Ok(()),
            e => Err(dev_err(format!("{}: destroying a send QP", self.name), e)),
        }
    }

    pub(super) fn new_rq(
        &self,
        wqe_cnt: u32,
        sges: u32,
        cq: &CqDesc,
        socket: i32,
    ) -> Result<RqDesc, HwError> {
        let mut st = self.st.lock();
        let Some(&cqp) = st.cqs.get(&cq.cqn()) else {
            return Err(HwError::Invalid(format!("no CQ {:#x}", cq.cqn())));
        };
        self.set_socket(socket);
        let mut a = sys::ibv_wq_init_attr {
            wq_type: sys::IBV_WQT_RQ,
            max_wr: wqe_cnt,
            max_sge: sges,
            pd: self.pd,
            cq: cqp,
            ..Default::default()
        };
        // The first WQ of a batch reserves an aligned range of WQNs the rest take in turn
        // (mlx4_ib hands them out so; libmlx4 passes the size with the next WQ only).
        let range = st.wq_range.take().filter(|&n| n > 1);
        if let Some(n) = range {
            self.set_wq_range(n);
        }
        // SAFETY: a live context and a filled attribute.
        let mut made = unsafe { rdma::create_wq(self.ctx, &mut a) };
        if let (Some(n), Err(libc::EINVAL)) = (range, made) {
            // mlx4_ib refuses a new range while the last one is open (not all its WQNs
            // taken, none destroyed): such queues cannot share an indirection table, which
            // the port says at start.
            pmd_log!(
                WARNING,
                "{}: no WQN range for {n} receive queues; RSS over them will be refused",
                self.name
            );
            self.set_wq_range(1);
            // SAFETY: as above.
            made = unsafe { rdma::create_wq(self.ctx, &mut a) };
        }
        let wq = made.map_err(|e| dev_err(format!("{}: creating a receive WQ", self.name), e))?;
        let made = (|| {
            let mut m = sys::ibv_wq_attr {
                attr_mask: sys::IBV_WQ_ATTR_STATE,
                wq_state: sys::IBV_WQS_RDY,
                ..Default::default()
            };
            // SAFETY: our live WQ.
            unsafe { rdma::modify_wq(wq, &mut m) }.map_err(|e| dev_err("WQ to RDY", e))?;
            let mut out = sys::mlx4dv_rwq::default();
            let mut obj = sys::mlx4dv_obj::default();
            obj.rwq.in_ = wq;
            obj.rwq.out = &mut out;
            // SAFETY: a live WQ and its out struct.
            let rc = unsafe {
                self.rdma
                    .dv
                    .mlx4dv_init_obj(&mut obj, sys::MLX4DV_OBJ_RWQ as u64)
            };
            if rc != 0 {
                return Err(dev_err("mlx4dv_init_obj(RWQ)", rc));
            }
            let stride = 1u32 << out.rq.wqe_shift.clamp(4, 12);
            let cnt = out.rq.wqe_cnt;
            if !cnt.is_power_of_two() || cnt < wqe_cnt || stride / 16 < sges {
                return Err(HwError::Device(format!(
                    "rdma-core handed back a receive queue of {cnt} WQEs of {stride} bytes for \
                     {wqe_cnt} of {sges} entries"
                )));
            }
            // SAFETY: the receive queue lies `rq.offset` bytes into libmlx4's buffer.
            let buf = unsafe { out.buf.buf.cast::<u8>().add(out.rq.offset as usize) };
            let (Some(buf), Some(db)) = (NonNull::new(buf), NonNull::new(out.rdb)) else {
                return Err(HwError::Device(
                    "rdma-core handed back a WQ without memory".into(),
                ));
            };
            // SAFETY: a live WQ.
            let wqn = unsafe { (*wq).wq_num };
            // SAFETY: libmlx4's ring of `cnt` WQEs of `stride / 16` entries and its doorbell
            // record, valid until destroy_rq destroys the WQ.
            Ok(unsafe { RqDesc::new(buf, cnt, stride / 16, db.cast(), wqn) })
        })();
        match made {
            Ok(d) => {
                st.wqs.insert(d.qpn(), wq);
                Ok(d)
            }
            Err(e) => {
                // SAFETY: the WQ just created, destroyed once.
                let _ = unsafe { rdma::destroy_wq(wq) };
                Err(HwError::Device(format!("{}: {e}", self.name)))
            }
        }
    }

    pub(super) fn drop_rq(&self, rq: RqDesc) -> Result<(), HwError> {
        let mut st = self.st.lock();
        // A WQ in an indirection table cannot be destroyed: steering goes first.
        if st
            .steer
            .built
            .as_ref()
            .is_some_and(|b| b.wqns.contains(&rq.qpn()))
        {
            self.teardown(&mut st.steer);
        }
        let Some(wq) = st.wqs.remove(&rq.qpn()) else {
            return Err(HwError::Invalid(format!("no WQ {:#x}", rq.qpn())));
        };
        // SAFETY: our WQ, out of every table, destroyed once.
        unsafe { rdma::destroy_wq(wq) }
            .map_err(|e| dev_err(format!("{}: destroying a WQ", self.name), e))
    }

    pub(super) fn query_sq(&self, qpn: u32) -> Result<QueueState, HwError> {
        let st = self.st.lock();
        let Some(&(qp, _)) = st.qps.get(&qpn) else {
            return Err(HwError::Invalid(format!("no send QP {qpn:#x}")));
        };
        let Ok(query) = self.rdma.ibv.ibv_query_qp.as_ref() else {
            return Ok(QueueState::Ready);
        };
        let mut a = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        // SAFETY: a live QP and out structs.
        let rc = unsafe { query(qp, &mut a, sys::IBV_QP_STATE as c_int, &mut init) };
        match rc {
            0 if a.qp_state == sys::IBV_QPS_RTS => Ok(QueueState::Ready),
            0 => Ok(QueueState::Error),
            // A provider without the query (the stand-in): errors show in completions.
            libc::EOPNOTSUPP | libc::ENOSYS => Ok(QueueState::Ready),
            e => Err(dev_err("querying a send QP", e)),
        }
    }

    pub(super) fn query_rq(&self, qpn: u32) -> Result<QueueState, HwError> {
        let st = self.st.lock();
        let Some(&wq) = st.wqs.get(&qpn) else {
            return Err(HwError::Invalid(format!("no WQ {qpn:#x}")));
        };
        // SAFETY: a live WQ's state word, which the provider updates on modify.
        let s = unsafe { (*wq).state };
        Ok(if s == sys::IBV_WQS_ERR {
            QueueState::Error
        } else {
            QueueState::Ready
        })
    }

    pub(super) fn reset_rq(&self, qpn: u32) -> Result<(), HwError> {
        let st = self.st.lock();
        let Some(&wq) = st.wqs.get(&qpn) else {
            return Err(HwError::Invalid(format!("no WQ {qpn:#x}")));
        };
        for (state, what) in [
            (sys::IBV_WQS_RESET, "WQ to RESET"),
            (sys::IBV_WQS_RDY, "WQ to RDY"),
        ] {
            let mut m = sys::ibv_wq_attr {
                attr_mask: sys::IBV_WQ_ATTR_STATE,
                wq_state: state,
                ..Default::default()
            };
            // SAFETY: our live WQ, kept in the table we hold locked.
            unsafe { rdma::modify_wq(wq, &mut m) }.map_err(|e| dev_err(what, e))?;
        }
        Ok(())
    }
}
