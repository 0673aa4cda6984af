/*
 * What the C probes that connect two RC QPs of one device share
 * (rc_access_probe.c, dereg_inflight_probe.c): a clock, QP creation, the
 * RESET -> RTS walk towards a peer QP, posting one WR, and polling.
 */
#ifndef XROCE_RC_PAIR_H
#define XROCE_RC_PAIR_H

#include <endian.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static inline double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static inline struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 16;
	a.cap.max_recv_wr = 16;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	return ibv_create_qp(pd, &a);
}

/* RESET -> INIT -> RTR -> RTS towards `peer` on this device (GID 1). */
static inline int connect_qp(struct ibv_qp *qp, struct ibv_qp *peer, const union ibv_gid *gid)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		return 1;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp_num;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return 2;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		return 3;
	return 0;
}

static inline int post(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, struct ibv_sge *sge, uint64_t raddr,
		uint32_t rkey, unsigned flags)
{
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = id;
	wr.opcode = op;
	wr.sg_list = sge;
	wr.num_sge = sge ? 1 : 0;
	wr.send_flags = IBV_SEND_SIGNALED | flags;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	wr.imm_data = htobe32(0x01020304);
	return ibv_post_send(qp, &wr, &bad);
}

/* Poll until `n` completions (or 10 s); returns how many. */
static inline int wait_wcs(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	int got = 0;
	double end = now_s() + 10;
	while (got < n && now_s() < end) {
		int k = ibv_poll_cq(cq, n - got, wc + got);
		if (k < 0)
			break;
		got += k;
	}
	return got;
}

#endif
