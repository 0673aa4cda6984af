/*
 * xroce's private libibverbs entry point xroce_create_gsi_qp, used as
 * xroce's librdmacm uses it: found with dlsym(RTLD_DEFAULT, ...), then
 * driven with the ordinary verbs. Prints `key value...` lines; the test
 * (tests/tests/verbs_gsi.rs) compares them with what must hold.
 *
 * Usage: gsi_qp_probe (under `xroce run --backend udp --iface IF`).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define GSI_QKEY 0x80010000u
#define MAD_LEN 256
#define GRH_LEN 40

typedef struct ibv_qp *(*create_gsi_qp_fn)(struct ibv_pd *, struct ibv_qp_init_attr *);

static struct ibv_qp_init_attr init_attr(struct ibv_cq *cq, enum ibv_qp_type type)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = type;
	a.cap.max_send_wr = 8;
	a.cap.max_recv_wr = 8;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	return a;
}

/* RESET -> INIT (Q_Key, P_Key index 0, port 1) -> RTR -> RTS, as ib_mad. */
static void bring_up(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.qkey = GSI_QKEY;
	a.pkey_index = 0;
	a.port_num = 1;
	printf("init %d\n", ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
	a.qp_state = IBV_QPS_RTR;
	printf("rtr %d\n", ibv_modify_qp(qp, &a, IBV_QP_STATE));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	printf("rts %d\n", ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN));
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	create_gsi_qp_fn create_gsi_qp = (create_gsi_qp_fn)dlsym(RTLD_DEFAULT, "xroce_create_gsi_qp");
	printf("dlsym %d\n", create_gsi_qp != NULL);
	if (!create_gsi_qp)
		return 1;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		printf("devices 0\n");
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = ctx ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	static unsigned char buf[4096];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!mr) {
		printf("setup failed %d\n", errno);
		return 1;
	}

	/* Not UD: EINVAL. */
	struct ibv_qp_init_attr a = init_attr(cq, IBV_QPT_RC);
	errno = 0;
	struct ibv_qp *bad = create_gsi_qp(pd, &a);
	printf("create_rc %d %d\n", bad == NULL ? -1 : 0, errno);

	a = init_attr(cq, IBV_QPT_UD);
	struct ibv_qp *qp = create_gsi_qp(pd, &a);
	if (!qp) {
		printf("create %d\n", errno);
		return 1;
	}
	printf("qp %u %d %d\n", qp->qp_num, qp->state, qp->qp_type);
	/* One per device: EEXIST. */
	errno = 0;
	struct ibv_qp *second = create_gsi_qp(pd, &a);
	printf("create_second %d %d\n", second == NULL ? -1 : 0, errno);
	/* Normal QPs keep their numbers. */
	struct ibv_qp *ud = ibv_create_qp(pd, &a);
	printf("normal_ud %#x\n", ud ? ud->qp_num : 0);

	bring_up(qp);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	printf("query %d\n", ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_QKEY, &qi));
	printf("state_qkey %d %#x\n", qa.qp_state, qa.qkey);

	/* A MAD from QP1 to this device's own QP1. */
	struct ibv_sge rsge = {.addr = (uintptr_t)buf, .length = GRH_LEN + MAD_LEN, .lkey = mr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 7, .sg_list = &rsge, .num_sge = 1}, *bad_rwr;
	printf("post_recv %d\n", ibv_post_recv(qp, &rwr, &bad_rwr));
	union ibv_gid gid;
	printf("query_gid %d\n", ibv_query_gid(ctx, 1, 1, &gid));
	struct ibv_ah_attr aa;
	memset(&aa, 0, sizeof(aa));
	aa.is_global = 1;
	aa.port_num = 1;
	aa.grh.dgid = gid;
	aa.grh.sgid_index = 1;
	aa.grh.hop_limit = 64;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	printf("ah %d\n", ah != NULL);
	unsigned char *mad = buf + 1024;
	for (int i = 0; i < MAD_LEN; i++)
		mad[i] = (unsigned char)(i * 7 + 3);
	struct ibv_sge ssge = {.addr = (uintptr_t)mad, .length = MAD_LEN, .lkey = mr->lkey};
	struct ibv_send_wr swr, *bad_swr;
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = 9;
	swr.sg_list = &ssge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	swr.wr.ud.ah = ah;
	swr.wr.ud.remote_qpn = 1;
	swr.wr.ud.remote_qkey = GSI_QKEY;
	printf("post_send %d\n", ibv_post_send(qp, &swr, &bad_swr));
	int got = 0;
	struct ibv_wc wc[2];
	double deadline = now_s() + 5;
	while (got < 2 && now_s() < deadline) {
		int k = ibv_poll_cq(cq, 2 - got, wc + got);
		if (k < 0)
			break;
		got += k;
	}
	printf("completions %d\n", got);
	for (int i = 0; i < got; i++) {
		if (wc[i].opcode == IBV_WC_SEND)
			printf("send_wc %llu %d %u\n", (unsigned long long)wc[i].wr_id, wc[i].status, wc[i].qp_num);
		else
			printf("recv_wc %llu %d %u %u %u %d\n", (unsigned long long)wc[i].wr_id, wc[i].status,
			       wc[i].qp_num, wc[i].src_qp, wc[i].byte_len, !!(wc[i].wc_flags & IBV_WC_GRH));
	}
	printf("mad_intact %d\n", memcmp(buf + GRH_LEN, mad, MAD_LEN) == 0);

	printf("destroy_ah %d\n", ibv_destroy_ah(ah));
	printf("destroy %d\n", ibv_destroy_qp(qp));
	struct ibv_qp *again = create_gsi_qp(pd, &a);
	printf("again %u\n", again ? again->qp_num : 0);
	printf("destroy_again %d\n", again ? ibv_destroy_qp(again) : -1);
	printf("destroy_ud %d\n", ud ? ibv_destroy_qp(ud) : -1);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("done 1\n");
	return 0;
}
