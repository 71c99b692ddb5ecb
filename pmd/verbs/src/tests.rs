//! The stand-in driven the way an rdma-core user drives libibverbs and libmlx4 (DPDK's mlx4, our
//! rdma-core backend): the entry points and the `verbs_context` ops the inline functions of
//! `verbs.h` call, then rings written by hand through what `mlx4dv_init_obj` hands back, on a
//! looped wire: a frame sent on a RAW_PACKET QP comes back through a WQ, an indirection table, a
//! hash QP and a promiscuous flow.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{fence, AtomicU32, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use mlx4_prm::{cqe_opcode, cqe_owner, opcode, srcrb, Cqe, CtrlSeg, DataSeg, CQE_SIZE};

use crate::context::*;
use crate::dv::*;
use crate::open::*;
use crate::queries::*;
use crate::queues::*;
use crate::sys;

const DEADLINE: Duration = Duration::from_secs(10);

/// What `verbs_get_ctx_op` in verbs.h does: the extended context behind an `ibv_context`.
fn vctx(ctx: *mut sys::ibv_context) -> &'static sys::verbs_context {
    // SAFETY: `ctx` is an open context of ours; the checks are those of verbs.h.
    unsafe {
        assert_eq!(
            (*ctx).abi_compat,
            usize::MAX as *mut c_void,
            "extended context"
        );
        let off = std::mem::offset_of!(sys::verbs_context, context);
        let v = &*ctx.cast::<u8>().sub(off).cast::<sys::verbs_context>();
        assert_eq!(v.sz, std::mem::size_of::<sys::verbs_context>());
        v
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The owner byte of CQE `n` says software owns it (pass 0: owner bit clear).
fn cqe_ready(buf: *const u8, n: usize) -> bool {
    // SAFETY: a CQE of a live CQ buffer; the device publishes the owner byte last.
    let b = unsafe { AtomicU8::from_ptr(buf.add(n * CQE_SIZE + CQE_SIZE - 1).cast_mut()) }
        .load(Ordering::Acquire);
    b & cqe_owner::OWNER == 0
}

fn cqe(buf: *const u8, n: usize) -> [u8; CQE_SIZE] {
    let mut c = [0u8; CQE_SIZE];
    // SAFETY: reading a CQE software owns.
    unsafe { ptr::copy_nonoverlapping(buf.add(n * CQE_SIZE), c.as_mut_ptr(), CQE_SIZE) };
    c
}

fn set_up(ifname: &str) {
    let st = std::process::Command::new("ip")
        .args(["link", "set", ifname, "up"])
        .status()
        .expect("ip (iproute2)");
    assert!(st.success(), "ip link set {ifname} up");
}

#[test]
fn verbs_and_mlx4dv_drive_the_model_like_rdma_core() {
    assert!(
        std::path::Path::new("/dev/net/tun").exists(),
        "this test needs root and /dev/net/tun (the port's netdev is a TAP interface)"
    );
    // A sysfs tree as the C driver reads it, and the one device in MLX4RS_VERBS.
    let dir = std::env::temp_dir().join(format!("mlx4-verbs-api-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pci = dir.join("0000:00:05.0");
    let netdev = format!("m4u{}", std::process::id() % 100_000);
    std::fs::create_dir_all(pci.join("net").join(&netdev)).unwrap();
    std::fs::write(pci.join("uevent"), "PCI_SLOT_NAME=0000:00:05.0\n").unwrap();
    std::fs::write(pci.join("device"), "0x1003\n").unwrap();
    std::fs::write(pci.join("net").join(&netdev).join("dev_port"), "0\n").unwrap();
    let ibdev = dir.join("mlx4_0");
    std::fs::create_dir_all(&ibdev).unwrap();
    std::os::unix::fs::symlink(&pci, ibdev.join("device")).unwrap();
    let stats = dir.join("stats");
    std::env::set_var(
        crate::config::ENV,
        format!(
            "ibdev={},wire=loop,stats={}",
            ibdev.display(),
            stats.display()
        ),
    );

    // SAFETY: every call below is an entry point used as rdma-core documents it, on objects it
    // returned; ring memory is written as an mlx4 driver writes it.
    unsafe {
        let mut n: c_int = 0;
        let list = mlx4rs_verbs__ibv_get_device_list(&mut n);
        assert_eq!(n, 1);
        let name = CStr::from_ptr(mlx4rs_verbs__ibv_get_device_name(*list));
        assert_eq!(name.to_str(), Ok("mlx4_0"));
        let ctx = mlx4rs_verbs__ibv_open_device(*list);
        mlx4rs_verbs__ibv_free_device_list(list);
        assert!(!ctx.is_null());
        let v = vctx(ctx);

        let mut attr = sys::ibv_device_attr::default();
        assert_eq!(mlx4rs_verbs__ibv_query_device(ctx, &mut attr), 0);
        assert_eq!((attr.vendor_part_id, attr.phys_port_cnt), (0x1003, 1));
        assert!(attr.max_sge >= 32, "DPDK's mlx4 asserts 32 SGEs");
        let fw = CStr::from_ptr(attr.fw_ver.as_ptr());
        assert_eq!(
            fw.to_str(),
            Ok("2.42.5000"),
            "the model's firmware, as mlx4_ib says it"
        );
        let mut ex = sys::ibv_device_attr_ex::default();
        let q = v.query_device_ex.expect("query_device_ex op");
        assert_eq!(
            q(
                ctx,
                ptr::null(),
                &mut ex,
                size_of::<sys::ibv_device_attr_ex>()
            ),
            0
        );
        assert_eq!(ex.rss_caps.rx_hash_fields_mask, 0xff);
        assert_eq!(ex.tso_caps.supported_qpts, 1 << sys::IBV_QPT_RAW_PACKET);

        // The port follows its netdev: down until the application brings it up, then an async
        // event.
        let mut pa = sys::ibv_port_attr::default();
        let qp_op = v.query_port.expect("query_port op");
        assert_eq!(qp_op(ctx, 1, &mut pa, size_of::<sys::ibv_port_attr>()), 0);
        assert_eq!(pa.link_layer, sys::IBV_LINK_LAYER_ETHERNET as u8);
        assert_eq!(pa.state, sys::IBV_PORT_DOWN);
        set_up(&netdev);
        let mut ev = sys::ibv_async_event::default();
        assert_eq!(
            mlx4rs_verbs__ibv_get_async_event(ctx, &mut ev),
            0,
            "blocks until"
        );
        assert_eq!(ev.event_type, sys::IBV_EVENT_PORT_ACTIVE);
        assert_eq!(ev.element.port_num, 1);
        mlx4rs_verbs__ibv_ack_async_event(&mut ev);

        // Memory for frames.
        let pd = mlx4rs_verbs__ibv_alloc_pd(ctx);
        let mut mem = vec![0u8; 64 * 1024];
        let mr = mlx4rs_verbs__ibv_reg_mr_iova2(
            pd,
            mem.as_mut_ptr().cast(),
            mem.len(),
            mem.as_ptr() as u64,
            0,
        );
        assert!(!mr.is_null());
        let lkey = (*mr).lkey;

        // Send side: CQ, RAW_PACKET QP to RTS.
        let scq = mlx4rs_verbs__ibv_create_cq(ctx, 64, ptr::null_mut(), ptr::null_mut(), 0);
        assert_eq!((*scq).cqe, 127, "libmlx4 rounds cqe + 1 up");
        let mut qa = sys::ibv_qp_init_attr {
            send_cq: scq,
            recv_cq: scq,
            cap: sys::ibv_qp_cap {
                max_send_wr: 64,
                max_send_sge: 1,
                ..Default::default()
            },
            qp_type: sys::IBV_QPT_RAW_PACKET,
            ..Default::default()
        };
        let qp = mlx4rs_verbs__ibv_create_qp(pd, &mut qa);
        assert!(!qp.is_null());
        assert_eq!((qa.cap.max_send_wr, qa.cap.max_inline_data), (128 - 33, 44));
        let mut m = sys::ibv_qp_attr {
            qp_state: sys::IBV_QPS_INIT,
            port_num: 1,
            ..Default::default()
        };
        let mask = |b: u32| b as c_int;
        assert_eq!(
            mlx4rs_verbs__ibv_modify_qp(qp, &mut m, mask(sys::IBV_QP_STATE)),
            libc::EINVAL,
            "RESET->INIT needs the port"
        );
        assert_eq!(
            mlx4rs_verbs__ibv_modify_qp(qp, &mut m, mask(sys::IBV_QP_STATE | sys::IBV_QP_PORT)),
            0
        );
        for s in [sys::IBV_QPS_RTR, sys::IBV_QPS_RTS] {
            m.qp_state = s;
            assert_eq!(
                mlx4rs_verbs__ibv_modify_qp(qp, &mut m, mask(sys::IBV_QP_STATE)),
                0
            );
        }
        assert_eq!((*qp).state, sys::IBV_QPS_RTS);

        // Receive side: a completion channel, CQ, WQ, indirection table, Toeplitz hash QP,
        // promiscuous flow.
        let ch = mlx4rs_verbs__ibv_create_comp_channel(ctx);
        assert!(!ch.is_null());
        let rcq_ctx = 0x5eed_usize as *mut c_void;
        let rcq = mlx4rs_verbs__ibv_create_cq(ctx, 15, rcq_ctx, ch, 0);
        assert!(!rcq.is_null());
        assert_eq!((*ch).refcnt, 1);
        let mut wa = sys::ibv_wq_init_attr {
            wq_type: sys::IBV_WQT_RQ,
            max_wr: 16,
            max_sge: 1,
            pd,
            cq: rcq,
            ..Default::default()
        };
        let wq = v.create_wq.expect("create_wq op")(ctx, &mut wa);
        assert!(!wq.is_null());
        let mut wm = sys::ibv_wq_attr {
            attr_mask: sys::IBV_WQ_ATTR_STATE,
            wq_state: sys::IBV_WQS_RDY,
            ..Default::default()
        };
        assert_eq!(v.modify_wq.expect("modify_wq op")(wq, &mut wm), 0);
        let mut wqs = [wq];
        let mut ia = sys::ibv_rwq_ind_table_init_attr {
            log_ind_tbl_size: 0,
            ind_tbl: wqs.as_mut_ptr(),
            comp_mask: 0,
        };
        let ind = v.create_rwq_ind_table.expect("ind table op")(ctx, &mut ia);
        assert!(!ind.is_null());
        let mut key = mlx4_hca::DEFAULT_RSS_KEY;
        let mut ha = sys::ibv_qp_init_attr_ex {
            comp_mask: sys::IBV_QP_INIT_ATTR_PD
                | sys::IBV_QP_INIT_ATTR_RX_HASH
                | sys::IBV_QP_INIT_ATTR_IND_TABLE,
            qp_type: sys::IBV_QPT_RAW_PACKET,
            pd,
            rwq_ind_tbl: ind,
            rx_hash_conf: sys::ibv_rx_hash_conf {
                rx_hash_function: sys::IBV_RX_HASH_FUNC_TOEPLITZ as u8,
                rx_hash_key_len: 40,
                rx_hash_key: key.as_mut_ptr(),
                rx_hash_fields_mask: u64::from(
                    sys::IBV_RX_HASH_SRC_IPV4 | sys::IBV_RX_HASH_DST_IPV4,
                ),
            },
            ..Default::default()
        };
        let hqp = v.create_qp_ex.expect("create_qp_ex op")(ctx, &mut ha);
        assert!(!hqp.is_null());
        m.qp_state = sys::IBV_QPS_INIT;
        assert_eq!(
            mlx4rs_verbs__ibv_modify_qp(hqp, &mut m, mask(sys::IBV_QP_STATE | sys::IBV_QP_PORT)),
            0
        );
        m.qp_state = sys::IBV_QPS_RTR;
        assert_eq!(
            mlx4rs_verbs__ibv_modify_qp(hqp, &mut m, mask(sys::IBV_QP_STATE)),
            0
        );
        let mut fa = sys::ibv_flow_attr {
            type_: sys::IBV_FLOW_ATTR_ALL_DEFAULT,
            size: size_of::<sys::ibv_flow_attr>() as u16,
            port: 1,
            ..Default::default()
        };
        let flow = v.ibv_create_flow.expect("create_flow op")(hqp, &mut fa);
        assert!(!flow.is_null());

        // The rings.
        let mut dq = sys::mlx4dv_qp {
            comp_mask: u64::from(sys::MLX4DV_QP_MASK_UAR_MMAP_OFFSET),
            ..Default::default()
        };
        let mut dc = sys::mlx4dv_cq::default();
        let mut obj = sys::mlx4dv_obj::default();
        obj.qp.in_ = qp;
        obj.qp.out = &mut dq;
        obj.cq.in_ = scq;
        obj.cq.out = &mut dc;
        assert_eq!(
            mlx4rs_verbs__mlx4dv_init_obj(
                &mut obj,
                u64::from(sys::MLX4DV_OBJ_QP | sys::MLX4DV_OBJ_CQ)
            ),
            0
        );
        assert_eq!((dq.sq.wqe_cnt, dq.sq.wqe_shift, dq.sq.offset), (128, 6, 0));
        assert_eq!(dq.rq.offset, 128 * 64);
        assert_eq!(dq.doorbell_qpn, ((*qp).qp_num << 8).to_be());
        // The UAR page maps from the command fd at the offset reported, as a secondary process
        // maps it; its BlueFlame page follows it.
        assert_eq!(dq.comp_mask, u64::from(sys::MLX4DV_QP_MASK_UAR_MMAP_OFFSET));
        let ps = page_size();
        let uar = libc::mmap(
            ptr::null_mut(),
            2 * ps,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            (*ctx).cmd_fd,
            dq.uar_mmap_offset,
        );
        assert_ne!(uar, libc::MAP_FAILED, "mmap(cmd_fd, uar_mmap_offset)");
        let sdb_offset = dq.sdb as usize % ps;
        assert_eq!(sdb_offset, mlx4_prm::SEND_DOORBELL_OFFSET);
        assert_eq!((dc.cqe_cnt, dc.cqe_size), (128, 32));
        let mut drw = sys::mlx4dv_rwq::default();
        let mut drc = sys::mlx4dv_cq::default();
        let mut robj = sys::mlx4dv_obj::default();
        robj.rwq.in_ = wq;
        robj.rwq.out = &mut drw;
        robj.cq.in_ = rcq;
        robj.cq.out = &mut drc;
        assert_eq!(
            mlx4rs_verbs__mlx4dv_init_obj(
                &mut robj,
                u64::from(sys::MLX4DV_OBJ_RWQ | sys::MLX4DV_OBJ_CQ)
            ),
            0
        );
        assert_eq!((drw.rq.wqe_cnt, drw.rq.wqe_shift), (16, 4));

        // Post 16 receive buffers of 2 KB (from 32 KB on) and publish them.
        let base = mem.as_mut_ptr();
        let rq = drw.buf.buf.cast::<u8>().add(drw.rq.offset as usize);
        for i in 0..16usize {
            let mut seg = [0u8; 16];
            let mut d = DataSeg::new_unchecked(&mut seg[..]);
            d.set_byte_count(2048);
            d.set_lkey(lkey);
            d.set_addr(base.add(32768 + i * 2048) as u64);
            ptr::copy_nonoverlapping(seg.as_ptr(), rq.add(i * 16), 16);
        }
        fence(Ordering::Release);
        AtomicU32::from_ptr(drw.rdb).store(16u32.to_be(), Ordering::Release);

        // Ask for an event at the next receive completion.
        let notify = (*ctx).ops.req_notify_cq.expect("req_notify_cq op");
        assert_eq!(notify(rcq, 0), 0);

        // One frame: broadcast, a local experimental EtherType, 60 bytes.
        let frame: Vec<u8> = [0xff; 6]
            .into_iter()
            .chain([0x02, 0, 0, 0, 0, 1, 0x88, 0xb5])
            .chain((0..46).map(|i| i as u8))
            .collect();
        ptr::copy_nonoverlapping(frame.as_ptr(), base, frame.len());
        // A SEND WQE with one data segment, asking for a completion; the owner word last.
        let mut wqe = [0u8; 32];
        {
            let mut c = CtrlSeg::new_unchecked(&mut wqe[..16]);
            c.set_fence_size(2);
            c.set_srcrb_flags(srcrb::CQ_UPDATE);
            let mut d = DataSeg::new_unchecked(&mut wqe[16..]);
            d.set_byte_count(frame.len() as u32);
            d.set_lkey(lkey);
            d.set_addr(base as u64);
        }
        let sq = dq.buf.buf.cast::<u8>().add(dq.sq.offset as usize);
        ptr::copy_nonoverlapping(wqe.as_ptr().add(4), sq.add(4), 28);
        fence(Ordering::Release);
        AtomicU32::from_ptr(sq.cast::<u32>())
            .store(u32::from(opcode::SEND).to_be(), Ordering::Release);
        fence(Ordering::SeqCst);
        // Rung through the second mapping: the same device page.
        AtomicU32::from_ptr(uar.cast::<u8>().add(sdb_offset).cast())
            .store(dq.doorbell_qpn, Ordering::Release);

        let scqe = dc.buf.buf.cast::<u8>();
        wait_until("the send completion", || cqe_ready(scqe, 0));
        let c = cqe(scqe, 0);
        let c = Cqe::new_unchecked(&c[..]);
        assert!(c.is_send());
        assert_eq!(c.opcode(), opcode::SEND);
        assert_eq!(c.qpn(), (*qp).qp_num);
        let rcqe = drc.buf.buf.cast::<u8>();
        wait_until("the frame back on the loop", || cqe_ready(rcqe, 0));
        let r = cqe(rcqe, 0);
        let r = Cqe::new_unchecked(&r[..]);
        assert_eq!(r.opcode(), cqe_opcode::RX_SEND);
        assert_eq!(r.qpn(), (*wq).wq_num);
        assert_eq!(r.byte_cnt() as usize, frame.len());
        assert_eq!(&mem[32768..32768 + frame.len()], &frame[..]);
        // The completion raised the event the arm asked for (blocking read of the channel).
        let (mut ecq, mut ectx) = (ptr::null_mut(), ptr::null_mut());
        assert_eq!(mlx4rs_verbs__ibv_get_cq_event(ch, &mut ecq, &mut ectx), 0);
        assert_eq!((ecq, ectx), (rcq, rcq_ctx));
        mlx4rs_verbs__ibv_ack_cq_events(rcq, 1);
        // One event per arming: nothing more waits (the fd made non-blocking, as DPDK does).
        libc::fcntl((*ch).fd, libc::F_SETFL, libc::O_NONBLOCK);
        assert_eq!(mlx4rs_verbs__ibv_get_cq_event(ch, &mut ecq, &mut ectx), -1);
        assert_eq!(*libc::__errno_location(), libc::EAGAIN);

        // A drop rule (a flow on a QP without receive queue, as DPDK's mlx4 makes for the drop
        // action) for UDP to port 9, ahead of the promiscuous flow: such a frame is dropped.
        let mut drop_specs = Vec::new();
        let eth = sys::ibv_flow_spec_eth {
            type_: sys::IBV_FLOW_SPEC_ETH,
            size: size_of::<sys::ibv_flow_spec_eth>() as u16,
            ..Default::default()
        };
        let mut udp = sys::ibv_flow_spec_tcp_udp {
            type_: sys::IBV_FLOW_SPEC_UDP,
            size: size_of::<sys::ibv_flow_spec_tcp_udp>() as u16,
            ..Default::default()
        };
        udp.val.dst_port = 9u16.to_be();
        udp.mask.dst_port = 0xffff;
        let hdr = sys::ibv_flow_attr {
            type_: sys::IBV_FLOW_ATTR_NORMAL,
            size: (size_of::<sys::ibv_flow_attr>()
                + size_of::<sys::ibv_flow_spec_eth>()
                + size_of::<sys::ibv_flow_spec_tcp_udp>()) as u16,
            num_of_specs: 2,
            port: 1,
            ..Default::default()
        };
        for part in [
            std::slice::from_raw_parts(
                (&hdr as *const sys::ibv_flow_attr).cast::<u8>(),
                size_of_val(&hdr),
            ),
            std::slice::from_raw_parts(
                (&eth as *const sys::ibv_flow_spec_eth).cast::<u8>(),
                size_of_val(&eth),
            ),
            std::slice::from_raw_parts(
                (&udp as *const sys::ibv_flow_spec_tcp_udp).cast::<u8>(),
                size_of_val(&udp),
            ),
        ] {
            drop_specs.extend_from_slice(part);
        }
        let drop_flow =
            v.ibv_create_flow.expect("create_flow op")(qp, drop_specs.as_mut_ptr().cast());
        assert!(!drop_flow.is_null());
        // UDP/IPv4 to port 9, then the same to port 10, through the next two SQ slots.
        let udp_frame = |port: u16| -> Vec<u8> {
            let mut f = vec![0xff; 6];
            f.extend([0x02, 0, 0, 0, 0, 1, 0x08, 0x00]);
            f.extend([
                0x45, 0, 0, 46, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
            ]);
            f.extend(1000u16.to_be_bytes());
            f.extend(port.to_be_bytes());
            f.extend(26u16.to_be_bytes());
            f.extend([0, 0]);
            f.extend([0xab; 18]);
            f
        };
        for (slot, port) in [(1usize, 9u16), (2, 10)] {
            let f = udp_frame(port);
            ptr::copy_nonoverlapping(f.as_ptr(), base.add(slot * 128), f.len());
            let mut w = wqe;
            {
                let mut d = DataSeg::new_unchecked(&mut w[16..]);
                d.set_byte_count(f.len() as u32);
                d.set_addr(base.add(slot * 128) as u64);
            }
            let at = sq.add(slot * 64);
            ptr::copy_nonoverlapping(w.as_ptr().add(4), at.add(4), 28);
            fence(Ordering::Release);
            AtomicU32::from_ptr(at.cast::<u32>())
                .store(u32::from(opcode::SEND).to_be(), Ordering::Release);
        }
        fence(Ordering::SeqCst);
        AtomicU32::from_ptr(uar.cast::<u8>().add(sdb_offset).cast())
            .store(dq.doorbell_qpn, Ordering::Release);
        wait_until("the port-10 frame", || cqe_ready(rcqe, 1));
        let r = cqe(rcqe, 1);
        let r = Cqe::new_unchecked(&r[..]);
        assert_eq!(r.byte_cnt() as usize, udp_frame(10).len());
        assert_eq!(
            mem[32768 + 2048 + 36..32768 + 2048 + 38],
            10u16.to_be_bytes()
        );
        assert!(!cqe_ready(rcqe, 2), "the port-9 frame was dropped");
        assert_eq!(v.ibv_destroy_flow.expect("op")(drop_flow), 0);

        // A QP moves to ERR and back through RESET, as on a card.
        for s in [sys::IBV_QPS_ERR, sys::IBV_QPS_RESET] {
            m.qp_state = s;
            assert_eq!(
                mlx4rs_verbs__ibv_modify_qp(qp, &mut m, mask(sys::IBV_QP_STATE)),
                0
            );
        }
        libc::munmap(uar, 2 * ps);

        // Teardown in rdma-core's order; what is still in use says so.
        assert_eq!(
            mlx4rs_verbs__ibv_destroy_cq(scq),
            libc::EBUSY,
            "the QP uses it"
        );
        assert_eq!(
            mlx4rs_verbs__ibv_destroy_qp(hqp),
            libc::EBUSY,
            "a flow uses it"
        );
        assert_eq!(v.ibv_destroy_flow.expect("op")(flow), 0);
        assert_eq!(mlx4rs_verbs__ibv_destroy_qp(hqp), 0);
        assert_eq!(
            v.destroy_wq.expect("op")(wq),
            libc::EBUSY,
            "the table uses it"
        );
        assert_eq!(v.destroy_rwq_ind_table.expect("op")(ind), 0);
        assert_eq!(v.destroy_wq.expect("op")(wq), 0);
        assert_eq!(mlx4rs_verbs__ibv_destroy_qp(qp), 0);
        assert_eq!(mlx4rs_verbs__ibv_destroy_cq(scq), 0);
        assert_eq!(
            mlx4rs_verbs__ibv_destroy_comp_channel(ch),
            libc::EBUSY,
            "a CQ uses it"
        );
        assert_eq!(mlx4rs_verbs__ibv_destroy_cq(rcq), 0);
        assert_eq!(mlx4rs_verbs__ibv_destroy_comp_channel(ch), 0);
        assert_eq!(mlx4rs_verbs__ibv_dereg_mr(mr), 0);
        assert_eq!(mlx4rs_verbs__ibv_dealloc_pd(pd), 0);
        assert_eq!(mlx4rs_verbs__ibv_close_device(ctx), 0);
    }
    let text = std::fs::read_to_string(&stats).expect("counters written at the last close");
    for line in [
        "tx_frames 3",
        "rx_frames 2",
        "rx_drops_flow 1",
        "cqes 5",
        "error_cqes 0",
        "cq_events 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
