// Gloo collectives over the ibverbs transport, as Debian's libgloo-dev
// ships it: ring allreduce, halving-doubling allreduce and one-to-all
// broadcast, with a new rendezvous context and new buffers in every
// iteration, several sizes up to more than 1 MiB, every result checked
// exactly.
//
// usage: gloo_collectives [--no-drain] DEVICE RANK SIZE STORE_DIR [ITERATIONS]
// Ranks meet through a gloo::rendezvous::FileStore in STORE_DIR (one
// prefix per iteration). The ibverbs device is DEVICE (xroce_IF under
// `xroce run --iface IF`), port 1, GID index 1 (RoCEv2 over IPv4).
// Prints one line per checked collective and a final "all N checks
// passed" line; exits 1 with a message on the first mismatch or error.
//
// Draining: Gloo (2022) does not wait for the completion of the last
// notification a ring or halving-doubling allreduce sends (its peer sends
// one back at the same time), yet its Buffer destructor aborts if that
// send has not completed ("Destructing buffer expecting completions";
// Gloo since 2025 only warns). Whether the ACK beats the peer's crossing
// notification plus two thread wake-ups is a race on any transport. So
// before destroying a collective this program waits, at most 60 s, until
// every send it posted has completed (Gloo's own per-buffer count of
// pending sends, read through a subclass), and fails if one never does:
// a lost send completion is caught, a late one is measured (the longest
// wait is printed). --no-drain destroys at once, as Gloo's own code would.
//
// Quiescing: Gloo's device thread handles a completion event by waking
// the waiting user thread first and re-posting the receive after; the
// pair's destructor does not wait for it. A woken user thread that tears
// the context down before the device thread gets the core again has the
// device thread post to a destroyed (or already reused) QP. So before
// destroying a context this program stops the device thread (Gloo's own
// done_ flag and join) and starts it again afterwards (with --no-drain
// too).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/broadcast_one_to_all.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/ibverbs/buffer.h"
#include "gloo/transport/ibverbs/device.h"

