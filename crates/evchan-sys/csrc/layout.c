/*
 * Layout of the rdma-core structs evchan reads, as the installed C headers define them.
 *
 * Compiled by build.rs (with the `cc` crate, for the target being built) into a small static
 * library. src/layout.rs reads the table below and compares every entry with what rdma-sys's
 * Rust definitions say; the tests in tests/layout.rs fail on any difference.
 *
 * Check names are C expressions and must match the names src/layout.rs builds:
 *   "sizeof(T)", "alignof(T)", "offsetof(T, path)", "sizeof(T.path)"
 * where T is the struct, union or enum tag and path a member designator ("param.conn").
 */

#include <stdalign.h>
#include <stddef.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

struct evchan_layout_entry {
	const char *type;  /* the C tag, e.g. "rdma_cm_event" */
	const char *check; /* e.g. "offsetof(rdma_cm_event, status)" */
	size_t value;
};

/* Size and alignment of `KIND T` (KIND is struct, union or enum). */
#define TYPE(KIND, T) \
	{ #T, "sizeof(" #T ")", sizeof(KIND T) }, \
	{ #T, "alignof(" #T ")", alignof(KIND T) }

/* Offset and size of member F (a member designator, may be nested) of `KIND T`. */
#define FIELD(KIND, T, F) \
	{ #T, "offsetof(" #T ", " #F ")", offsetof(KIND T, F) }, \
	{ #T, "sizeof(" #T "." #F ")", sizeof(((KIND T *)0)->F) }

#define S(T) TYPE(struct, T)
#define SF(T, F) FIELD(struct, T, F)

static const struct evchan_layout_entry evchan_layout[] = {
	/* <rdma/rdma_cma.h> */
	S(rdma_event_channel),
	SF(rdma_event_channel, fd),

	S(rdma_cm_event),
	SF(rdma_cm_event, id),
	SF(rdma_cm_event, listen_id),
	SF(rdma_cm_event, event),
	SF(rdma_cm_event, status),
	SF(rdma_cm_event, param),
	SF(rdma_cm_event, param.conn),
	SF(rdma_cm_event, param.ud),

	S(rdma_conn_param),
	SF(rdma_conn_param, private_data),
	SF(rdma_conn_param, private_data_len),
	SF(rdma_conn_param, responder_resources),
	SF(rdma_conn_param, initiator_depth),
	SF(rdma_conn_param, flow_control),
	SF(rdma_conn_param, retry_count),
	SF(rdma_conn_param, rnr_retry_count),
	SF(rdma_conn_param, srq),
	SF(rdma_conn_param, qp_num),

	S(rdma_ud_param),
	SF(rdma_ud_param, private_data),
	SF(rdma_ud_param, private_data_len),
	SF(rdma_ud_param, ah_attr),
	SF(rdma_ud_param, qp_num),
	SF(rdma_ud_param, qkey),

	S(rdma_cm_id),
	SF(rdma_cm_id, verbs),
	SF(rdma_cm_id, channel),
	SF(rdma_cm_id, context),
	SF(rdma_cm_id, qp),
	SF(rdma_cm_id, route),
	SF(rdma_cm_id, ps),
	SF(rdma_cm_id, port_num),
	SF(rdma_cm_id, event),
	SF(rdma_cm_id, send_cq_channel),
	SF(rdma_cm_id, send_cq),
	SF(rdma_cm_id, recv_cq_channel),
	SF(rdma_cm_id, recv_cq),
	SF(rdma_cm_id, srq),
	SF(rdma_cm_id, pd),
	SF(rdma_cm_id, qp_type),

	S(rdma_route),
	SF(rdma_route, addr),
	SF(rdma_route, path_rec),
	SF(rdma_route, num_paths),

	S(rdma_addr),
	SF(rdma_addr, src_addr),
	SF(rdma_addr, src_sin),
	SF(rdma_addr, src_sin6),
	SF(rdma_addr, src_storage),
	SF(rdma_addr, dst_addr),
	SF(rdma_addr, dst_sin),
	SF(rdma_addr, dst_sin6),
	SF(rdma_addr, dst_storage),
	SF(rdma_addr, addr),
	SF(rdma_addr, addr.ibaddr),

	S(rdma_ib_addr),
	SF(rdma_ib_addr, sgid),
	SF(rdma_ib_addr, dgid),
	SF(rdma_ib_addr, pkey),

	/* <infiniband/verbs.h> */
	TYPE(union, ibv_gid),
	FIELD(union, ibv_gid, raw),
	FIELD(union, ibv_gid, global),
	FIELD(union, ibv_gid, global.subnet_prefix),
	FIELD(union, ibv_gid, global.interface_id),

	S(ibv_global_route),
	SF(ibv_global_route, dgid),
	SF(ibv_global_route, flow_label),
	SF(ibv_global_route, sgid_index),
	SF(ibv_global_route, hop_limit),
	SF(ibv_global_route, traffic_class),

	S(ibv_ah_attr),
	SF(ibv_ah_attr, grh),
	SF(ibv_ah_attr, dlid),
	SF(ibv_ah_attr, sl),
	SF(ibv_ah_attr, src_path_bits),
	SF(ibv_ah_attr, static_rate),
	SF(ibv_ah_attr, is_global),
	SF(ibv_ah_attr, port_num),

	S(ibv_wc),
	SF(ibv_wc, wr_id),
	SF(ibv_wc, status),
	SF(ibv_wc, opcode),
	SF(ibv_wc, vendor_err),
	SF(ibv_wc, byte_len),
	SF(ibv_wc, imm_data),
	SF(ibv_wc, invalidated_rkey),
	SF(ibv_wc, qp_num),
	SF(ibv_wc, src_qp),
	SF(ibv_wc, wc_flags),
	SF(ibv_wc, pkey_index),
	SF(ibv_wc, slid),
	SF(ibv_wc, sl),
	SF(ibv_wc, dlid_path_bits),

	S(ibv_async_event),
	SF(ibv_async_event, element),
	SF(ibv_async_event, element.cq),
	SF(ibv_async_event, element.qp),
	SF(ibv_async_event, element.srq),
	SF(ibv_async_event, element.wq),
	SF(ibv_async_event, element.port_num),
	SF(ibv_async_event, event_type),

	S(ibv_gid_entry),
	SF(ibv_gid_entry, gid),
	SF(ibv_gid_entry, gid_index),
	SF(ibv_gid_entry, port_num),
	SF(ibv_gid_entry, gid_type),
	SF(ibv_gid_entry, ndev_ifindex),

	S(ibv_pd),
	SF(ibv_pd, context),
	SF(ibv_pd, handle),

	S(ibv_mr),
	SF(ibv_mr, context),
	SF(ibv_mr, pd),
	SF(ibv_mr, addr),
	SF(ibv_mr, length),
	SF(ibv_mr, handle),
	SF(ibv_mr, lkey),
	SF(ibv_mr, rkey),

	S(ibv_comp_channel),
	SF(ibv_comp_channel, context),
	SF(ibv_comp_channel, fd),
	SF(ibv_comp_channel, refcnt),

	S(ibv_cq),
	SF(ibv_cq, context),
	SF(ibv_cq, channel),
	SF(ibv_cq, cq_context),
	SF(ibv_cq, handle),
	SF(ibv_cq, cqe),
	SF(ibv_cq, mutex),
	SF(ibv_cq, cond),
	SF(ibv_cq, comp_events_completed),
	SF(ibv_cq, async_events_completed),

	S(ibv_qp),
	SF(ibv_qp, context),
	SF(ibv_qp, qp_context),
	SF(ibv_qp, pd),
	SF(ibv_qp, send_cq),
	SF(ibv_qp, recv_cq),
	SF(ibv_qp, srq),
	SF(ibv_qp, handle),
	SF(ibv_qp, qp_num),
	SF(ibv_qp, state),
	SF(ibv_qp, qp_type),
	SF(ibv_qp, mutex),
	SF(ibv_qp, cond),
	SF(ibv_qp, events_completed),

	S(ibv_qp_cap),
	SF(ibv_qp_cap, max_send_wr),
	SF(ibv_qp_cap, max_recv_wr),
	SF(ibv_qp_cap, max_send_sge),
	SF(ibv_qp_cap, max_recv_sge),
	SF(ibv_qp_cap, max_inline_data),

	S(ibv_qp_init_attr),
	SF(ibv_qp_init_attr, qp_context),
	SF(ibv_qp_init_attr, send_cq),
	SF(ibv_qp_init_attr, recv_cq),
	SF(ibv_qp_init_attr, srq),
	SF(ibv_qp_init_attr, cap),
	SF(ibv_qp_init_attr, qp_type),
	SF(ibv_qp_init_attr, sq_sig_all),

	S(ibv_sge),
	SF(ibv_sge, addr),
	SF(ibv_sge, length),
	SF(ibv_sge, lkey),

	S(ibv_recv_wr),
	SF(ibv_recv_wr, wr_id),
	SF(ibv_recv_wr, next),
	SF(ibv_recv_wr, sg_list),
	SF(ibv_recv_wr, num_sge),

	S(ibv_send_wr),
	SF(ibv_send_wr, wr_id),
	SF(ibv_send_wr, next),
	SF(ibv_send_wr, sg_list),
	SF(ibv_send_wr, num_sge),
	SF(ibv_send_wr, opcode),
	SF(ibv_send_wr, send_flags),
	SF(ibv_send_wr, imm_data),
	SF(ibv_send_wr, invalidate_rkey),
	SF(ibv_send_wr, wr),
	SF(ibv_send_wr, wr.rdma.remote_addr),
	SF(ibv_send_wr, wr.rdma.rkey),
	SF(ibv_send_wr, wr.atomic.remote_addr),
	SF(ibv_send_wr, wr.atomic.compare_add),
	SF(ibv_send_wr, wr.atomic.swap),
	SF(ibv_send_wr, wr.atomic.rkey),
	SF(ibv_send_wr, wr.ud.ah),
	SF(ibv_send_wr, wr.ud.remote_qpn),
	SF(ibv_send_wr, wr.ud.remote_qkey),
	SF(ibv_send_wr, qp_type.xrc.remote_srqn),
	SF(ibv_send_wr, bind_mw.mw),
	SF(ibv_send_wr, bind_mw.rkey),
	SF(ibv_send_wr, bind_mw.bind_info),
	SF(ibv_send_wr, tso.hdr),
	SF(ibv_send_wr, tso.hdr_sz),
	SF(ibv_send_wr, tso.mss),

	S(ibv_mw_bind_info),
	SF(ibv_mw_bind_info, mr),
	SF(ibv_mw_bind_info, addr),
	SF(ibv_mw_bind_info, length),
	SF(ibv_mw_bind_info, mw_access_flags),

	S(ibv_context),
	SF(ibv_context, device),
	SF(ibv_context, ops),
	SF(ibv_context, cmd_fd),
	SF(ibv_context, async_fd),
	SF(ibv_context, num_comp_vectors),
	SF(ibv_context, mutex),
	SF(ibv_context, abi_compat),

	S(ibv_port_attr),
	SF(ibv_port_attr, state),
	SF(ibv_port_attr, max_mtu),
	SF(ibv_port_attr, active_mtu),
	SF(ibv_port_attr, gid_tbl_len),
	SF(ibv_port_attr, port_cap_flags),
	SF(ibv_port_attr, max_msg_sz),
	SF(ibv_port_attr, bad_pkey_cntr),
	SF(ibv_port_attr, qkey_viol_cntr),
	SF(ibv_port_attr, pkey_tbl_len),
	SF(ibv_port_attr, lid),
	SF(ibv_port_attr, sm_lid),
	SF(ibv_port_attr, lmc),
	SF(ibv_port_attr, max_vl_num),
	SF(ibv_port_attr, sm_sl),
	SF(ibv_port_attr, subnet_timeout),
	SF(ibv_port_attr, init_type_reply),
	SF(ibv_port_attr, active_width),
	SF(ibv_port_attr, active_speed),
	SF(ibv_port_attr, phys_state),
	SF(ibv_port_attr, link_layer),
	SF(ibv_port_attr, flags),
	SF(ibv_port_attr, port_cap_flags2),

	S(ibv_device_attr),

	/* Enums stored in the structs above (C leaves their size to the compiler). */
	TYPE(enum, rdma_cm_event_type),
	TYPE(enum, rdma_port_space),
	TYPE(enum, ibv_event_type),
	TYPE(enum, ibv_wc_status),
	TYPE(enum, ibv_wc_opcode),
	TYPE(enum, ibv_wr_opcode),
	TYPE(enum, ibv_qp_type),
	TYPE(enum, ibv_qp_state),
	TYPE(enum, ibv_port_state),
	TYPE(enum, ibv_mtu),
};

const struct evchan_layout_entry *evchan_layout_entries(void)
{
	return evchan_layout;
}

size_t evchan_layout_len(void)
{
	return sizeof(evchan_layout) / sizeof(evchan_layout[0]);
}
