#pragma once
// Data parallelism: gradient buckets reduced across the data axis while backward still runs, on
// either memory space.
//
// The buckets are those of the flat buffers (FlatParameters: whole parameters, taken in reverse
// registration order — the order in which backward finishes them — each at least the layout's
// bucket size). Containers report each child's parameters after its backward_weight
// (Context::grad_ready → on_grad_ready); when every parameter of a bucket has been reported for
// every micro-batch of the step, the bucket's reduction starts at once, overlapping the rest of
// backward: a non-blocking MPI call on the host, a collective enqueued on the communicator's
// stream after an event of the compute stream on a GPU (CommLink, parallel/comm_link.hpp: no host
// synchronisation). finish() starts whatever was not reported (so nothing can hang) and makes the
// results visible to what runs next (waits for the MPI requests; the compute stream waits for the
// communication stream).
//
// Two reductions (GradReduction):
//   all_reduce      every data rank ends with the summed gradient (plain DDP)
//   reduce_scatter  ZeRO-1: each data rank ends with the summed gradient of its own part of
//                   every bucket (its shard: the buffers' layout makes every bucket split into
//                   `data ranks` equal, aligned parts), in shard_grads(); after the optimizer
//                   updated the shard's values, all_gather_values() gives every rank the full
//                   updated values.
//   sharded_gradients
//                   ZeRO-2: as reduce_scatter, but no flat gradient buffer (FlatLayout::grads
//                   false). A parameter's first grad() of a round (core/parameter.hpp's
//                   GradProvider) binds its whole bucket to a zeroed slot of a small pool (the
//                   smallest free slot that holds the bucket; a new one while there are fewer than
//                   4, or while every slot collects or none fits); once every
//                   parameter of the bucket has been reported, this rank's part of the slot takes
//                   the shard's earlier rounds (the add is exact bookkeeping: the reduce-scatter
//                   then sums them in) and the slot is reduce-scattered into the shard, and freed
//                   when that reduction is done. With micro-batches a bucket has one round per
//                   micro-batch (DeepSpeed's ZeRO-2 reduces as often); a held bucket (a tied
//                   weight) keeps its slot until finish(). Gradients exist whole only inside their
//                   round: outside a step grad() is refused.
//   sharded_parameters
//                   ZeRO-3: as sharded_gradients, and the values sharded too — each data rank keeps
//                   its part of every bucket's values (value_shard(), what the optimizer updates);
//                   the flat values buffer is dropped. A parameter's value() without storage
//                   (core/parameter.hpp's ValueProvider) all-gathers its whole bucket into a slot
//                   of a pool of kZero3Slots gathered buckets, binding every parameter of the
//                   bucket; when the pool is full the bucket read least recently gives its slot
//                   back (its parameters unbound, its own part written back into the shard, so
//                   that a write through value() — a checkpoint's load — is kept). Least recently
//                   read, not gathered: an operation reads all its parameters (a weight, then a
//                   bias in another bucket) before it runs, so the two buckets read last stay. Forward gathers
//                   the buckets in turn, backward again; release_values() gives every slot back
//                   before the optimizer updates the shards. Prefetch: the buckets are gathered in
//                   the same order every step (the order of the model's reads and of the pool's
//                   evictions does not change), so the order of the last step's gathers is kept,
//                   and while a bucket is read the next one of that order is all-gathered into one
//                   more slot (on a GPU on the communication stream, behind the compute enqueued so
//                   far, so it overlaps the layer now enqueued); its first read binds it, waiting
//                   for that gather alone (CommLink's Fence). Off that order, nothing is guessed.
// Over comm::Hierarchical (DataParallel<…, Hierarchical>) each reduction runs in two levels, inside
// the node and across nodes; the shards then follow that communicator's rank order (node rank
// major), and a reduce-scatter uses the bucket's gradients as its scratch (ZeRO-1 reads only
// shard_grads() afterwards).
// Gradients are *summed*: losses already divide by the global batch (Context::global_batch), so
// the sum is the gradient of the global mean, equal to the sequential run's (on both spaces: no
// averaging collective).
//
// Compression (the fourth parameter, a policy of parallel/compression/policy.hpp: WirePrecision<W>,
// PowerSgd, TopK; DataParallel<…, Policy>): a ready bucket goes to BucketCompressor<Policy, …>,
// which reduces it there and then through the buckets' CommLink (on the host to completion; on a
// GPU in stream order, the compute stream waiting for the communication stream). wire_bytes()
// counts what this rank sent for the step's gradients (and ZeRO-3's gathers of the weights),
// dense_bytes() what the same collectives send uncompressed.

