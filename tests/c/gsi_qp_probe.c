/*
 * xroce's private libibverbs entry point xroce_create_gsi_qp, used as
 * xroce's librdmacm uses it: found with dlsym(RTLD_DEFAULT, ...), then
 * driven with the ordinary verbs. Prints `key value...` lines; the test
 * (tests/tests/verbs_gsi.rs) compares them with what must hold.
 *
 * Usage (under `xroce run --backend udp --iface IF`):
 *   gsi_qp_probe              create/errno checks and a MAD to its own QP1;
 *   gsi_qp_probe SELF PEER    MADs QP1 -> QP1 with a peer process running
 *                             the same (IPv4 addresses; each side keeps
 *                             sending until 0.5 s after it first heard the
 *                             other, so both hear each other).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
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

/* The MAD side `octet` (last octet of its IPv4 address) sends. */
static void fill_mad(unsigned char *mad, unsigned char octet)
{
	for (int i = 0; i < MAD_LEN; i++)
		mad[i] = (unsigned char)(i * 7 + octet);
}

static int exchange(create_gsi_qp_fn create_gsi_qp, const char *self_ip, const char *peer_ip)
{
	struct in_addr self, peer;
	if (inet_pton(AF_INET, self_ip, &self) != 1 || inet_pton(AF_INET, peer_ip, &peer) != 1) {
		printf("bad_address 1\n");
		return 1;
	}
	unsigned char self_octet = ((unsigned char *)&self.s_addr)[3];
	unsigned char peer_octet = ((unsigned char *)&peer.s_addr)[3];
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	enum { SLOTS = 16, SLOT = 512 };
	static unsigned char buf[(SLOTS + 1) * SLOT];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_qp_init_attr a = init_attr(cq, IBV_QPT_UD);
	a.cap.max_recv_wr = SLOTS;
	struct ibv_qp *qp = mr ? create_gsi_qp(pd, &a) : NULL;
	if (!qp) {
		printf("setup_failed %d\n", errno);
		return 1;
	}
	bring_up(qp);
	for (int i = 0; i < SLOTS; i++) {
		struct ibv_sge sge = {.addr = (uintptr_t)(buf + i * SLOT), .length = GRH_LEN + MAD_LEN, .lkey = mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_recv(qp, &wr, &bad)) {
			printf("post_recv_failed %d\n", i);
			return 1;
		}
	}
	/* The peer's RoCEv2 GID: its IPv4-mapped IPv6 address. */
	struct ibv_ah_attr aa;
	memset(&aa, 0, sizeof(aa));
	aa.is_global = 1;
	aa.port_num = 1;
	aa.grh.dgid.raw[10] = 0xff;
	aa.grh.dgid.raw[11] = 0xff;
	memcpy(&aa.grh.dgid.raw[12], &peer.s_addr, 4);
	aa.grh.sgid_index = 1;
	aa.grh.hop_limit = 64;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah) {
		printf("ah_failed %d\n", errno);
		return 1;
	}
	unsigned char *mad = buf + SLOTS * SLOT;
	fill_mad(mad, self_octet);
	unsigned char want[MAD_LEN];
	fill_mad(want, peer_octet);
	int outstanding = 0, sent = 0, send_errors = 0, received = 0, intact = 0, src_qp_1 = 0, grh = 0,
	    grh_from_peer = 0;
	double start = now_s(), heard = 0, last_send = 0;
	while (now_s() - start < 10 && !(heard > 0 && now_s() - heard > 0.5)) {
		if (outstanding < 4 && now_s() - last_send > 0.02) {
			struct ibv_sge sge = {.addr = (uintptr_t)mad, .length = MAD_LEN, .lkey = mr->lkey};
			struct ibv_send_wr wr, *bad;
			memset(&wr, 0, sizeof(wr));
			wr.wr_id = 1000 + sent;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			wr.opcode = IBV_WR_SEND;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.wr.ud.ah = ah;
			wr.wr.ud.remote_qpn = 1;
			wr.wr.ud.remote_qkey = GSI_QKEY;
			if (ibv_post_send(qp, &wr, &bad) == 0) {
				outstanding++;
				sent++;
			}
			last_send = now_s();
		}
		struct ibv_wc wc[8];
		int k = ibv_poll_cq(cq, 8, wc);
		for (int i = 0; i < k; i++) {
			if (wc[i].opcode == IBV_WC_SEND) {
				outstanding--;
				send_errors += wc[i].status != IBV_WC_SUCCESS;
				continue;
			}
			unsigned char *slot = buf + wc[i].wr_id * SLOT;
			received++;
			if (heard == 0)
				heard = now_s();
			intact += wc[i].status == IBV_WC_SUCCESS && wc[i].byte_len == GRH_LEN + MAD_LEN &&
				  memcmp(slot + GRH_LEN, want, MAD_LEN) == 0;
			src_qp_1 += wc[i].src_qp == 1;
			grh += !!(wc[i].wc_flags & IBV_WC_GRH);
			/* RoCEv2 over IPv4: the IPv4 header in the GRH's last 20 bytes. */
			grh_from_peer += memcmp(slot + 20 + 12, &peer.s_addr, 4) == 0;
			struct ibv_sge sge = {.addr = (uintptr_t)slot, .length = GRH_LEN + MAD_LEN, .lkey = mr->lkey};
			struct ibv_recv_wr rwr = {.wr_id = wc[i].wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
			ibv_post_recv(qp, &rwr, &bad);
		}
	}
	printf("sent_some %d\n", sent > 0);
	printf("send_errors %d\n", send_errors);
	printf("heard %d\n", received > 0);
	printf("all_intact %d\n", received > 0 && intact == received);
	printf("all_from_qp1 %d\n", received > 0 && src_qp_1 == received);
	printf("all_grh %d\n", received > 0 && grh == received && grh_from_peer == received);
	printf("destroy_ah %d\n", ibv_destroy_ah(ah));
	printf("destroy %d\n", ibv_destroy_qp(qp));
	printf("done 1\n");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	create_gsi_qp_fn create_gsi_qp = (create_gsi_qp_fn)dlsym(RTLD_DEFAULT, "xroce_create_gsi_qp");
	printf("dlsym %d\n", create_gsi_qp != NULL);
	if (!create_gsi_qp)
		return 1;
	if (argc == 3)
		return exchange(create_gsi_qp, argv[1], argv[2]);
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
