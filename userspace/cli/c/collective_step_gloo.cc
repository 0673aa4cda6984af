// The training-step model of `xroce experiment collective --library gloo`
// (userspace/cli/src/experiment/collective/): a compute gap, then Gloo's
// ring allreduce of floats, repeated; every element of every result
// checked. The Gloo counterpart of collective_step.c: the same schedule,
// the same CSV.
//
// usage: collective_step_gloo TRANSPORT DEVICE RANK RANKS STORE SIZES ITERS
//                             WARMUP SCHEDULE OUT
//
//   TRANSPORT  ibverbs (Gloo's ibverbs transport: DEVICE is the verbs
//              device, port 1, GID index 1, RoCEv2 over IPv4) or tcp
//              (Gloo's TCP transport: DEVICE is the address to bind)
//   RANK       this rank, 0..RANKS-1
//   STORE      a folder every rank shares: Gloo's FileStore, where the
//              ranks meet, and where they hand rank 0 their timings
//   SIZES      comma list of sizes in bytes (the allreduce buffer, as
//              nccl-tests counts it; rounded down to whole floats)
//   ITERS      timed iterations per size
//   WARMUP     untimed iterations before them (the first one after
//              connecting brings the ranks together)
//   SCHEDULE   CSV `iter,rank,gap_us`: each rank's compute gap in each
//              timed iteration (the experiment draws it from its seed)
//   OUT        rank 0 writes OUT (CSV `op,bytes,iter,rank,gap_s,coll_s`,
//              one row per rank and timed iteration) and OUT.progress (a
//              line per iteration, as it goes)
//
// Times come from CLOCK_MONOTONIC (steady_clock): gap_s is the time a rank
// spent between two allreduces (the sleep, filling, checking), coll_s the
// time inside run(). A wrong element exits 2 with `collective_step: CHECK
// FAILED ...` on stderr. At the end rank 0 prints `collective_step: ok: R
// ranks, C results checked` (C summed over the ranks). Each rank first
// says on stderr how the drop-in recovers loss (its
// XROCE_SELECTIVE_REPEAT, or `unset`).
//
// Teardown (as tests/c/gloo_collectives.cc found with Gloo 2022's ibverbs
// transport): a collective is destroyed only once every send it posted has
// completed (Gloo's Buffer destructor aborts otherwise), and Gloo's device
// thread is stopped before the context goes (it may still re-post a
// receive on a pair being destroyed). Before any rank tears down, every
// rank has said through the store that its sends completed, so no rank
// destroys a queue pair a peer still waits on for an acknowledgement.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gloo/allreduce_ring.h"
#include "gloo/barrier_all_to_all.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/ibverbs/buffer.h"
#include "gloo/transport/ibverbs/device.h"
#include "gloo/transport/tcp/device.h"

namespace {

using Clock = std::chrono::steady_clock;
using gloo::transport::Buffer;

int rank = 0;
int nranks = 1;
bool ibverbs = true;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "collective_step: rank %d: %s\n", rank, what.c_str());
  std::exit(1);
}

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch())
      .count();
}

// Gloo's count of sends of an ibverbs buffer whose completion it has not
// handled yet (a protected member, reached as a subclass may).
struct PendingSends : gloo::transport::ibverbs::Buffer {
  static int of(gloo::transport::Buffer* b) {
    auto* ib = dynamic_cast<gloo::transport::ibverbs::Buffer*>(b);
    if (ib == nullptr) {
      die("not an ibverbs buffer");
    }
    return (ib->*(&PendingSends::sendPending_)).load();
  }
};

// Stops Gloo's completion thread of an ibverbs device (protected members,
// reached as a subclass may): every event it read has been handled once
// this returns.
struct DeviceLoop : gloo::transport::ibverbs::Device {
  static void stop(gloo::transport::Device* d) {
    auto* ib = dynamic_cast<gloo::transport::ibverbs::Device*>(d);
    if (ib == nullptr) {
      die("not an ibverbs device");
    }
    (ib->*(&DeviceLoop::done_)).store(true);
    (ib->*(&DeviceLoop::loop_))->join();
  }
};