namespace {

using Clock = std::chrono::steady_clock;
using gloo::transport::Buffer;

[[noreturn]] void die(const std::string& what);

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

// Stops and restarts Gloo's completion thread of an ibverbs device
// (protected members, reached as a subclass may).
struct DeviceLoop : gloo::transport::ibverbs::Device {
  static gloo::transport::ibverbs::Device* of(gloo::transport::Device* d) {
    auto* ib = dynamic_cast<gloo::transport::ibverbs::Device*>(d);
    if (ib == nullptr) {
      die("not an ibverbs device");
    }
    return ib;
  }
  // Every event it read has been handled (and counted for the acks the
  // pairs' destructors make) once this returns.
  static void stop(gloo::transport::Device* d) {
    auto* ib = of(d);
    (ib->*(&DeviceLoop::done_)).store(true);
    (ib->*(&DeviceLoop::loop_))->join();
  }
  static void start(gloo::transport::Device* d) {
    auto* ib = of(d);
    (ib->*(&DeviceLoop::done_)).store(false);
    (ib->*(&DeviceLoop::loop_)).reset(new std::thread(&DeviceLoop::loop, ib));
  }
};

bool drain_sends = true;
// The longest a collective waited for its sends to complete, in us.
long longest_drain_us = 0;

// Waits until no buffer in `bufs` has a send whose completion Gloo has
// not handled (60 s at most: then a completion was lost).
void drain(const char* what, const std::vector<Buffer*>& bufs) {
  if (!drain_sends) {
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
    const auto waited = Clock::now() - start;
    if (pending == 0) {
      long us = std::chrono::duration_cast<std::chrono::microseconds>(waited)
                    .count();
      longest_drain_us = std::max(longest_drain_us, us);
      return;
    }
    if (waited > std::chrono::seconds(60)) {
      die(std::string(what) + ": " + std::to_string(pending) +
          " send completion(s) still missing after 60 s");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

template <typename T>
void add(std::vector<Buffer*>& out, const std::vector<std::unique_ptr<T>>& v) {
  for (auto& b : v) {
    out.push_back(b.get());
  }
}

// The collectives, destroyed only once their sends completed.
struct Ring : gloo::AllreduceRing<float> {
  using gloo::AllreduceRing<float>::AllreduceRing;
  ~Ring() override {
    drain("ring allreduce",
          {sendDataBuf_.get(), sendNotificationBuf_.get()});
  }
};

struct HalvingDoubling : gloo::AllreduceHalvingDoubling<float> {
  using gloo::AllreduceHalvingDoubling<float>::AllreduceHalvingDoubling;
  ~HalvingDoubling() override {
    std::vector<Buffer*> bufs = {smallerBlockSendDataBuf_.get()};
    add(bufs, sendDataBufs_);
    add(bufs, largerBlockSendDataBufs_);
    add(bufs, sendNotificationBufs_);
    drain("halving-doubling allreduce", bufs);
  }
};

struct Broadcast : gloo::BroadcastOneToAll<float> {
  using gloo::BroadcastOneToAll<float>::BroadcastOneToAll;
  ~Broadcast() override {
    std::vector<Buffer*> bufs;
    for (auto& s : sender_) {
      if (s) {
        bufs.push_back(s->sendBuffer.get());
      }
    }
    if (receiver_) {
      bufs.push_back(receiver_->clearToSendBuffer.get());
    }
    drain("broadcast", bufs);
  }
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "gloo_collectives: FAILED: %s\n", what.c_str());
  std::exit(1);
}

// Rank r's element i: small integers, so float sums are exact.
float value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * 1000 + static_cast<int>(i % 997));
}

// The sum of value(r, i) over all ranks.
float sum(int size, size_t i) {
  float s = 0;
  for (int r = 0; r < size; r++) {
    s += value(r, i);
  }
  return s;
}

void check(const std::vector<float>& got, const char* what, int iter,
           size_t count, float (*want)(int, size_t), int arg) {
  for (size_t i = 0; i < count; i++) {
    float w = want(arg, i);
    if (got[i] != w) {
      die(std::string(what) + " iteration " + std::to_string(iter) +
          " count " + std::to_string(count) + ": element " +
          std::to_string(i) + " is " + std::to_string(got[i]) +
          ", expected " + std::to_string(w));
    }
  }
}

std::vector<float> filled(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; i++) {
    v[i] = value(rank, i);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--no-drain") == 0) {
    drain_sends = false;
    argv++;
    argc--;
  }
  if (argc < 5 || argc > 6) {
    std::fprintf(
        stderr,
        "usage: gloo_collectives [--no-drain] DEVICE RANK SIZE STORE_DIR "
        "[ITERATIONS]\n");
    return 2;
  }
  const std::string device = argv[1];
  const int rank = std::atoi(argv[2]);
  const int size = std::atoi(argv[3]);
  const std::string dir = argv[4];
  const int iterations = argc == 6 ? std::atoi(argv[5]) : 20;
  if (size < 1 || rank < 0 || rank >= size || iterations < 1) {
    die("bad RANK/SIZE/ITERATIONS");
  }
  // Element counts: one element, odd sizes that split unevenly over the
  // ranks, and more than 1 MiB of floats.
  const std::vector<size_t> counts = {1, 1000, 4099, 65536, 262147};
  int checks = 0;
  try {
    gloo::transport::ibverbs::attr attr;
    attr.name = device;
    attr.port = 1;
    attr.index = 1;
    auto dev = gloo::transport::ibverbs::CreateDevice(attr);
    gloo::rendezvous::FileStore files(dir);
    for (int iter = 0; iter < iterations; iter++) {
      const size_t count = counts[iter % counts.size()];
      gloo::rendezvous::PrefixStore store("iter" + std::to_string(iter),
                                          files);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
      ctx->setTimeout(std::chrono::seconds(60));
      ctx->connectFullMesh(store, dev);
      {
        auto data = filled(rank, count);
        std::vector<float*> ptrs = {data.data()};
        Ring ring(ctx, ptrs, static_cast<int>(count));
        ring.run();
        check(data, "ring allreduce", iter, count,
              [](int s, size_t i) { return sum(s, i); }, size);
        checks++;
      }
      {
        // Two pointers: the local reduction is part of the result.
        auto a = filled(rank, count);
        auto b = filled(rank, count);
        std::vector<float*> ptrs = {a.data(), b.data()};
        HalvingDoubling hd(ctx, ptrs, static_cast<int>(count));
        hd.run();
        check(a, "halving-doubling allreduce", iter, count,
              [](int s, size_t i) { return 2 * sum(s, i); }, size);
        check(b, "halving-doubling allreduce (2nd pointer)", iter, count,
              [](int s, size_t i) { return 2 * sum(s, i); }, size);
        checks++;
      }
      {
        const int root = iter % size;
        auto data = rank == root ? filled(root, count)
                                 : std::vector<float>(count, -1.0f);
        std::vector<float*> ptrs = {data.data()};
        Broadcast bcast(ctx, ptrs, count, root);
        bcast.run();
        check(data, "broadcast", iter, count, value, root);
        checks++;
      }
      DeviceLoop::stop(dev.get());
      ctx.reset();
      DeviceLoop::start(dev.get());
      std::printf("rank %d iteration %d count %zu: ring, halving-doubling, "
                  "broadcast ok\n", rank, iter, count);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    die(e.what());
  }
  std::printf("gloo_collectives rank %d of %d: all %d checks passed "
              "(longest wait for send completions %ld us)\n",
              rank, size, checks, longest_drain_us);
  return 0;
}
