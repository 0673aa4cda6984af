/*
 * Double destroys and uses after destroy, under XROCE_VERBS_DEBUG: each
 * such call must fail with EINVAL (as a return value, or -1 with errno
 * EINVAL where the verb reports so) and the library must name the call on
 * stderr, instead of touching freed memory (undefined behaviour in
 * rdma-core, and without the debug mode here). Prints `key value` lines;
 * the test (tests/tests/verbs_handles.rs) compares them and stderr.
 *
 * Usage (under `xroce run --iface IF`, XROCE_VERBS_DEBUG=1): handle_misuse_probe
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = list && n > 0 ? ibv_open_device(list[0]) : NULL;
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = ctx ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	static char buf[4096];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 4;
	qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	struct ibv_qp *qp = mr ? ibv_create_qp(pd, &qa) : NULL;
	if (!qp) {
		printf("setup_failed %d\n", errno);
		return 1;
	}

	/* A QP: destroyed, then destroyed, posted to and queried again. */
	printf("destroy_qp %d\n", ibv_destroy_qp(qp));
	printf("destroy_qp_again %d\n", ibv_destroy_qp(qp));
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	printf("post_send_dead %d\n", ibv_post_send(qp, &wr, &bad));
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	printf("query_qp_dead %d\n", ibv_query_qp(qp, &attr, IBV_QP_STATE, &init));

	/* A CQ: destroyed, then polled, armed and destroyed again. */
	printf("destroy_cq %d\n", ibv_destroy_cq(cq));
	struct ibv_wc wc;
	errno = 0;
	int polled = ibv_poll_cq(cq, 1, &wc);
	printf("poll_cq_dead %d %d\n", polled, polled < 0 ? errno : 0);
	printf("req_notify_dead %d\n", ibv_req_notify_cq(cq, 0));
	printf("destroy_cq_again %d\n", ibv_destroy_cq(cq));

	/* An MR and a PD, each destroyed twice. */
	printf("dereg_mr %d\n", ibv_dereg_mr(mr));
	printf("dereg_mr_again %d\n", ibv_dereg_mr(mr));
	printf("dealloc_pd %d\n", ibv_dealloc_pd(pd));
	printf("dealloc_pd_again %d\n", ibv_dealloc_pd(pd));

	/* Live objects still work after all that. */
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	printf("alloc_pd_after %d\n", pd2 ? 0 : errno);
	printf("dealloc_pd_after %d\n", pd2 ? ibv_dealloc_pd(pd2) : -1);
	printf("close_device %d\n", ibv_close_device(ctx));
	ibv_free_device_list(list);
	printf("done\n");
	return 0;
}
