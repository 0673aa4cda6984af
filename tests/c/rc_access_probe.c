/*
 * Zero-length RDMA operations and access errors through the verbs API, as
 * UCX and IBTA/rxe expect them: two RC QPs of one device connected to each
 * other (A requester, B responder). Prints `key value...` lines; the test
 * (tests/tests/verbs_rc_access.rs) compares them with what must hold.
 *
 *  1. UCX's flush: a zero-length inline RDMA WRITE without SGEs to
 *     remote_addr 0 with rkey 0, a zero-length READ likewise and a zero-length WRITE with
 *     immediate: all succeed (IBTA C9-88), B gets RECV_RDMA_WITH_IMM with
 *     byte_len 0.
 *  2. A 64-byte WRITE with a bad rkey: REM_ACCESS_ERR at A, the next WR
 *     flushed, both QPs in ERR; B's async fd has IBV_EVENT_QP_ACCESS_ERR
 *     for B, and no event comes for A.
 *
 * Usage (under `xroce run --iface IF`): rc_access_probe
 */
#include <errno.h>
#include "rc_pair.h"
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static enum ibv_qp_state state_of(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &i))
		return -1;
	return a.qp_state;
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cqa = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	struct ibv_cq *cqb = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	static unsigned char buf[8192];
	struct ibv_mr *mr =
		pd ? ibv_reg_mr(pd, buf, sizeof(buf),
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
		   : NULL;
	struct ibv_qp *a = mr ? rc_qp(pd, cqa) : NULL;
	struct ibv_qp *b = mr ? rc_qp(pd, cqb) : NULL;
	union ibv_gid gid;
	if (!a || !b || ibv_query_gid(ctx, 1, 1, &gid)) {
		printf("setup_failed %d\n", errno);
		return 1;
	}
	int ca = connect_qp(a, b, &gid);
	int cb = connect_qp(b, a, &gid);
	printf("connect %d %d\n", ca, cb);
	struct ibv_sge rsge = {.addr = (uintptr_t)(buf + 4096), .length = 64, .lkey = mr->lkey};
	for (int i = 0; i < 2; i++) {
		struct ibv_recv_wr rwr = {.wr_id = 50 + i, .sg_list = &rsge, .num_sge = 1}, *bad;
		if (ibv_post_recv(b, &rwr, &bad))
			printf("post_recv_failed %d\n", i);
	}

	/* 1. Zero-length operations naming no memory. */
	/* (Posted one by one: the order of a call's arguments is unspecified.) */
	/* WR 1 exactly as uct_rc_verbs_ep_post_flush (UCX 1.13): INLINE, no SGE. */
	int z1 = post(a, 1, IBV_WR_RDMA_WRITE, NULL, 0, 0, IBV_SEND_INLINE);
	int z2 = post(a, 2, IBV_WR_RDMA_READ, NULL, 0, 0, 0);
	int z3 = post(a, 3, IBV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, 0);
	printf("post_zero %d %d %d\n", z1, z2, z3);
	struct ibv_wc wc[8];
	int got = wait_wcs(cqa, wc, 3);
	printf("zero_wcs %d", got);
	for (int i = 0; i < got; i++)
		printf(" %llu:%d", (unsigned long long)wc[i].wr_id, wc[i].status);
	printf("\n");
	got = wait_wcs(cqb, wc, 1);
	if (got == 1)
		printf("zero_recv %llu %d %d %u %#x\n", (unsigned long long)wc[0].wr_id, wc[0].status, wc[0].opcode,
		       wc[0].byte_len, be32toh(wc[0].imm_data));
	else
		printf("zero_recv none\n");
	printf("states_after_zero %d %d\n", state_of(a), state_of(b));

	/* 2. A bad rkey. */
	struct ibv_sge ssge = {.addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey};
	int b1 = post(a, 4, IBV_WR_RDMA_WRITE, &ssge, (uintptr_t)(buf + 1024), mr->rkey ^ 0x5a5a00, 0);
	int b2 = post(a, 5, IBV_WR_RDMA_WRITE, &ssge, (uintptr_t)(buf + 1024), mr->rkey, 0);
	printf("post_bad %d %d\n", b1, b2);
	got = wait_wcs(cqa, wc, 2);
	printf("bad_wcs %d", got);
	for (int i = 0; i < got; i++)
		printf(" %llu:%d", (unsigned long long)wc[i].wr_id, wc[i].status);
	printf("\n");
	/* B's remaining receive is flushed once B is in ERR. */
	got = wait_wcs(cqb, wc, 1);
	printf("b_flushed %d %s\n", got, got == 1 && wc[0].status == IBV_WC_WR_FLUSH_ERR ? "yes" : "no");
	struct pollfd p = {.fd = ctx->async_fd, .events = POLLIN};
	struct ibv_async_event ev;
	int events = 0;
	while (poll(&p, 1, events == 0 ? 5000 : 300) == 1 && ibv_get_async_event(ctx, &ev) == 0) {
		const char *who = ev.element.qp == b ? "b" : ev.element.qp == a ? "a" : "other";
		printf("event %d %s\n", ev.event_type, who);
		ibv_ack_async_event(&ev);
		events++;
	}
	printf("events %d\n", events);
	printf("states_after_bad %d %d\n", state_of(a), state_of(b));
	int da = ibv_destroy_qp(a);
	int db = ibv_destroy_qp(b);
	printf("destroy %d %d\n", da, db);
	printf("done 1\n");
	return 0;
}
