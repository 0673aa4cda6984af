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
#include "rc_pair.h"
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define LEN (1 << 20)

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