#include "dpml/comm/communicator.hpp"
#include "dpml/core/error.hpp"
#include "dpml/core/nvtx.hpp"
#include "dpml/core/flat_parameters.hpp"
#include "dpml/core/parameter.hpp"
#include "dpml/core/tensor.hpp"
#include "dpml/kernels/device.hpp"
#include "dpml/kernels/ops.hpp"
#include "dpml/parallel/comm_link.hpp"
#include "dpml/parallel/compression.hpp"
#include "dpml/parallel/tensor.hpp"  // default_comm_t

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace dpml::parallel {

enum class GradReduction { all_reduce, reduce_scatter, sharded_gradients, sharded_parameters };

// Whether a reduction keeps gradients in ZeRO-2's slot pool (ZeRO-2, and ZeRO-3 on top of it).
constexpr bool gradients_in_slots(GradReduction m) {
  return m == GradReduction::sharded_gradients || m == GradReduction::sharded_parameters;
}

// ZeRO-2's pool: slots made before a new round waits for the reductions in flight (the memory
// estimate, models/gpt_memory.hpp, counts as many).
inline constexpr std::size_t kZero2Slots = 4;
// ZeRO-3's: buckets whose whole values are held gathered at once (the least recently gathered
// gives its slot back when another is needed).
inline constexpr std::size_t kZero3Slots = 3;
// ZeRO-3's slots for buckets gathered ahead of their first read (prefetch), beside kZero3Slots.
inline constexpr std::size_t kZero3PrefetchSlots = 1;

template <class T, class Space = HostSpace, class Comm = default_comm_t<Space>, class Compression = NoCompression>
class GradientBuckets : GradProvider, ValueProvider {
  using Link = CommLink<Comm, Space>;
  using Ops = kernels::Ops<Space>;
  static_assert(is_compression<Compression>, "dpml: GradientBuckets' fourth parameter is a compression policy (parallel/compression/policy.hpp)");
  static constexpr bool compressed = !std::same_as<Compression, NoCompression>;
  struct NoCompressor {};
  using Compressor = std::conditional_t<compressed, BucketCompressor<Compression, T, Space, Comm>, NoCompressor>;

 public:
  // A contiguous range of the flat buffer this rank updates: its shard of a bucket under ZeRO-1,
  // the whole bucket otherwise.
  struct Segment {
    std::int64_t flat_offset = 0;   // into FlatParameters::values()/grads()
    std::int64_t count = 0;
    std::int64_t shard_offset = 0;  // into shard_grads()
  };

  // Host buckets over an MPI communicator of the data axis (nullptr or one rank: nothing to reduce).
  GradientBuckets(FlatParameters<T, Space>& flat, const Comm* data_comm, GradReduction mode = GradReduction::all_reduce,
                  CompressionOptions compression = {})
    requires std::same_as<Space, HostSpace>
      : GradientBuckets(flat, data_comm, mode, kernels::host_device(), compression) {}
  // Any space: collectives on `data_comm`, ordered after the work of `dev` (its stream on a GPU).
  GradientBuckets(FlatParameters<T, Space>& flat, const Comm* data_comm, GradReduction mode, kernels::Device<Space>& dev,
                  CompressionOptions compression = {})
      : flat_(flat), comm_(data_comm && data_comm->size() > 1 ? data_comm : nullptr), mode_(mode),
        compression_start_(compression.start_step), dev_(&dev) {
    if (comm_) link_.emplace(dev, *comm_);
    if constexpr (compressed)
      if (comm_) compressor_.emplace(flat, dev, *link_, mode == GradReduction::reduce_scatter, compression);
    // A communicator that moves registered buffers itself (comm::CopyEngine: two GPUs of one host
    // all-reducing on their copy engines) is handed the gradients it reduces: one set of buckets
    // per such communicator. (The registration changes the communicator's shared state, not what
    // the caller sees of it: hence the cast.)
    if constexpr (!compressed && requires(Comm& c, void* p, std::size_t n) { c.register_buffer(p, n); })
      if (comm_ && mode == GradReduction::all_reduce)
        const_cast<Comm&>(*comm_).register_buffer(flat.grads().data(), static_cast<std::size_t>(flat.numel()) * sizeof(T));
    DPML_REQUIRE(mode == GradReduction::all_reduce || flat.layout().shards == data_size(),
                 "gradient buckets: ZeRO over " << data_size() << " data ranks needs flat buffers laid out in "
                                                << data_size() << " shards, not " << flat.layout().shards);
    DPML_REQUIRE(gradients_in_slots(mode) ? !flat.layout().grads : flat.layout().grads,
                 "gradient buckets: ZeRO-2 and 3 (sharded gradients) need flat buffers without a gradient buffer, the other "
                 "reductions one with it");
    if (gradients_in_slots(mode)) {
      if constexpr (compressed)
        DPML_REQUIRE_EVERYWHERE(false, "gradient compression reduces whole buckets: not with ZeRO-2's sharded gradients");
      else
        for (auto* p : flat.params()) p->set_grad_provider(this);
    }
    state_.resize(flat.buckets().size());
    reports_.assign(flat.params().size(), 0);
    build_segments();
    if (mode == GradReduction::sharded_parameters) shard_values();
  }
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;
  ~GradientBuckets() {
    if (mode_ == GradReduction::sharded_parameters) unshard_values();
    if (!gradients_in_slots(mode_)) return;
    for (auto* p : flat_.params()) {  // nothing may ask this object for storage any more
      p->set_grad_provider(nullptr);
      p->set_grad_storage(nullptr);
    }
  }

  std::size_t bucket_count() const noexcept { return state_.size(); }
  // Buckets whose reduction has started this step (before finish(): the overlapped ones).
  std::size_t buckets_started() const noexcept {
    return static_cast<std::size_t>(std::count_if(state_.begin(), state_.end(), [](const State& b) { return b.started; }));
  }
  GradReduction mode() const noexcept { return mode_; }
  int data_size() const noexcept { return comm_ ? comm_->size() : 1; }

  // Keep the bucket holding `p` from starting before finish(), e.g. a tied weight whose gradient
  // another pipeline stage adds to after backward (the caller sums it in between).
  void hold(const ParamBase* p) { state_[flat_.bucket_of(flat_.index_of(p))].held = true; }

  // Each parameter will be reported `reports_per_param` times this step (its micro-batch count).
  // `step` (from 1, the trainer's count): a compression starts at CompressionOptions::start_step;
  // before it the buckets are all-reduced exactly.
  void begin_step(int reports_per_param, std::int64_t step = std::numeric_limits<std::int64_t>::max()) {
    if (gradients_in_slots(mode_)) {
      Ops::zero(*dev_, shard_grads_.data(), shard_numel_);  // the rounds add into it
      in_step_ = true;
    }
    reports_per_param_ = reports_per_param;
    compress_ = step >= compression_start_;
    std::fill(reports_.begin(), reports_.end(), 0);
    for (std::size_t b = 0; b < state_.size(); ++b) {
      state_[b].missing = flat_.buckets()[b].last_param - flat_.buckets()[b].first_param;
      state_[b].started = false;
    }
    exposed_seconds_ = 0;
    wire_bytes_ = dense_bytes_ = 0;
  }

  // The Context::grad_ready hook: these parameters have one more micro-batch of gradient.
  void on_grad_ready(std::span<ParamBase* const> params) {
    if (gradients_in_slots(mode_)) {
      for (auto* p : params) {
        const std::size_t i = flat_.index_of(p), b = flat_.bucket_of(i);
        State& st = state_[b];
        if (st.slot < 0 || reports_[i] > 0) continue;  // written in a round already reduced, or counted
        reports_[i] = 1;
        if (--st.unreported == 0 && !st.held) close(b);
      }
      progress();
      return;
    }
    for (auto* p : params) {
      const std::size_t i = flat_.index_of(p);
      if (++reports_[i] == reports_per_param_) {
        const std::size_t b = flat_.bucket_of(i);
        if (--state_[b].missing == 0 && !state_[b].held) start(b);
      }
    }
    progress();
  }

  // Let MPI advance in-flight reductions (MPICH progresses only inside MPI calls).
  void progress() {
    for (auto& b : state_)
      if (b.pending) (void)b.pending->test();
  }

  // Start what was not reported, and make every bucket's result visible to what runs next. The
  // host time spent here is the exposed (non-overlapped) communication of the step; on a GPU the
  // host does not wait (comm::Staged aside), so it measures only the launch.
  void finish() {
    const auto t0 = std::chrono::steady_clock::now();
    if (gradients_in_slots(mode_)) {
      for (std::size_t b = 0; b < state_.size(); ++b)  // the held ones, and rounds not all reported
        if (state_[b].slot >= 0) close(b);
      in_step_ = false;
    } else {
      for (std::size_t b = 0; b < state_.size(); ++b)
        if (!state_[b].started) start(b);
    }
    wait_all();
    exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // This rank's segments and their summed gradients (valid after finish()).
  const std::vector<Segment>& own_segments() const noexcept { return segments_; }
  TensorView<T, Space> shard_grads() const noexcept { return sharded_ ? shard_grads_.view() : flat_.grads(); }
  std::int64_t shard_numel() const noexcept { return shard_numel_; }
  // ZeRO-2: the slot pool's elements (what stands in for the whole gradient buffer).
  std::int64_t slot_elements() const noexcept {
    std::int64_t n = 0;
    for (const auto& s : slots_) n += s.numel();
    return n;
  }

  // ZeRO-1, after the optimizer updated this rank's segments of the values: every rank gets all
  // (in place: each bucket's parts of all ranks, gathered into the bucket).
  void all_gather_values() {
    if (mode_ == GradReduction::all_reduce || mode_ == GradReduction::sharded_parameters || !comm_) return;
    const auto t0 = std::chrono::steady_clock::now();
    T* values = flat_.values().data();
    for (std::size_t b = 0; b < state_.size(); ++b)
      state_[b].pending = link_->allgather(values + segments_[b].flat_offset, values + flat_.buckets()[b].offset,
                                           static_cast<std::size_t>(segments_[b].count));
    wait_all();
    exposed_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // ZeRO-3: this rank's part of every bucket's values, laid out as shard_grads().
  TensorView<T, Space> value_shard() const noexcept { return value_shard_.view(); }
  // ZeRO-3: every gathered bucket gives its slot back (its own part written back into the shard);
  // the next read of a value gathers again. Before anything writes the shards (the optimizer's
  // update, a checkpoint's state) or reads them as the values.
  void release_values() {
    for (std::size_t b = 0; b < state_.size(); ++b)
      if (state_[b].vslot >= 0) give_back_values(b);
    drop_prefetch();  // it reads the shards
    if (!gathered_now_.empty()) gather_order_ = std::move(gathered_now_);
    gathered_now_.clear();
  }
  // ZeRO-3: first reads of a bucket served by a gather started ahead of them (since construction).
  std::int64_t prefetched_reads() const noexcept { return prefetched_reads_; }
  // ZeRO-3: gather the next bucket ahead of its read (the default), or each only when read.
  void set_prefetch(bool on) {
    drop_prefetch();
    prefetch_on_ = on;
  }

  double exposed_seconds() const noexcept { return exposed_seconds_; }
  // Bytes this rank sent over the data axis since begin_step (ring algorithms:
  // compression/policy.hpp): the gradients' reductions and ZeRO-3's gathers of the weights (the
  // prefetched ones too), and what the same collectives send uncompressed; both 0 on one data rank.
  std::int64_t wire_bytes() const noexcept { return wire_bytes_; }
  std::int64_t dense_bytes() const noexcept { return dense_bytes_; }
  // The compressor (compressed buckets over several data ranks; tests read its residuals).
  const Compressor* compressor() const noexcept { return compressor_ ? &*compressor_ : nullptr; }

 private:
  struct State {
    std::size_t missing = 0;
    bool started = false;
    bool held = false;
    std::optional<typename Link::Pending> pending;
    int slot = -1;                // ZeRO-2: the slot of the open round (-1: none)
    std::size_t unreported = 0;   // ZeRO-2: parameters of the open round not yet reported
    int vslot = -1;               // ZeRO-3: the slot holding the bucket's gathered values (-1: none)
    std::uint64_t read = 0;       // ZeRO-3: when (reads_) a value of the bucket was last read
  };

  void build_segments() {
    sharded_ = gradients_in_slots(mode_) || (mode_ == GradReduction::reduce_scatter && comm_);
    const std::int64_t p = data_size(), r = comm_ ? comm_->rank() : 0;
    std::int64_t shard = 0;
    for (const FlatBucket& b : flat_.buckets()) {
      if (sharded_) {
        const std::int64_t c = b.count / p;
        segments_.push_back({b.offset + r * c, c, shard});
        shard += c;
      } else {
        segments_.push_back({b.offset, b.count, b.offset});
      }
    }
    shard_numel_ = sharded_ ? shard : flat_.numel();
    if (sharded_) shard_grads_ = Tensor<T, Space>(Shape{shard});
  }

  void start(std::size_t b) {
    state_[b].started = true;
    if (!comm_) return;  // one data rank: the gradients are the sums, and the shard is all of it
    const NvtxRange range('R', static_cast<long long>(b));  // the reduction of bucket b
    const FlatBucket& bucket = flat_.buckets()[b];
    T* grads = flat_.grads().data() + bucket.offset;
    const int p = comm_->size();
    dense_bytes_ += mode_ == GradReduction::all_reduce ? wire_bytes::allreduce(bucket.count, sizeof(T), p)
                                                       : wire_bytes::reduce_scatter(bucket.count, sizeof(T), p);
    if constexpr (compressed)
      if (compress_) {
        wire_bytes_ += compressor_->reduce(b, grads, sharded_ ? shard_grads_.data() + segments_[b].shard_offset : nullptr);
        return;
      }
    wire_bytes_ = dense_bytes_;
    if (mode_ == GradReduction::all_reduce)
      state_[b].pending = link_->allreduce(grads, static_cast<std::size_t>(bucket.count));
    else
      state_[b].pending = link_->reduce_scatter(grads, shard_grads_.data() + segments_[b].shard_offset,
                                                static_cast<std::size_t>(segments_[b].count));
  }

  void wait_all() {
    for (auto& b : state_)
      if (b.pending) {
        b.pending->wait();
        b.pending.reset();
      }
    if (link_) link_->join();
    for (const auto& [slot, bucket] : in_flight_) free_slots_.push_back(slot);
    in_flight_.clear();
  }

  // ---- ZeRO-2: the slot pool ----------------------------------------------------------------------
  // A parameter without storage asked for its gradient: its bucket opens a round in a zeroed slot.
  void provide(ParamBase& p) override {
    DPML_REQUIRE(in_step_, "ZeRO-2: parameter '" << p.name() << "' has no gradient outside a training step (the "
                                                 << "reduced gradients are the shards, GradientBuckets::shard_grads)");
    const std::size_t b = flat_.bucket_of(flat_.index_of(&p));
    const FlatBucket& bucket = flat_.buckets()[b];
    const int s = acquire_slot(bucket.count);
    T* base = slots_[static_cast<std::size_t>(s)].data();
    Ops::zero(*dev_, base, bucket.count);
    for (std::size_t i = bucket.first_param; i < bucket.last_param; ++i) {
      flat_.params()[i]->set_grad_storage(base + (flat_.offsets()[i] - bucket.offset));
      flat_.params()[i]->mark_grad_zero();  // the zeros are there: the first writer may overwrite
      reports_[i] = 0;  // ZeRO-2: reported in this round yet
    }
    state_[b].slot = s;
    state_[b].unreported = bucket.last_param - bucket.first_param;
  }
  // A free slot of at least n elements: the smallest that fits; with kZero2Slots or more slots, the
  // reductions in flight finish first (host: their MPI requests; GPU: the compute stream waits
  // for the communication stream); else a new slot of n. Bucket sizes repeat every step, so the
  // pool settles in the first one.
  int acquire_slot(std::int64_t n) {
    int s = take_fitting(free_slots_, slots_, n);
    if (s < 0 && !in_flight_.empty() && slots_.size() >= kZero2Slots) {
      wait_all();
      s = take_fitting(free_slots_, slots_, n);
    }
    return s >= 0 ? s : new_slot(slots_, n);
  }
  // The smallest free slot that holds n elements, else a new one of n (ZeRO-3's gathers).
  static int fitting_or_new(std::vector<int>& free, std::vector<Tensor<T, Space>>& slots, std::int64_t n) {
    const int s = take_fitting(free, slots, n);
    return s >= 0 ? s : new_slot(slots, n);
  }
  // Of the free slots (indices into `slots`), the smallest that holds n elements, taken out of
  // `free`; -1 if none does. (Both pools, ZeRO-2's and ZeRO-3's.)
  static int take_fitting(std::vector<int>& free, const std::vector<Tensor<T, Space>>& slots, std::int64_t n) {
    const auto size = [&](int k) { return slots[static_cast<std::size_t>(k)].numel(); };
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it)
      if (size(*it) >= n && (best == free.end() || size(*it) < size(*best))) best = it;
    if (best == free.end()) return -1;
    const int s = *best;
    free.erase(best);
    return s;
  }
  static int new_slot(std::vector<Tensor<T, Space>>& slots, std::int64_t n) {
    slots.emplace_back(Shape{n});
    return static_cast<int>(slots.size()) - 1;
  }
  // Bucket b's round is complete: its parameters lose the slot, this rank's part of the slot takes
  // the shard's earlier rounds, and the slot is reduce-scattered into the shard.
  void close(std::size_t b) {
    State& st = state_[b];
    const FlatBucket& bucket = flat_.buckets()[b];
    const Segment& seg = segments_[b];
    T* slot = slots_[static_cast<std::size_t>(st.slot)].data();
    T* shard = shard_grads_.data() + seg.shard_offset;
    for (std::size_t i = bucket.first_param; i < bucket.last_param; ++i) flat_.params()[i]->set_grad_storage(nullptr);
    if (st.pending) wait_all();  // the bucket's previous round still writes the shard this one reads
    T* own = slot + (seg.flat_offset - bucket.offset);
    if (comm_) {
      const NvtxRange range('R', static_cast<long long>(b));
      Ops::add(*dev_, own, shard, own, seg.count);
      dense_bytes_ += wire_bytes::reduce_scatter(bucket.count, sizeof(T), comm_->size());
      wire_bytes_ = dense_bytes_;
      st.pending = link_->reduce_scatter(slot, shard, static_cast<std::size_t>(seg.count));
      in_flight_.emplace_back(st.slot, b);
    } else {
      Ops::add(*dev_, shard, own, shard, seg.count);  // one data rank: the shard is the whole bucket
      free_slots_.push_back(st.slot);
    }
    st.started = true;
    st.slot = -1;
  }

  // ---- ZeRO-3: the values' shards and the pool of gathered buckets -------------------------------
  // This rank's part of every bucket's values out of the flat buffer, which then goes away.
  void shard_values() {
    value_shard_ = Tensor<T, Space>(Shape{shard_numel_});
    for (std::size_t b = 0; b < state_.size(); ++b)
      Ops::copy(*dev_, flat_.values().data() + segments_[b].flat_offset, value_shard_.data() + segments_[b].shard_offset,
                segments_[b].count);
    flat_.drop_values();
    for (auto* p : flat_.params()) p->set_value_provider(this);
  }
  // The end: the whole values gathered back into a flat values buffer, for the parameters to keep.
  void unshard_values() {
    release_values();
    const TensorView<T, Space> full = flat_.restore_values();
    for (std::size_t b = 0; b < state_.size(); ++b) gather_into(b, full.data() + flat_.buckets()[b].offset);
    if (link_) link_->join();
    for (auto* p : flat_.params()) p->set_value_provider(nullptr);
  }
  // bucket b's whole values (count) ← every rank's part of it, in rank order.
  void gather_into(std::size_t b, T* out) {
    const Segment& seg = segments_[b];
    if (!comm_) {
      Ops::copy(*dev_, value_shard_.data() + seg.shard_offset, out, seg.count);
      return;
    }
    count_gather(seg);
    link_->allgather(value_shard_.data() + seg.shard_offset, out, static_cast<std::size_t>(seg.count)).wait();
  }
  void count_gather(const Segment& seg) {
    dense_bytes_ += wire_bytes::allgather(seg.count, sizeof(T), comm_->size());
    wire_bytes_ = dense_bytes_;  // (no compression with ZeRO-3)
  }
  void provide_value(ParamBase& p) override {
    const std::size_t b = flat_.bucket_of(flat_.index_of(&p));
    const FlatBucket& bucket = flat_.buckets()[b];
    // The least recently read gives its slot back (the prefetched bucket is not yet read).
    while (vslots_.size() - vfree_.size() - (prefetch_ ? 1 : 0) >= kZero3Slots) {
      std::size_t oldest = state_.size();
      for (std::size_t k = 0; k < state_.size(); ++k)
        if (state_[k].vslot >= 0 && (oldest == state_.size() || state_[k].read < state_[oldest].read)) oldest = k;
      give_back_values(oldest);
    }
    int s = -1;
    if (prefetch_ && prefetch_->bucket == b) {  // gathered ahead: wait for that gather alone
      s = prefetch_->slot;
      prefetch_->pending.wait();
      link_->join(*fence_);
      prefetch_.reset();
      ++prefetched_reads_;
    } else {
      s = fitting_or_new(vfree_, vslots_, bucket.count);
      const NvtxRange range('G', static_cast<long long>(b));  // the gather of bucket b's values
      gather_into(b, vslots_[static_cast<std::size_t>(s)].data());
      if (link_) link_->join();
    }
    T* slot = vslots_[static_cast<std::size_t>(s)].data();
    for (std::size_t i = bucket.first_param; i < bucket.last_param; ++i)
      flat_.params()[i]->set_value_storage(slot + (flat_.offsets()[i] - bucket.offset));
    state_[b].vslot = s;
    state_[b].read = ++reads_;
    if (gathered_now_.size() < kZero3OrderLimit * state_.size()) gathered_now_.push_back(b);
    prefetch_after(b);
  }
  void value_read(const ParamBase& p) override { state_[flat_.bucket_of(flat_.index_of(&p))].read = ++reads_; }
  // Bucket b was just gathered, the k-th of this step: if the last step's k-th gather was b too,
  // start the gather of the bucket that followed it there into a free slot.
  void prefetch_after(std::size_t b) {
    const std::size_t k = gathered_now_.size();
    if (!prefetch_on_ || !comm_ || k == 0 || k >= gather_order_.size() || gather_order_[k - 1] != b) return;
    const std::size_t next = gather_order_[k];
    if (state_[next].vslot >= 0 || (prefetch_ && prefetch_->bucket == next)) return;
    drop_prefetch();  // a guess the reads did not take
    const int s = fitting_or_new(vfree_, vslots_, flat_.buckets()[next].count);
    const NvtxRange range('P', static_cast<long long>(next));  // the gather of bucket `next` ahead of its read
    const Segment& seg = segments_[next];
    count_gather(seg);
    prefetch_.emplace(Prefetch{next, s, link_->allgather(value_shard_.data() + seg.shard_offset,
                                                         vslots_[static_cast<std::size_t>(s)].data(),
                                                         static_cast<std::size_t>(seg.count))});
    if (!fence_) fence_.emplace();
    link_->mark(*fence_);
  }
  // A prefetched bucket nobody read: its gather finished (it reads the shard, writes the slot),
  // the slot free again.
  void drop_prefetch() {
    if (!prefetch_) return;
    prefetch_->pending.wait();
    link_->join(*fence_);
    vfree_.push_back(prefetch_->slot);
    prefetch_.reset();
  }
  // Bucket b's gathered values go: its own part back into the shard, its parameters unbound.
  void give_back_values(std::size_t b) {
    State& st = state_[b];
    const FlatBucket& bucket = flat_.buckets()[b];
    const Segment& seg = segments_[b];
    T* slot = vslots_[static_cast<std::size_t>(st.vslot)].data();
    Ops::copy(*dev_, slot + (seg.flat_offset - bucket.offset), value_shard_.data() + seg.shard_offset, seg.count);
    for (std::size_t i = bucket.first_param; i < bucket.last_param; ++i) flat_.params()[i]->set_value_storage(nullptr);
    vfree_.push_back(st.vslot);
    st.vslot = -1;
  }

  FlatParameters<T, Space>& flat_;
  const Comm* comm_;
  GradReduction mode_;
  std::int64_t compression_start_;  // CompressionOptions::start_step
  bool compress_ = true;            // this step: compressed (at or past the start)
  std::optional<Link> link_;  // with a communicator of more than one rank
  std::vector<State> state_;  // per flat bucket, production order
  std::vector<int> reports_;  // per parameter: reports this step (ZeRO-2: in its bucket's open round, 0 or 1)
  int reports_per_param_ = 1;
  std::vector<Segment> segments_;  // per flat bucket
  bool sharded_ = false;           // ZeRO-1 over several data ranks
  std::int64_t shard_numel_ = 0;
  Tensor<T, Space> shard_grads_;   // (shard_numel) when sharded
  double exposed_seconds_ = 0;
  std::int64_t wire_bytes_ = 0, dense_bytes_ = 0;
  std::optional<Compressor> compressor_;  // compressed, over several data ranks
  kernels::Device<Space>* dev_;
  // ZeRO-2 (sharded_gradients)
  std::vector<Tensor<T, Space>> slots_;       // each (as large as the bucket it was made for)
  std::vector<int> free_slots_;
  std::vector<std::pair<int, std::size_t>> in_flight_;  // (slot, bucket) a reduce-scatter reads
  bool in_step_ = false;
  // ZeRO-3 (sharded_parameters)
  Tensor<T, Space> value_shard_;        // (shard_numel): this rank's part of every bucket's values
  std::vector<Tensor<T, Space>> vslots_;  // gathered buckets' values, each as large as the bucket it was made for
  std::vector<int> vfree_;
  std::uint64_t reads_ = 0;  // values read (provide_value, value_read) since construction
  // The buckets gathered on first read since the last release_values() (this step) and in the
  // window before (the order prefetch follows); recorded up to kZero3OrderLimit per bucket.
  static constexpr std::size_t kZero3OrderLimit = 64;
  std::vector<std::size_t> gathered_now_, gather_order_;
  struct Prefetch {
    std::size_t bucket;
    int slot;
    typename Link::Pending pending;
  };
  std::optional<Prefetch> prefetch_;           // the gather started ahead of its bucket's first read
  std::optional<typename Link::Fence> fence_;  // the position after the prefetch's gather (GPU)
  std::int64_t prefetched_reads_ = 0;
  bool prefetch_on_ = true;
};

}  // namespace dpml::parallel
