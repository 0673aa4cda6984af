/*
 * What a UD receive finds in front of its payload, and what its completion
 * says: two of these programs in two namespaces send each other datagrams
 * from a normal UD QP (number 0x11 in each process: the test sets
 * XROCE_QPN_OFFSET=0) until each heard the
 * other, and print for the first datagram received its 40-byte GRH area
 * in hex, the completion's sl, wc_flags, byte_len and src_qp. The test
 * (tests/tests/verbs_ud_grh.rs) checks them against RoCEv2 over IPv4:
 * 20 zero bytes and the IPv4 header as received; sl & 7 == 2 (mlx5's
 * packet type, which UCX 1.13's UD transport reads).
 *
 * Usage (under `xroce run --iface IF`): ud_grh_probe SELF_IPV4 PEER_IPV4
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define QKEY 0x11111111u
#define GRH_LEN 40
#define PAYLOAD "ud grh probe...."
#define PAYLOAD_LEN 16
#define SLOTS 16
#define SLOT 256

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	struct in_addr peer;
	if (argc != 3 || inet_pton(AF_INET, argv[2], &peer) != 1) {
		printf("usage 1\n");
		return 2;
	}
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = ctx ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	static unsigned char buf[(SLOTS + 1) * SLOT];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_UD;
	ia.cap.max_send_wr = 8;
	ia.cap.max_recv_wr = SLOTS;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	struct ibv_qp *qp = mr ? ibv_create_qp(pd, &ia) : NULL;
	if (!qp) {
		printf("setup_failed %d\n", errno);
		return 1;
	}
	printf("qpn %#x\n", qp->qp_num);
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.qkey = QKEY;
	a.port_num = 1;
	int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	a.qp_state = IBV_QPS_RTR;
	rc = rc ? rc : ibv_modify_qp(qp, &a, IBV_QP_STATE);
	a.qp_state = IBV_QPS_RTS;
	rc = rc ? rc : ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	printf("up %d\n", rc);
	for (int i = 0; i < SLOTS; i++) {
		/* Not zeroed by us: the GRH area must be written whole. */
		memset(buf + i * SLOT, 0xee, SLOT);
		struct ibv_sge sge = {.addr = (uintptr_t)(buf + i * SLOT), .length = SLOT, .lkey = mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
		if (ibv_post_recv(qp, &wr, &bad)) {
			printf("post_recv_failed %d\n", i);
			return 1;
		}
	}
	/* The peer's RoCEv2 GID (its IPv4-mapped address), hop limit 1 as
	 * ibv_ud_pingpong's AH. */
	struct ibv_ah_attr aa;
	memset(&aa, 0, sizeof(aa));
	aa.is_global = 1;
	aa.port_num = 1;
	aa.grh.dgid.raw[10] = 0xff;
	aa.grh.dgid.raw[11] = 0xff;
	memcpy(&aa.grh.dgid.raw[12], &peer.s_addr, 4);
	aa.grh.sgid_index = 1;
	aa.grh.hop_limit = 1;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah) {
		printf("ah_failed %d\n", errno);
		return 1;
	}
	unsigned char *out = buf + SLOTS * SLOT;
	memcpy(out, PAYLOAD, PAYLOAD_LEN);
	int outstanding = 0, sent = 0, send_errors = 0, received = 0;
	double start = now_s(), heard = 0, last_send = 0;
	while (now_s() - start < 20 && !(heard > 0 && now_s() - heard > 0.5)) {
		if (outstanding < 4 && now_s() - last_send > 0.02) {
			struct ibv_sge sge = {.addr = (uintptr_t)out, .length = PAYLOAD_LEN, .lkey = mr->lkey};
			struct ibv_send_wr wr, *bad;
			memset(&wr, 0, sizeof(wr));
			wr.wr_id = 1000 + sent;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			wr.opcode = IBV_WR_SEND;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.wr.ud.ah = ah;
			wr.wr.ud.remote_qpn = 0x11;
			wr.wr.ud.remote_qkey = QKEY;
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
			if (received++ == 0) {
				heard = now_s();
				printf("status %d\n", wc[i].status);
				printf("grh ");
				for (int j = 0; j < GRH_LEN; j++)
					printf("%02x", slot[j]);
				printf("\n");
				printf("sl %u\n", wc[i].sl);
				printf("grh_flag %d\n", !!(wc[i].wc_flags & IBV_WC_GRH));
				printf("byte_len %u\n", wc[i].byte_len);
				printf("src_qp %#x\n", wc[i].src_qp);
				printf("payload_intact %d\n", memcmp(slot + GRH_LEN, PAYLOAD, PAYLOAD_LEN) == 0);
			}
			struct ibv_sge sge = {.addr = (uintptr_t)slot, .length = SLOT, .lkey = mr->lkey};
			struct ibv_recv_wr rwr = {.wr_id = wc[i].wr_id, .sg_list = &sge, .num_sge = 1}, *bad;
			ibv_post_recv(qp, &rwr, &bad);
		}
	}
	printf("heard %d\n", received > 0);
	printf("send_errors %d\n", send_errors);
	printf("destroy %d\n", ibv_destroy_ah(ah) || ibv_destroy_qp(qp));
	printf("done 1\n");
	return 0;
}