// Waits until no buffer in `bufs` has a send whose completion Gloo has not
// handled (ibverbs only; 60 s at most: then a completion was lost).
void drain(const char* what, const std::vector<Buffer*>& bufs) {
  if (!ibverbs) {
    return;
  }
  const auto start = Clock::now();
  for (;;) {
    int pending = 0;
    for (auto* b : bufs) {
      if (b != nullptr) {
        pending += PendingSends::of(b);
      }
    }
    if (pending == 0) {
      return;
    }
    if (Clock::now() - start > std::chrono::seconds(60)) {
      die(std::string(what) + ": " + std::to_string(pending) +
          " send completion(s) still missing after 60 s");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

struct Ring : gloo::AllreduceRing<float> {
  using gloo::AllreduceRing<float>::AllreduceRing;
  ~Ring() override {
    drain("ring allreduce", {sendDataBuf_.get(), sendNotificationBuf_.get()});
  }
};

struct Barrier : gloo::BarrierAllToAll {
  using gloo::BarrierAllToAll::BarrierAllToAll;
  ~Barrier() override {
    std::vector<Buffer*> bufs;
    for (auto& b : sendBuffers_) {
      bufs.push_back(b.get());
    }
    drain("barrier", bufs);
  }
};

// Rank r's element i in iteration `iter`: distinct per rank, element and
// iteration, and small integers, so every partial sum of floats is exact.
float value(int r, size_t i, int iter) {
  return static_cast<float>((r + 1) * 4096 + static_cast<int>(i % 1021) +
                            iter % 509);
}

float sum(size_t i, int iter) {
  float s = 0;
  for (int r = 0; r < nranks; r++) {
    s += value(r, i, iter);
  }
  return s;
}

// This rank's gap (us) in each of `iters` iterations, from SCHEDULE.
std::vector<long> read_schedule(const std::string& path, int iters) {
  std::vector<long> gaps(iters, 0);
  std::vector<bool> seen(iters, false);
  std::ifstream f(path);
  if (!f) {
    die("cannot read the schedule " + path);
  }
  std::string line;
  while (std::getline(f, line)) {
    int it = 0, r = 0;
    long gap = 0;
    if (std::sscanf(line.c_str(), "%d,%d,%ld", &it, &r, &gap) == 3 &&
        r == rank && it >= 0 && it < iters) {
      gaps[it] = gap;
      seen[it] = true;
    }
  }
  if (std::find(seen.begin(), seen.end(), false) != seen.end()) {
    die("the schedule has no gap for an iteration of this rank");
  }
  return gaps;
}

std::vector<char> bytes_of(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  return std::vector<char>(c, c + n);
}

// The store's value of `key` once some rank set it (the experiment kills
// a job that stalls, so the wait here is long).
std::vector<char> await(gloo::rendezvous::Store& store,
                        const std::string& key) {
  store.wait({key}, std::chrono::hours(1));
  return store.get(key);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 11) {
    std::fprintf(stderr,
                 "usage: collective_step_gloo TRANSPORT DEVICE RANK RANKS "
                 "STORE SIZES ITERS WARMUP SCHEDULE OUT\n");
    return 2;
  }
  const std::string transport = argv[1];
  const std::string device = argv[2];
  rank = std::atoi(argv[3]);
  nranks = std::atoi(argv[4]);
  const std::string store_dir = argv[5];
  const std::string sizes = argv[6];
  const int iters = std::atoi(argv[7]);
  const int warmup = std::atoi(argv[8]);
  const std::string out_path = argv[10];
  if (transport != "ibverbs" && transport != "tcp") {
    die("TRANSPORT must be ibverbs or tcp");
  }
  ibverbs = transport == "ibverbs";
  if (nranks < 2 || rank < 0 || rank >= nranks || iters <= 0 || warmup < 0) {
    die("bad RANK/RANKS/ITERS/WARMUP");
  }
  const auto gaps = read_schedule(argv[9], iters);
  const char* recovery = std::getenv("XROCE_SELECTIVE_REPEAT");
  std::fprintf(stderr, "collective_step: rank %d: XROCE_SELECTIVE_REPEAT=%s\n",
               rank, recovery != nullptr ? recovery : "unset");

  FILE* out = nullptr;
  FILE* progress = nullptr;
  if (rank == 0) {
    out = std::fopen(out_path.c_str(), "w");
    progress = std::fopen((out_path + ".progress").c_str(), "w");
    if (out == nullptr || progress == nullptr) {
      die("cannot write OUT");
    }
    std::fprintf(out, "op,bytes,iter,rank,gap_s,coll_s\n");
    std::fflush(out);
  }

  long checked = 0;
  try {
    std::shared_ptr<gloo::transport::Device> dev;
    if (ibverbs) {
      gloo::transport::ibverbs::attr attr;
      attr.name = device;
      attr.port = 1;
      attr.index = 1;
      dev = gloo::transport::ibverbs::CreateDevice(attr);
    } else {
      gloo::transport::tcp::attr attr;
      attr.hostname = device;
      dev = gloo::transport::tcp::CreateDevice(attr);
    }
    gloo::rendezvous::FileStore files(store_dir);
    gloo::rendezvous::PrefixStore mesh("mesh", files);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, nranks);
    // A stalled job is the experiment's to kill (--stall-timeout).
    ctx->setTimeout(std::chrono::hours(1));
    ctx->connectFullMesh(mesh, dev);

    std::stringstream list(sizes);
    std::string size;
    for (int c = 0; std::getline(list, size, ','); c++) {
      const long bytes = std::atol(size.c_str());
      const size_t count = static_cast<size_t>(bytes) / sizeof(float);
      if (count == 0 || count > 0x7fffffffUL) {
        die("a size is too small or too large: " + size);
      }
      std::vector<float> data(count);
      std::vector<double> mine(2 * static_cast<size_t>(iters));
      {
        Barrier barrier(ctx);  // every size starts together
        barrier.run();
      }
      {
        std::vector<float*> ptrs = {data.data()};
        Ring ring(ctx, ptrs, static_cast<int>(count));
        double last_exit = now_s();
        for (int k = -warmup; k < iters; k++) {
          const int iter = k + warmup;  // fresh values every call
          for (size_t i = 0; i < count; i++) {
            data[i] = value(rank, i, iter);
          }
          if (k >= 0) {
            std::this_thread::sleep_for(std::chrono::microseconds(gaps[k]));
          }
          const double enter = now_s();
          ring.run();
          const double exit_ = now_s();
          for (size_t i = 0; i < count; i++) {
            if (data[i] != sum(i, iter)) {
              std::fprintf(stderr,
                           "collective_step: CHECK FAILED: allreduce of %ld "
                           "bytes, iteration %d, rank %d, element %zu: got "
                           "%.1f, want %.1f\n",
                           bytes, iter, rank, i, data[i], sum(i, iter));
              std::exit(2);
            }
          }
          checked++;
          if (k >= 0) {
            mine[2 * k] = enter - last_exit;
            mine[2 * k + 1] = exit_ - enter;
            if (rank == 0) {
              std::fprintf(progress, "allreduce %ld %d\n", bytes, k);
              std::fflush(progress);
            }
          }
          last_exit = now_s();
        }
      }
      // Out of the timed loop: each rank hands rank 0 its times.
      const std::string key = "times" + std::to_string(c) + "_";
      files.set(key + std::to_string(rank),
                bytes_of(mine.data(), mine.size() * sizeof(double)));
      if (rank == 0) {
        std::vector<std::vector<double>> all(nranks);
        for (int r = 0; r < nranks; r++) {
          auto got = await(files, key + std::to_string(r));
          if (got.size() != mine.size() * sizeof(double)) {
            die("rank " + std::to_string(r) + " handed in bad times");
          }
          all[r].resize(mine.size());
          std::memcpy(all[r].data(), got.data(), got.size());
        }
        const long used = static_cast<long>(count * sizeof(float));
        for (int k = 0; k < iters; k++) {
          for (int r = 0; r < nranks; r++) {
            std::fprintf(out, "allreduce,%ld,%d,%d,%.9f,%.9f\n", used, k, r,
                         all[r][2 * k], all[r][2 * k + 1]);
          }
        }
        std::fflush(out);
      }
    }

    // Every send of this rank has completed (the collectives drained):
    // say so, with the count of checked results, and tear down only once
    // every rank has.
    files.set("done" + std::to_string(rank), bytes_of(&checked, sizeof checked));
    long total = 0;
    for (int r = 0; r < nranks; r++) {
      auto got = await(files, "done" + std::to_string(r));
      long n = 0;
      if (got.size() != sizeof n) {
        die("rank " + std::to_string(r) + " handed in a bad count");
      }
      std::memcpy(&n, got.data(), sizeof n);
      total += n;
    }
    if (ibverbs) {
      DeviceLoop::stop(dev.get());
      // Never destroyed: its destructor would join the stopped loop again.
      new std::shared_ptr<gloo::transport::Device>(dev);
    }
    ctx.reset();
    if (rank == 0) {
      std::fclose(out);
      std::fclose(progress);
      std::printf("collective_step: ok: %d ranks, %ld results checked\n",
                  nranks, total);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    die(e.what());
  }
  return 0;
}
