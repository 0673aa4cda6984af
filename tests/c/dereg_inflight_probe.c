/*
 * ibv_dereg_mr while a peer's RDMA WRITE streams into the region, then
 * munmap at once, as a program may once ibv_dereg_mr has returned: the
 * device must never touch the memory again. Two RC QPs of one device (A
 * writes 1 MiB into B's region); each round deregisters and unmaps the
 * region after another delay, so at another point of the WRITE (or after
 * it, on a fast build). The WRITE completes with IBV_WC_SUCCESS (it
 * was done first) or IBV_WC_REM_ACCESS_ERR (its packets met the
 * deregistered region), nothing else; a write into the unmapped pages
 * would kill the process (SIGSEGV) before it prints `alive`.
 *
 * Usage (under `xroce run --iface IF`): dereg_inflight_probe ROUNDS
 * Prints `rounds N success S access_err E other O timeout T`, then `alive`.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define LEN (1 << 20)

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
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
static int connect_qp(struct ibv_qp *qp, struct ibv_qp *peer, const union ibv_gid *gid)
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

static int post(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, struct ibv_sge *sge, uint64_t raddr,
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
static int wait_wcs(struct ibv_cq *cq, struct ibv_wc *wc, int n)
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

static void drain(struct ibv_cq *cq)
{
	struct ibv_wc wc[16];
	while (ibv_poll_cq(cq, 16, wc) > 0)
		;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	int rounds = argc > 1 ? atoi(argv[1]) : 50;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cqa = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	struct ibv_cq *cqb = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	static unsigned char src[LEN];
	struct ibv_mr *smr = pd ? ibv_reg_mr(pd, src, LEN, IBV_ACCESS_LOCAL_WRITE) : NULL;
	union ibv_gid gid;
	if (!smr || !cqa || !cqb || ibv_query_gid(ctx, 1, 1, &gid)) {
		printf("setup_failed %d\n", errno);
		return 1;
	}
	memset(src, 0x5a, LEN);
	int success = 0, access_err = 0, other = 0, timeout = 0;
	for (int r = 0; r < rounds; r++) {
		struct ibv_qp *a = rc_qp(pd, cqa);
		struct ibv_qp *b = rc_qp(pd, cqb);
		if (!a || !b || connect_qp(a, b, &gid) || connect_qp(b, a, &gid)) {
			printf("connect_failed %d %d\n", r, errno);
			return 1;
		}
		unsigned char *dst = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct ibv_mr *dmr = dst == MAP_FAILED ? NULL
						       : ibv_reg_mr(pd, dst, LEN,
								    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!dmr) {
			printf("reg_failed %d %d\n", r, errno);
			return 1;
		}
		struct ibv_sge sge = {.addr = (uintptr_t)src, .length = LEN, .lkey = smr->lkey};
		if (post(a, r, IBV_WR_RDMA_WRITE, &sge, (uintptr_t)dst, dmr->rkey, 0)) {
			printf("post_failed %d %d\n", r, errno);
			return 1;
		}
		/* 0 to 3.5 ms into the 1024 packets. */
		usleep((r % 8) * 500);
		int d = ibv_dereg_mr(dmr);
		int u = munmap(dst, LEN);
		if (d || u) {
			printf("dereg_failed %d %d %d\n", r, d, u);
			return 1;
		}
		struct ibv_wc wc;
		if (wait_wcs(cqa, &wc, 1) != 1)
			timeout++;
		else if (wc.status == IBV_WC_SUCCESS)
			success++;
		else if (wc.status == IBV_WC_REM_ACCESS_ERR)
			access_err++;
		else {
			other++;
			printf("status %d %d\n", r, wc.status);
		}
		ibv_destroy_qp(a);
		ibv_destroy_qp(b);
		drain(cqa);
		drain(cqb);
	}
	printf("rounds %d success %d access_err %d other %d timeout %d\n", rounds, success, access_err, other,
	       timeout);
	printf("alive\n");
	return 0;
}
